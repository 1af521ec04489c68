#!/usr/bin/env bash
# Serving on the GPU machine: lnormd (CUDA backend, every visible GPU) measured by
# lnorm-bench against itself with batching off, plus large requests against the
# pinned-PCIe ceiling measured in the same run. Run from the repository root on
# the device with the static binaries in $1 (default .devserve: lnormd and
# lnorm-bench, built here with -DLNORM_STATIC_DEPS=ON). Results go to $OUT.
set -u
BIN=${1:-.devserve}
OUT=${OUT:-/tmp/lnorm-serve-out}
mkdir -p "$OUT"
log=$OUT/serve.log
exec > >(tee -a "$log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

echo "== device"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
nproc; date -u +%FT%TZ

echo "== pinned PCIe ceiling (torch, 256 MiB, best of 10)"
python3 - "$OUT/serve-pcie.json" <<'PY'
import json, sys, time, torch
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
json.dump({"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pinned": res},
          open(sys.argv[1], "w"), indent=1)
PY

nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -lms 500 > "$OUT/serve-gpu-util.csv" 2>&1 &
smi=$!

common=(--spawn "$BIN/lnormd" --rows 1 --hidden 4096 --dtype bf16 --duration 4 --warmup 1 --verify 50 --no-progress)
echo "== small requests, batching on (max-queue-delay-us 0: whatever queued while the GPU was busy)"
"$BIN/lnorm-bench" "${common[@]}" --concurrency 1,8,64 --json "$OUT/serve-batched.json" \
  --tag mode=batched -- --backend cuda --log-level info
echo "== small requests, batching off (max-batch-rows 1: one request per batch)"
"$BIN/lnorm-bench" "${common[@]}" --concurrency 1,8,64 --json "$OUT/serve-unbatched.json" \
  --tag mode=unbatched -- --backend cuda --max-batch-rows 1

echo "== large requests: 64 MiB bf16 (8192 x 4096), client chunks pipelined"
"$BIN/lnorm-bench" --spawn "$BIN/lnormd" --rows 8192 --hidden 4096 --dtype bf16 --duration 5 --warmup 1 \
  --verify 2 --no-progress --concurrency 1,4 --chunk-bytes 8M --pipeline-depth 4 \
  --timeout 20000 --json "$OUT/serve-large.json" --tag mode=large -- --backend cuda \
  --max-message-bytes 67108864
kill $smi 2>/dev/null
echo "== done"
