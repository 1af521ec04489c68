#!/usr/bin/env bash
# Pack what one device call needs into one small file (the device takes at
# most 64 MiB of carried paths; the static binaries are ~90 MB, ~20 MB as xz):
# build-sm90's lnormd, lnorm-bench, test_gpu, test_backend_cuda, test_gpu_bwd,
# liblnorm_cuda_bench.so and lnorm-backend-bench (b/lnorm-backend-bench),
# laid out as a build folder under b/.
# Usage (development machine): scripts/device-pack.sh [build-folder] [out]
#   make device-build   (or the cmake lines at the top of scripts/device-serve.sh)
#   scripts/device-pack.sh build-sm90 .devpack/lnorm-sm90.tar.xz
# Then on the device: scripts/device-run.sh .devpack/lnorm-sm90.tar.xz
set -eu
B=${1:-build-sm90}
P=${2:-.devpack/lnorm-sm90.tar.xz}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/b/tests/gpu" "$T/b/kernels/cuda" "$(dirname "$P")"
cp "$B/tests/gpu/test_gpu" "$B/tests/gpu/test_backend_cuda" "$B/tests/gpu/test_gpu_bwd" "$T/b/tests/gpu/"
cp "$B/server/lnormd" "$B/client/bench/lnorm-bench" "$T/b/"
cp "$B/bench/gpu/lnorm-backend-bench" "$T/b/lnorm-backend-bench"
cp "$B/kernels/cuda/liblnorm_cuda_bench.so" "$T/b/kernels/cuda/"
git rev-parse --short HEAD >"$T/b/lnorm_commit.txt" 2>/dev/null || echo unknown >"$T/b/lnorm_commit.txt"
tar cJf "$P" -C "$T" b
ls -l "$P"
