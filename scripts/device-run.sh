#!/usr/bin/env bash
# One device call for everything GPU: unpack the bundle made by
# scripts/device-pack.sh, run the GPU proof (scripts/device-gpu.sh: test_gpu,
# test_backend_cuda, compute-sanitizer, bench/kernels.py) and the serving
# benchmark (scripts/device-serve.sh), then lnorm-backend-bench (batching
# inside the CUDA backend, no transport), and leave at most 8 files in $OUT
# (the serving files and backend-bench.json / .log are bundled as serve.tgz).
# Usage (device, repository root):
#   OUT=dir scripts/device-run.sh [bundle] [gpu-steps|none] [serve: 1|0] [backend-bench: 1|0]
# (a bundle holds the gpu part or the serve part: scripts/device-pack.sh)
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
STEPS=${2:-test,backend,san,bench}
SERVE=${3:-1}
BBENCH=${4:-1}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-run-XXXXXX)
tar xJf "$PACK" -C "$W" || { echo "cannot unpack $PACK"; exit 1; }
export LNORM_COMMIT=$(cat "$W/b/lnorm_commit.txt")
rc=0
OUT=$OUT bash scripts/device-gpu.sh "$W/b" "$STEPS" || rc=1
if [ "$SERVE" = 1 ]; then
  OUT=$W/serve bash scripts/device-serve.sh "$W/b" >/dev/null 2>&1 || rc=1
fi
if [ "$BBENCH" = 1 ]; then
  # Into $W/serve (so into serve.tgz): $OUT already holds up to 8 files.
  mkdir -p "$W/serve"
  t0=$SECONDS
  timeout 60 "$W/b/lnorm-backend-bench" --json "$W/serve/backend-bench.json" --commit "$LNORM_COMMIT" \
    >"$W/serve/backend-bench.log" 2>&1
  brc=$?
  [ $brc -eq 0 ] || rc=1
  echo "backend-bench: rc=$brc ($((SECONDS - t0)) s) $(tail -n 1 "$W/serve/backend-bench.log" | cut -c1-200)" >>"$OUT/summary.txt"
fi
if [ "$SERVE" = 1 ] || [ "$BBENCH" = 1 ]; then
  tar czf "$OUT/serve.tgz" -C "$W" serve
fi
if [ "$SERVE" = 1 ]; then
  tail -n 25 "$W/serve/serve.log"
fi
if [ "$BBENCH" = 1 ]; then
  echo "== lnorm-backend-bench (backend-bench.json in serve.tgz)"
  cat "$W/serve/backend-bench.log"
fi
rm -rf "$W"
exit $rc
