#!/bin/sh
# bench.smoke: lnorm-bench against a test lnormd that it starts itself on a
# private ipc path (--spawn waits for lnormd's --ready-file), a few hundred
# requests with replies verified, the echo baseline beside it, then the JSON
# is checked for sane fields.
# usage: smoke.sh LNORM_BENCH LNORMD WORKDIR
set -eu
BENCH=$1 LNORMD=$2 WORK=$3
PY=${PYTHON:-python3}
mkdir -p "$WORK"
rm -f "$WORK/smoke.json" "$WORK/smoke.svg" "$WORK/smoke.csv"
rc=0
"$BENCH" --spawn "$LNORMD" --concurrency 1,8 --requests 300 --duration 8 --timeout 3000 \
    --grace 1 --mix "1x1024:f32:ln:3,4x512:bf16:rms:1,2x256:f16:ln:out=f32:1" --stats \
    --residual --params inline --verify 100 --echo --no-progress \
    --json "$WORK/smoke.json" --csv "$WORK/smoke.csv" --plot "$WORK/smoke.svg" \
    -- --cpu-threads 1 || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "bench.smoke: lnorm-bench exited with $rc" >&2
    exit 1
fi
# --transport cuda-ipc on a CPU lnormd (or a build or machine without CUDA):
# the run fails, exits non-zero and says why, naming CUDA or the GPU.
rc=0
"$BENCH" --spawn "$LNORMD" --transport cuda-ipc --rows 4 --hidden 256 --duration 1 --warmup 0.2 \
    --no-progress -- --backend cpu --cpu-threads 1 --allow-shm >"$WORK/cuda.txt" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || ! grep -q "failed: .*\(CUDA\|GPU\)" "$WORK/cuda.txt"; then
    echo "bench.smoke: --transport cuda-ipc on a CPU lnormd: exit $rc, no reason given:" >&2
    cat "$WORK/cuda.txt" >&2
    exit 1
fi
"$PY" - "$WORK/smoke.json" "$WORK/smoke.svg" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
bad = []
def need(cond, what):
    if not cond:
        bad.append(what)
need(d.get("device") and d.get("date") and d.get("commit"), "device/date/commit present")
allruns = d["runs"]
runs = [r for r in allruns if r["target"] == "lnormd"]
echo = [r for r in allruns if r["target"] == "echo"]
need(len(runs) == 2 and len(echo) == 2, "two points (c=1, c=8) for lnormd and for echo")
for r in echo:
    need(r["requests"] > 0 and r["errors"] == 0, "echo c=%s: requests > 0, errors == 0" % r.get("concurrency"))
    need(r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["max"], "echo: p50 <= p99 <= max")
need(len(d["ratios_vs_echo"]) == 2 and all(q["throughput_ratio"] > 0 for q in d["ratios_vs_echo"]),
     "lnormd/echo ratios present")
for r in runs:
    name = "%s c=%s" % (r["target"], r.get("concurrency"))
    lat = r["latency_us"]
    need(r["requests"] > 0, name + ": requests > 0")
    need(r["errors"] == 0, name + ": errors == 0 (%s)" % r.get("errors_by_kind"))
    need(r["requests"] + r["errors"] <= 300, name + ": bounded by --requests")
    need(0 < lat["p50"] <= lat["p99"] <= lat["max"], name + ": 0 < p50 <= p99 <= max")
    need(lat["min"] <= lat["p50"], name + ": min <= p50")
    need(r["throughput"]["requests_per_s"] > 0, name + ": throughput > 0")
    need(r["throughput"]["rows_per_s"] >= r["throughput"]["requests_per_s"], name + ": rows/s >= req/s")
    need(r["verify"]["checked"] > 0, name + ": replies verified")
    need(r["verify"]["mismatches"] == 0, name + ": verify mismatches == 0 (%s)" % r["verify"])
    need(r["server"]["replies_with_timings"] > 0, name + ": server timings present")
    need(r["server"]["batch_requests_mean"] >= 1, name + ": mean batch >= 1 request")
svg = open(sys.argv[2]).read()
need(svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and "polyline" in svg, "svg written")
if bad:
    print("bench.smoke FAILED:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("bench.smoke: ok (%d points, %d requests, %d verified)" % (
    len(runs), sum(r["requests"] for r in runs), sum(r["verify"]["checked"] for r in runs)))
PYEOF
