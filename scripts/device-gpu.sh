#!/usr/bin/env bash
# The GPU proof, in one command, on a machine with an NVIDIA GPU, from the
# repository root, with a build folder made by `make device-build`
# (build-sm90, static, sm_90) carried along:
#   1. tests/gpu/test_gpu            (full matrix vs float64, GPU vs CPU, invariance)
#      tests/gpu/test_backend_cuda   (lnormd's CUDA backend: concurrent jobs, slots)
#      tests/gpu/test_gpu_bwd        (backward: matrix vs float64, edges, bit-identical dgamma/dbeta)
#   2. compute-sanitizer memcheck on test_gpu --quick, racecheck on --defer;
#      memcheck on test_gpu_bwd, racecheck on test_gpu_bwd --pair
#   3. the Triton seed kernel's correctness test
#   4. bench/kernels.py              (lnormd vs torch eager / compile / Triton seed)
# Logs, JSON and PNG go to $OUT (default ./device-out); summary.txt lists
# each step's exit status. Exits non-zero if any step failed.
# A short step, not part of the proof: quick (test_gpu --quick). bwdbench:
# bench/kernels.py --bwd (lnormd's backward beside torch eager/compile,
# Liger-Kernel and flash-attention's Triton layer_norm, whose code is read
# from $PEERS, default .peers: liger/liger_kernel, fa/flash_attn; peers
# other than torch eager timed for $BWD_PEER_BUDGET s, default 360).
# Usage: scripts/device-gpu.sh [build-folder] [steps: any of test,backend,bwd,san,triton,bench,bwdbench,quick]
set -u
B=${1:-build-sm90}
STEPS=${2:-test,backend,bwd,san,triton,bench}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
COMMIT=${LNORM_COMMIT:-$(cat "$B/lnorm_commit.txt" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export LNORM_COMMIT=$COMMIT
S=$OUT/summary.txt
{
  echo "date: $(date -u +%FT%TZ)  commit: $COMMIT"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
} >"$S"
fail=0
step() { # name, timeout, log, command...
  local name=$1 t=$2 log=$3
  shift 3
  local t0=$SECONDS
  timeout "$t" "$@" >"$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s) $(tail -n 1 "$log" | cut -c1-200)" >>"$S"
  [ $rc -eq 0 ] || fail=1
}
case ",$STEPS," in *,quick,*)
  step gpu-test-quick 150 "$OUT/quick-test.log" "$B/tests/gpu/test_gpu" --quick ;;
esac
case ",$STEPS," in *,test,*)
  step gpu-test 360 "$OUT/gpu-test.log" "$B/tests/gpu/test_gpu" ;;
esac
case ",$STEPS," in *,backend,*)
  step gpu-backend 180 "$OUT/gpu-backend.log" "$B/tests/gpu/test_backend_cuda" ;;
esac
case ",$STEPS," in *,bwd,*)
  step gpu-bwd 300 "$OUT/gpu-bwd.log" "$B/tests/gpu/test_gpu_bwd" ;;
esac
case ",$STEPS," in *,san,*)
  # Both tools into one log (at most 8 files come back from the device).
  step memcheck 240 "$OUT/sanitizer-memcheck.tmp" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/gpu/test_gpu" --quick
  # racecheck over all of --quick is too slow for one call; --defer takes
  # the rescue-list cases alone (about 160 s on an H200).
  step racecheck 280 "$OUT/sanitizer-racecheck.tmp" compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/gpu/test_gpu" --defer
  # The backward: memcheck over all of test_gpu_bwd (about 100 s), racecheck
  # over its rows-two-at-a-time part (about 110 s).
  step memcheck-bwd 240 "$OUT/sanitizer-memcheck-bwd.tmp" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/gpu/test_gpu_bwd"
  step racecheck-bwd 240 "$OUT/sanitizer-racecheck-bwd.tmp" compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/gpu/test_gpu_bwd" --pair
  cat "$OUT"/sanitizer-memcheck.tmp "$OUT"/sanitizer-racecheck.tmp "$OUT"/sanitizer-memcheck-bwd.tmp \
    "$OUT"/sanitizer-racecheck-bwd.tmp >"$OUT/sanitizer.log"
  rm -f "$OUT"/sanitizer-*.tmp ;;
esac
case ",$STEPS," in *,triton,*)
  step triton-test 240 "$OUT/triton-test.log" python3 kernels/triton/test_lnorm_triton.py ;;
esac
case ",$STEPS," in *,bench,*)
  step bench 420 "$OUT/bench.log" python3 bench/kernels.py --lib "$B/kernels/cuda/liblnorm_cuda_bench.so" --out "$OUT" --commit "$COMMIT" --name "${BENCH_NAME:-h200}" ;;
esac
case ",$STEPS," in *,bwdbench,*)
  step bwd-bench 540 "$OUT/bwd-bench.log" python3 bench/kernels.py --bwd --peers "${PEERS:-.peers}" --peer-budget-s "${BWD_PEER_BUDGET:-360}" --lib "$B/kernels/cuda/liblnorm_cuda_bench.so" --out "$OUT" --commit "$COMMIT" --name "${BENCH_NAME:-h200}" ;;
esac
cat "$S"
exit $fail
