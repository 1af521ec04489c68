#!/usr/bin/env bash
# Nsight Compute on one kernel of one bench case (device, repository root):
# unpack the bundle made by scripts/device-pack.sh, run bench/kernels.py on
# a single op / dtype / H without peers under ncu, profile the first launch
# whose name matches KERNEL, and leave the text report in $OUT/ncu-*.txt.
# Clocks are left alone (--clock-control none, as the device notes ask).
# Usage: OUT=dir scripts/device-ncu.sh [bundle] [op] [dtype] [H] [kernel regex] [sections]
#   e.g. OUT=$OUT scripts/device-ncu.sh .devpack/lnorm-sm90.tar.xz ln bfloat16 65536 k_bulk \
#          SpeedOfLight,WarpStateStats,SchedulerStats,InstructionStats,SourceCounters
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
OP=${2:-ln}
DT=${3:-bfloat16}
H=${4:-65536}
KERN=${5:-k_bulk}
SECTIONS=${6:-SpeedOfLight,WarpStateStats,SchedulerStats,InstructionStats,Occupancy,LaunchStats}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-ncu-XXXXXX)
trap 'rm -rf "$W"' EXIT
tar xJf "$PACK" -C "$W" || { echo "cannot unpack $PACK"; exit 1; }
B=$W/b
args=()
IFS=, read -r -a secs <<<"$SECTIONS"
for s in "${secs[@]}"; do args+=(--section "$s"); done
rep=$OUT/ncu-$(cat "$B/lnorm_commit.txt")-$OP-$DT-$H.txt
timeout 300 ncu --clock-control none -k "regex:$KERN" -c 1 "${args[@]}" \
  python3 bench/kernels.py --lib "$B/kernels/cuda/liblnorm_cuda_bench.so" --out "$W/x" --no-peers \
  --hs "$H" --ops "$OP" --dtypes "$DT" --variant none=bulk:1 >"$rep" 2>&1
rc=$?
echo "ncu: rc=$rc, report $rep"
grep -E "^  [a-z_]+<|Duration|Throughput|Warp Cycles Per Issued|Executed Instructions  |No Eligible|Achieved Occupancy" "$rep" | head -20
exit $rc
