#!/usr/bin/env bash
# Nsight Compute, full set with per-instruction (SASS) warp-stall sampling, on one launch of
# lnormd's bulk kernel per case: where a kernel's warps wait, instruction by instruction.
# Device, repo root, bundle from scripts/device-pack.sh:
#   OUT=dir scripts/device-ncu-source.sh [bundle] op:dtype:H ...   (e.g. ln:bf16:131072)
# Writes, per case, OUT/ncu-src-<op>-<dtype>-<H>.csv (the source page: SASS, stall samples)
# and .txt (the details page), compressed into OUT/ncu-src.tgz.
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
shift || true
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-ncusrc-XXXXXX)
tar xJf "$PACK" -C "$W" || exit 1
rc=0
for c in "$@"; do
  n=$(echo "$c" | tr ':' '-')
  # ncu_kernels.py launches k_bulk twice per case (warm-up, then the launch profiled here).
  timeout 300 ncu --target-processes all --clock-control none -k regex:k_bulk --launch-skip 1 --launch-count 1 \
    --set full -f -o "$W/$n" python3 bench/gpu/ncu_kernels.py "$W/b/kernels/cuda/liblnorm_cuda_bench.so" "$c" \
    >"$W/$n.log" 2>&1 || rc=$?
  ncu --import "$W/$n.ncu-rep" --page source --csv --print-source sass >"$W/ncu-src-$n.csv" 2>>"$W/$n.log" || rc=$?
  ncu --import "$W/$n.ncu-rep" --page details >"$W/ncu-src-$n.txt" 2>>"$W/$n.log" || rc=$?
  tail -n 3 "$W/$n.log"
done
(cd "$W" && tar czf "$OUT/ncu-src.tgz" ncu-src-* ./*.log)
rm -rf "$W"
exit $rc
