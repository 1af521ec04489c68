#!/usr/bin/env bash
# Build and run lnorm-cpu-bench (CPU backend beside memcpy and oneDNN, same
# process) and write bench/results/cpu.json: device (CPU model), date,
# commit and every figure. Installs libdnnl-dev first when missing and run
# as root (the oneDNN peer is skipped, not faked, when it cannot be had).
# A second file, cpu-threadclock.json, holds single-thread figures
# timed by the thread's CPU time (steadier on a shared machine).
# Usage: bench/cpu/run.sh [lnorm-cpu-bench options, e.g. --runs 9 --threads 2]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

if ! dpkg -s libdnnl-dev >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get install -y libdnnl-dev || { apt-get update && apt-get install -y libdnnl-dev; } ||
      echo "run.sh: could not install libdnnl-dev; the oneDNN peer will be skipped" >&2
  else
    echo "run.sh: not root and libdnnl-dev missing; the oneDNN peer will be skipped" >&2
  fi
fi

build=${BUILD:-build-bench-cpu}
jobs=${JOBS:-2}
mkdir -p "$build"
if ! cmake -S . -B "$build" -DLNORM_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$build/run-configure.log" 2>&1; then
  # The full project failed to configure (a dependency of another component
  # missing?): build only what the benchmark needs, from a minimal project.
  echo "run.sh: full configure failed (see $build/run-configure.log); using a minimal bench-only project" >&2
  mini="$build/mini-src"
  mkdir -p "$mini"
  cat >"$mini/CMakeLists.txt" <<CMK
cmake_minimum_required(VERSION 3.20)
project(lnorm_cpu_bench_only C CXX)
set(CMAKE_C_STANDARD 11)
set(CMAKE_C_EXTENSIONS OFF)
add_compile_options(-Wall -Wextra)
add_compile_definitions(_GNU_SOURCE)
find_package(Threads REQUIRED)
find_library(LIBM m)
add_library(lnorm_common OBJECT $root/common/errors.c)
target_include_directories(lnorm_common PUBLIC $root/include)
add_subdirectory($root/kernels kernels)
add_subdirectory($root/bench/cpu bench/cpu)
CMK
  build="$build/mini"
  cmake -S "$mini" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "$jobs" --target lnorm-cpu-bench >/dev/null

commit=$(git rev-parse HEAD)
if ! git diff --quiet HEAD -- kernels/core kernels/cpu kernels/CMakeLists.txt bench/cpu include 2>/dev/null; then
  commit="$commit+uncommitted-changes"
fi
mkdir -p bench/results
# Wall clock, 1 and 2 threads: the figures of record.
"$build/bench/cpu/lnorm-cpu-bench" --json "bench/results/cpu.json" --commit "$commit" "$@"
# The same single-threaded, timed by the thread's CPU time: steadier when
# the machine is shared (time the thread was descheduled is not counted).
"$build/bench/cpu/lnorm-cpu-bench" --json "bench/results/cpu-threadclock.json" --commit "$commit" \
  --clock thread "$@"
