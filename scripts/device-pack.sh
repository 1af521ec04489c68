#!/usr/bin/env bash
# Pack what one device call needs into one small file (the device takes at
# most 64 MiB of carried paths; every static binary carries the kernels'
# device code, ~11 MB each as xz, so the whole set, ~79 MB, does not fit one
# call), laid out as a build folder under b/. Parts (third argument, a comma
# list, default gpu):
#   gpu    test_gpu, test_backend_cuda, test_gpu_bwd, liblnorm_cuda_bench.so
#          (scripts/device-gpu.sh, scripts/device-ncu.sh)
#   serve  lnormd, lnorm-bench, lnorm-backend-bench, lnorm-ipc-bench
#          (scripts/device-serve.sh, the serving part of scripts/device-run.sh)
# Usage (development machine): scripts/device-pack.sh [build-folder] [out] [parts]
#   make device-build   (or the cmake lines at the top of scripts/device-serve.sh)
#   scripts/device-pack.sh build-sm90 .devpack/lnorm-sm90.tar.xz gpu
# Then on the device: scripts/device-run.sh .devpack/lnorm-sm90.tar.xz [steps] 0 0
set -eu
B=${1:-build-sm90}
P=${2:-.devpack/lnorm-sm90.tar.xz}
PARTS=${3:-gpu}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/b/tests/gpu" "$T/b/kernels/cuda" "$(dirname "$P")"
case ",$PARTS," in *,gpu,*)
  cp "$B/tests/gpu/test_gpu" "$B/tests/gpu/test_backend_cuda" "$B/tests/gpu/test_gpu_bwd" "$T/b/tests/gpu/"
  cp "$B/kernels/cuda/liblnorm_cuda_bench.so" "$T/b/kernels/cuda/" ;;
esac
case ",$PARTS," in *,serve,*)
  cp "$B/server/lnormd" "$B/client/bench/lnorm-bench" "$T/b/"
  cp "$B/bench/gpu/lnorm-backend-bench" "$T/b/lnorm-backend-bench"
  cp "$B/bench/gpu/lnorm-ipc-bench" "$T/b/lnorm-ipc-bench" ;;
esac
git rev-parse --short HEAD >"$T/b/lnorm_commit.txt" 2>/dev/null || echo unknown >"$T/b/lnorm_commit.txt"
tar cJf "$P" -C "$T" b
ls -l "$P"
size=$(stat -c %s "$P")
if [ "$size" -gt $((64 << 20)) ]; then
  echo "device-pack: $P is $((size >> 20)) MiB, over the device's 64 MiB carry limit: pack fewer parts" >&2
  exit 1
fi
