#!/usr/bin/env bash
# Serving on the GPU machine, in one command (about 5-6 minutes): lnormd's CUDA
# backend (every visible GPU) measured by lnorm-bench, 1 x 4096 bf16 LayerNorm
# requests, every point verifying 50 replies against float64:
#   - batching on (max-queue-delay-us 0) at c=1,8,64, with the NNG echo
#     baseline for the same messages and concurrency (lnorm-bench --echo);
#   - batching off (max-batch-rows 1) at c=1,8,64;
#   - completion wait policy: cuda-sync block against the default (spin) at
#     c=64, batching on and off;
#   - staging off (cuda-staging-bytes 0: every request copied on its own) at
#     c=64, batching on;
#   - the CPU backend at c=64;
#   - 64 MiB requests (client chunks pipelined) and the pinned PCIe ceiling
#     measured by torch in the same run (skipped if torch is missing);
#   - by client process count (lnorm-bench --procs P, P = 1,4,8,16,32, 8
#     requests in flight each, raw driver, 4 s a point): CUDA batched with
#     the echo server beside it, CUDA max-batch-rows 1, the CPU backend.
#     One load process is bounded by NNG's one I/O thread per process.
# lnormd's /metrics is scraped during the c=64 points (staged/direct segment
# counters, batch histograms) and nvidia-smi samples GPU utilisation.
#
# Binaries: static lnormd and lnorm-bench in one folder ($1, default
# .devserve), built on the development machine with
#   cmake -S . -B build-sm90 -DLNORM_WITH_CUDA=ON -DLNORM_STATIC_DEPS=ON \
#         -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-sm90 -j2 --target lnormd lnorm-bench test_backend_cuda
#   mkdir -p .devserve && cp build-sm90/server/lnormd build-sm90/client/bench/lnorm-bench .devserve/
# and carried (.devserve). Run from the repository root on the device:
#   OUT=/some/dir scripts/device-serve.sh .devserve
# Files in $OUT (7): serve.log, serve-runs.json (every lnorm-bench JSON, by
# name), serve-summary.json (throughput, ratios, latencies, server timings,
# GPU utilisation by phase and every sample), serve-gpu-util.csv,
# serve-metrics.txt (last /metrics scrape of each scraped point),
# serve-pcie.json, serve-procs.json (the process-count sweep, one row per
# target and P; the shape of bench/results/serve-procs-h200.json).
# Dry run of the script itself on a machine without a GPU (numbers mean
# nothing): LNORM_SERVE_BACKEND=cpu LNORM_SERVE_DURATION=1 LNORM_SERVE_PROCS=1,2 \
#   scripts/device-serve.sh DIR
set -u
BIN=${1:-.devserve}
OUT=${OUT:-/tmp/lnorm-serve-out}
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/lnorm-serve-XXXXXX)
log=$OUT/serve.log
exec > >(tee -a "$log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the bundle's commit first: the folder it runs from may be another checkout
COMMIT=$(cat "$BIN/lnorm_commit.txt" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export LNORM_BENCH_COMMIT=$COMMIT
T0=$SECONDS

for b in lnormd lnorm-bench; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (see the comment at the top of this script)"; exit 1; }
done
echo "== device"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
echo "cores: $(nproc)  date: $(date -u +%FT%TZ)  commit: $COMMIT"
"$BIN/lnormd" --version

phases=$TMP/phases.txt
: >"$phases"
phase() { echo "$1 $(date +%s.%N)" >>"$phases"; echo "== [$((SECONDS - T0)) s] $1"; }

nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
  >"$OUT/serve-gpu-util.csv" 2>&1 &
smi=$!

# Scrape lnormd's /metrics on PORT every 0.5 s into FILE while a point runs
# (the last scrape wins); the spawned lnormd gets "--http 127.0.0.1:PORT".
scrape_start() { # port file
  (while :; do
     python3 - "$1" "$2" <<'PY' 2>/dev/null
import sys, urllib.request, os
try:
    t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=1).read()
    open(sys.argv[2] + ".new", "wb").write(t); os.replace(sys.argv[2] + ".new", sys.argv[2])
except Exception:
    pass
PY
     sleep 0.5
   done) &
  scraper=$!
}
scrape_stop() { kill "$scraper" 2>/dev/null; wait "$scraper" 2>/dev/null; }

BE=${LNORM_SERVE_BACKEND:-cuda}
DUR=${LNORM_SERVE_DURATION:-4}
common=(--spawn "$BIN/lnormd" --rows 1 --hidden 4096 --dtype bf16 --duration "$DUR" --warmup 1 --verify 50 --no-progress)
bench() { # name, lnorm-bench args... [-- lnormd args]
  local name=$1
  shift
  phase "$name"
  timeout 120 "$BIN/lnorm-bench" "${common[@]}" --json "$TMP/$name.json" --tag "mode=$name" "$@"
  echo "($name: rc=$?)"
}

ONLY=${LNORM_SERVE_ONLY:-all} # procs: only the process-count sweep (about 4 minutes)
if [ "$ONLY" = all ]; then
scrape_start 17901 "$TMP/metrics-batched.txt"
bench batched --concurrency 1,8,64 --echo -- --backend "$BE" --log-level info --http 127.0.0.1:17901
scrape_stop
bench unbatched --concurrency 1,8,64 -- --backend "$BE" --max-batch-rows 1
scrape_start 17902 "$TMP/metrics-batched-block.txt"
bench batched-block --concurrency 64 -- --backend "$BE" --cuda-sync block --log-level info --http 127.0.0.1:17902
scrape_stop
bench unbatched-block --concurrency 64 -- --backend "$BE" --cuda-sync block --max-batch-rows 1
scrape_start 17903 "$TMP/metrics-batched-nostaging.txt"
bench batched-nostaging --concurrency 64 -- --backend "$BE" --cuda-staging-bytes 0 --http 127.0.0.1:17903
scrape_stop
bench cpu --concurrency 64 -- --backend cpu

phase large
timeout 120 "$BIN/lnorm-bench" --spawn "$BIN/lnormd" --rows 8192 --hidden 4096 --dtype bf16 --duration "$DUR" --warmup 1 \
  --verify 2 --no-progress --concurrency 1,4 --chunk-bytes 8M --pipeline-depth 4 \
  --timeout 20000 --json "$TMP/large.json" --tag mode=large -- --backend "$BE" \
  --max-message-bytes 67108864
echo "(large: rc=$?)"

fi
# By client process count: P load processes (--procs), 8 in flight each.
# Modes: batched (with the echo server beside it), serial (reply-threads 0:
# the completing thread sends every reply), unbatched (max-batch-rows 1),
# cpu, and lnormd --workers 2 / 4 batched and unbatched. /metrics (stages)
# is scraped at each batched point.
PROCS=${LNORM_SERVE_PROCS:-1,4,8,16,32}
for P in ${PROCS//,/ }; do
  c=$((P * 8))
  scrape_start 17910 "$TMP/metrics-procs$P-batched.txt"
  bench "procs$P-batched" --procs "$P" --concurrency "$c" --driver raw --echo -- --backend "$BE" --http 127.0.0.1:17910
  scrape_stop
  bench "procs$P-serial" --procs "$P" --concurrency "$c" --driver raw -- --backend "$BE" --reply-threads 0
  bench "procs$P-unbatched" --procs "$P" --concurrency "$c" --driver raw -- --backend "$BE" --max-batch-rows 1
  bench "procs$P-cpu" --procs "$P" --concurrency "$c" --driver raw -- --backend cpu
  for W in 2 4; do
    scrape_start 17920 "$TMP/metrics-procs$P-w$W-batched.txt"
    bench "procs$P-w$W-batched" --procs "$P" --concurrency "$c" --driver raw -- --backend "$BE" --workers "$W" \
      --http 127.0.0.1:17920
    scrape_stop
    bench "procs$P-w$W-unbatched" --procs "$P" --concurrency "$c" --driver raw -- --backend "$BE" --workers "$W" \
      --max-batch-rows 1
  done
done

if [ "$ONLY" = all ]; then
phase pcie
timeout 60 python3 - "$OUT/serve-pcie.json" <<'PY'
import json, sys, time
try:
    import torch
except Exception as e:
    json.dump({"skipped": "no torch: %s" % e}, open(sys.argv[1], "w")); print("pcie: no torch"); sys.exit(0)
n = 256 << 20
res = {}
for dev in range(torch.cuda.device_count()):
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True); h.random_(0, 255)
    d = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dev}")
    def best(fn):
        t = []
        for _ in range(10):
            torch.cuda.synchronize(dev); s = time.perf_counter(); fn(); torch.cuda.synchronize(dev)
            t.append(time.perf_counter() - s)
        return n / min(t) / 1e9
    res[f"cuda:{dev}"] = {"h2d_GBps": best(lambda: d.copy_(h, non_blocking=True)),
                          "d2h_GBps": best(lambda: h.copy_(d, non_blocking=True))}
print(res)
json.dump({"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "pinned": res},
          open(sys.argv[1], "w"), indent=1)
PY
fi
phase end
kill $smi 2>/dev/null

# One file with every lnorm-bench JSON, one with the metrics, the summary.
for f in "$TMP"/metrics-*.txt; do
  [ -f "$f" ] && { echo "#### $(basename "$f" .txt)"; cat "$f"; }
done >"$OUT/serve-metrics.txt"
if [ "$ONLY" = all ]; then
python3 - "$TMP" "$OUT" "$COMMIT" <<'PY'
import glob, json, os, sys, time
tmp, out, commit = sys.argv[1:4]
runs = {}
for f in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    try:
        runs[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        runs[os.path.basename(f)[:-5]] = {"error": str(e)}
json.dump(runs, open(os.path.join(out, "serve-runs.json"), "w"), indent=1)

def points(name, target="lnormd"):
    res = {}
    for r in runs.get(name, {}).get("runs", []):
        if r.get("target") != target or "concurrency" not in r:
            continue
        c = str(r["concurrency"])
        res[c] = {
            "rows_per_s": r.get("throughput", {}).get("rows_per_s"),
            "errors": r.get("errors"),
            "p50_us": r.get("latency_us", {}).get("p50"),
            "p99_us": r.get("latency_us", {}).get("p99"),
            "server_queue_us": r.get("server", {}).get("queue_us_mean"),
            "server_compute_us": r.get("server", {}).get("compute_us_mean"),
            "batch_requests_mean": r.get("server", {}).get("batch_requests_mean"),
            "server_cpu_us_per_request": (r.get("cpu_us_per_request") or {}).get("server"),
            "client_cpu_us_per_request": (r.get("cpu_us_per_request") or {}).get("client"),
            "verify": r.get("verify"),
        }
    return res

series = {n: points(n) for n in ("batched", "unbatched", "batched-block", "unbatched-block", "batched-nostaging", "cpu")}
series["echo"] = points("batched", "echo")

def ratio(a, b, c):
    try:
        x, y = series[a][c]["rows_per_s"], series[b][c]["rows_per_s"]
        return round(x / y, 3) if x and y else None
    except KeyError:
        return None

cs = ("1", "8", "64")
ratios = {
    "batched_over_unbatched": {c: ratio("batched", "unbatched", c) for c in cs},
    "batched_over_echo": {c: ratio("batched", "echo", c) for c in cs},
    "unbatched_over_echo": {c: ratio("unbatched", "echo", c) for c in cs},
    "c64_batched_over_unbatched_both_block": ratio("batched-block", "unbatched-block", "64"),
    "c64_spin_over_block_batched": ratio("batched", "batched-block", "64"),
    "c64_spin_over_block_unbatched": ratio("unbatched", "unbatched-block", "64"),
    "c64_batched_over_cpu_backend": ratio("batched", "cpu", "64"),
    "c64_staging_on_over_off": ratio("batched", "batched-nostaging", "64"),
}

# GPU utilisation: every sample, and mean/max per GPU per phase.
ph = []
for line in open(os.path.join(tmp, "phases.txt")):
    name, t = line.split()
    ph.append((name, float(t)))
samples = []
for line in open(os.path.join(out, "serve-gpu-util.csv")):
    p = [x.strip() for x in line.split(",")]
    if len(p) < 4:
        continue
    try:
        ts = time.mktime(time.strptime(p[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + p[0].split(".")[1])
        samples.append([round(ts, 3), int(p[1]), float(p[2]), float(p[3])])
    except Exception:
        continue
by_phase = {}
for i, (name, t0) in enumerate(ph[:-1]):
    t1 = ph[i + 1][1]
    for s in samples:
        if t0 <= s[0] < t1:
            d = by_phase.setdefault(name, {}).setdefault(str(s[1]), [])
            d.append(s[2])
by_phase = {n: {g: {"mean_util_pct": round(sum(v) / len(v), 1), "max_util_pct": max(v), "samples": len(v)}
                for g, v in gs.items()} for n, gs in by_phase.items()}

def metric_lines(path):
    keep = ("lnormd_cuda_", "lnormd_batches_total", "lnormd_batch_requests_sum", "lnormd_batch_requests_count",
            "lnormd_backend_errors_total", "lnormd_rows_total")
    res = {}
    try:
        for line in open(path):
            if line.startswith(keep):
                k, v = line.rsplit(" ", 1)
                res[k] = float(v)
    except OSError:
        pass
    return res

large = []
for r in runs.get("large", {}).get("runs", []):
    large.append({"concurrency": r.get("concurrency"), "GBps": r.get("throughput", {}).get("gb_per_s"),
                  "errors": r.get("errors")})
try:
    pcie = json.load(open(os.path.join(out, "serve-pcie.json")))
except Exception as e:
    pcie = {"error": str(e)}
b64 = ratios["batched_over_unbatched"].get("64")
summary = {
    "what": "lnormd CUDA backend serving 1x4096 bf16 LayerNorm (scripts/device-serve.sh)",
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit,
    "cores": os.cpu_count(),
    "rows_per_s": {n: {c: v["rows_per_s"] for c, v in s.items()} for n, s in series.items()},
    "ratios": ratios,
    "target": {"batched_over_unbatched_c64": 5, "measured": b64, "met": bool(b64 and b64 >= 5)},
    "points": series,
    "metrics_last_scrape": {n: metric_lines(os.path.join(tmp, "metrics-%s.txt" % n))
                            for n in ("batched", "batched-block", "batched-nostaging")},
    "large_64MiB_bf16": large,
    "pcie": pcie,
    "gpu_util_by_phase": by_phase,
    "gpu_util_samples": {"columns": ["unix_time", "gpu", "util_pct", "mem_used_MiB"], "rows": samples},
}
json.dump(summary, open(os.path.join(out, "serve-summary.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("rows_per_s", "ratios", "target", "gpu_util_by_phase")}, indent=1))
PY
fi
python3 - "$TMP" "$OUT" "$COMMIT" "$PROCS" "$BE" <<'PY'
import glob, json, os, subprocess, sys, time
tmp, out, commit, procs, be = sys.argv[1:6]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=20).stdout.strip().splitlines()[0]
except Exception:
    gpu = "no GPU (backend %s)" % be
def stages(path):
    """Mean host time per event by stage, from the last /metrics scrape."""
    try:
        txt = open(path).read()
    except Exception:
        return None
    sec, n = {}, {}
    for line in txt.splitlines():
        for key, dst in (("lnormd_stage_seconds_total{stage=", sec), ("lnormd_stage_events_total{stage=", n)):
            if line.startswith(key):
                name = line[len(key) + 1:].split('"')[0]
                dst[name] = float(line.split()[-1])
    return {k: {"events": n.get(k, 0), "mean_us": round(sec[k] / n[k] * 1e6, 2) if n.get(k) else None} for k in sec}
rows = []
for p in procs.split(","):
    for mode, target, name in (("batched", "lnormd", "lnormd_%s_batching_on" % be),
                               ("serial", "lnormd", "lnormd_%s_batching_on_reply_threads_0" % be),
                               ("unbatched", "lnormd", "lnormd_%s_max_batch_rows_1" % be),
                               ("cpu", "lnormd", "lnormd_cpu_backend"),
                               ("w2-batched", "lnormd", "lnormd_%s_workers_2_batching_on" % be),
                               ("w2-unbatched", "lnormd", "lnormd_%s_workers_2_max_batch_rows_1" % be),
                               ("w4-batched", "lnormd", "lnormd_%s_workers_4_batching_on" % be),
                               ("w4-unbatched", "lnormd", "lnormd_%s_workers_4_max_batch_rows_1" % be),
                               ("batched", "echo", "nng_echo_rep0_1024_contexts")):
        f = os.path.join(tmp, "procs%s-%s.json" % (p, mode))
        try:
            d = json.load(open(f))
        except Exception as e:
            rows.append({"target": name, "procs": int(p), "error": "no result: %s" % e})
            continue
        for r in d.get("runs", []):
            if r.get("target") != target:
                continue
            row = {"target": name, "procs": r.get("procs"), "concurrency": r.get("concurrency")}
            if "error" in r:
                row["error"] = r["error"]
            else:
                row.update({
                    "requests_per_s": r["throughput"]["requests_per_s"],
                    "requests": r["requests"], "errors": r["errors"],
                    "errors_by_kind": r.get("errors_by_kind"),
                    "p50_us": r["latency_us"]["p50"], "p99_us": r["latency_us"]["p99"],
                    "p99_9_us": r["latency_us"]["p99_9"],
                    "server_cpu_us_per_request": r["cpu_us_per_request"]["server"],
                    "client_cpu_us_per_request": r["cpu_us_per_request"]["client"],
                    "batch_requests_mean": r["server"]["batch_requests_mean"],
                    "verified": r["verify"]["checked"], "mismatches": r["verify"]["mismatches"],
                    "per_process_requests_per_s": [q.get("requests_per_s") for q in r.get("per_process", [])],
                    "server_threads_cpu_s": {t["name"]: round(t["cpu_s"], 3) for t in r.get("server_threads", [])},
                })
            if target == "lnormd":
                row["stages"] = stages(os.path.join(tmp, "metrics-procs%s-%s.txt" % (p, mode)))
            rows.append(row)
res = {
    "what": "lnormd serving 1 x 4096 bf16 LayerNorm requests over ipc on one host, by client process count, "
            "beside a bare NNG echo server (scripts/device-serve.sh)",
    "device": "%s, %d CPU cores" % (gpu, os.cpu_count()),
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit,
    "load": "lnorm-bench --procs P --driver raw, 8 requests in flight per process, closed loop",
    "client_processes": [int(p) for p in procs.split(",")],
    "rows": rows,
}
json.dump(res, open(os.path.join(out, "serve-procs.json"), "w"), indent=1)
for r in rows:
    print("%-32s P=%-3s %10s req/s  p50 %8s us  p99 %8s us  errors %s%s" % (
        r["target"], r["procs"], "%.0f" % r["requests_per_s"] if "requests_per_s" in r else "-",
        "%.1f" % r["p50_us"] if "p50_us" in r else "-", "%.1f" % r["p99_us"] if "p99_us" in r else "-",
        r.get("errors", "-"), ("  " + r["error"]) if "error" in r else ""))
PY
rm -rf "$TMP"
echo "== done in $((SECONDS - T0)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
