#!/usr/bin/env bash
# Build a tuning variant of liblnorm_cuda_bench.so (sm_90) with different
# kernel knobs into <build>/ab/<name>/, where scripts/device-gpu.sh's bench
# step picks it up and times it beside the default build (side by side, same
# run). Knobs: see kernels/cuda/lnorm_cuda_kernels.cuh (LNORM_CUDA_*).
# Usage: scripts/device-ab-build.sh NAME [-DLNORM_CUDA_X=Y ...]   (env BUILD, default build-sm90)
set -euo pipefail
name=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
o=$root/${BUILD:-build-sm90}/ab/$name
mkdir -p "$o"
cd "$root/kernels/cuda"
inc=(-I. -I../core -I../../include)
# At most two compilers at once (shared build machine).
printf '%s\n' f32 f16 bf16 | xargs -P2 -I{} nvcc -std=c++17 -arch=sm_90 -O3 -Xcompiler -fPIC "$@" "${inc[@]}" \
  -c lnorm_cuda_{}.cu -o "$o/{}.o"
gcc -std=c11 -O2 -fPIC "$@" "${inc[@]}" -I/usr/local/cuda/include -c lnorm_cuda_run.c -o "$o/run.o"
gcc -std=c11 -O2 -fPIC -I../core -I../../include -c ../core/segment.c -o "$o/segment.o"
nvcc -shared -arch=sm_90 -o "$o/liblnorm_cuda_bench.so" "$o"/*.o -cudart static
rm -f "$o"/*.o
echo "built $o/liblnorm_cuda_bench.so"
