#!/usr/bin/env bash
# Nsight Compute on a few of lnormd's kernels (bulk off and forced), for finding what holds them
# under the copy ceiling: speed of light, memory workload, occupancy, warp stalls. Device, repo
# root, bundle from scripts/device-pack.sh: OUT=dir scripts/device-ncu.sh [bundle] [op:dtype:H ...]
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
shift || true
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-ncu-XXXXXX)
tar xJf "$PACK" -C "$W" || exit 1
# Every launch (each case runs twice: a warm-up, then the same launch again).
timeout 400 ncu --target-processes all -k regex:'k_(fast|bulk|reg)' --launch-count 16 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section LaunchStats --csv --page details \
  python3 bench/gpu/ncu_kernels.py "$W/b/kernels/cuda/liblnorm_cuda_bench.so" "$@" >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
rc=$?
tail -n 5 "$OUT/ncu.err"
rm -rf "$W"
exit $rc
