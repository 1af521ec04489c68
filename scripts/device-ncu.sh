#!/usr/bin/env bash
# Nsight Compute on a few of lnormd's kernels (bulk off and forced), for finding what holds them
# under the copy ceiling: speed of light, memory workload, occupancy, warp stalls. Device, repo
# root, bundle from scripts/device-pack.sh: OUT=dir scripts/device-ncu.sh [bundle] [op:dtype:H ...]
# NCU_PEERS=1: a few metrics of lnormd's kernel beside torch.compile's (ncu-peers.csv);
# LNORM_TUNE="name=value,..." adds a launch of lnormd with those settings (bench/gpu/ncu_peers.py).
# NCU_BWD=1: the backward kernels instead (ncu-bwd.csv).
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
shift || true
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-ncu-XXXXXX)
tar xJf "$PACK" -C "$W" || exit 1
if [ "${NCU_PEERS:-0}" = 1 ]; then
  # lnormd's kernel and torch.compile's on the same tensors, side by side
  # (bench/gpu/ncu_peers.py starts and stops the profiler around one launch of each).
  timeout 400 ncu --target-processes all --profile-from-start off --clock-control none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__block_size,launch__grid_size,launch__occupancy_limit_registers,smsp__inst_executed.sum,lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,lts__t_bytes.sum,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct \
    python3 bench/gpu/ncu_peers.py "$W/b/kernels/cuda/liblnorm_cuda_bench.so" "$@" >"$OUT/ncu-peers.csv" 2>"$OUT/ncu-peers.err"
  rc=$?
  tail -n 5 "$OUT/ncu-peers.err"
  rm -rf "$W"
  exit $rc
fi
if [ "${NCU_BWD:-0}" = 1 ]; then
  # The backward kernels (bench/gpu/ncu_bwd.py; cases op:dtype:H), with the warp-stall sampling
  # by instruction (SourceCounters).
  timeout 400 ncu --target-processes all --clock-control none -k regex:'k_bwd' --launch-count 16 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SchedulerStats --section SourceCounters \
    --csv --page details \
    python3 bench/gpu/ncu_bwd.py "$W/b/kernels/cuda/liblnorm_cuda_bench.so" "$@" >"$OUT/ncu-bwd.csv" 2>"$OUT/ncu-bwd.err"
  rc=$?
  tail -n 5 "$OUT/ncu-bwd.err"
  rm -rf "$W"
  exit $rc
fi
# Every launch (each case runs twice: a warm-up, then the same launch again).
timeout 400 ncu --target-processes all --clock-control none -k regex:'k_(fast|bulk|reg)' --launch-count 16 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section LaunchStats --csv --page details \
  python3 bench/gpu/ncu_kernels.py "$W/b/kernels/cuda/liblnorm_cuda_bench.so" "$@" >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
rc=$?
tail -n 5 "$OUT/ncu.err"
rm -rf "$W"
exit $rc
