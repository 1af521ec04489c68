#!/usr/bin/env bash
# Builds lnormd's libFuzzer targets (clang, ASan + UBSan) in build-fuzz and
# runs each for a bounded time over its committed seed corpus.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default 60 s each, every target)
#
# Environment: FUZZ_BUILD (build folder, default build-fuzz), FUZZ_JOBS
# (build parallelism, default 2), FUZZ_JSON (write a JSON summary there:
# device, date, commit, command, compiler and each target's figures).
# Exits non-zero if a build fails or any target finds a crash, leak,
# timeout or out-of-memory: the reproducer is left in
# $FUZZ_BUILD/artifacts/; copy it into fuzz/corpus/<target>/ (as
# crash-<what>.bin) once fixed, so every ctest run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-2}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(server_request ring_sqe client_response client_wire)

# clang and its libFuzzer runtime (Debian: clang, libclang-rt-14-dev).
cc=${CC:-}
if [ -z "$cc" ]; then
  for c in clang clang-14; do command -v "$c" >/dev/null 2>&1 && { cc=$c; break; }; done
fi
have_fuzzer() {
  [ -n "$cc" ] && echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){(void)d;(void)n;return 0;}' |
    "$cc" -x c -fsanitize=fuzzer,address -o /dev/null - >/dev/null 2>&1
}
if ! have_fuzzer; then
  pkgs="clang libclang-rt-14-dev"
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "fuzz.sh: installing $pkgs (clang + libFuzzer runtime)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs
    cc=clang
  fi
  have_fuzzer || { echo "fuzz.sh: clang with libFuzzer is needed (apt-get install $pkgs)" >&2; exit 1; }
fi
cxx=${CXX:-${cc/clang/clang++}}
bash scripts/bootstrap

# Everything in the fuzz build is instrumented for coverage (fuzzer-no-link),
# ASan and UBSan; only the fuzz_* executables link libFuzzer's main.
flags="-fsanitize=fuzzer-no-link -g -O1"
CC=$cc CXX=$cxx cmake -S . -B "$build" -DLNORM_FUZZ=ON -DLNORM_SANITIZE=ON -DLNORM_WITH_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
cmake --build "$build" -j "$jobs" --target $(printf 'fuzz_%s ' "${targets[@]}")

mkdir -p "$build/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fail=0
summary=()
for t in "${targets[@]}"; do
  seeds=fuzz/corpus/$t
  work=$build/corpus/$t
  mkdir -p "$work"
  log=$build/fuzz-$t.log
  echo "fuzz.sh: fuzz_$t for ${secs}s (seeds: $seeds, log: $log)"
  set +e
  "$build/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  crashes=$(find "$build/artifacts" -name "$t-*" -type f | wc -l)
  echo "fuzz.sh: fuzz_$t: exit $rc, executions ${execs:-?}, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, artifacts $crashes"
  if [ $rc -ne 0 ]; then
    fail=1
    echo "fuzz.sh: fuzz_$t FAILED; end of its log:" >&2
    tail -40 "$log" >&2
  fi
  summary+=("{\"target\": \"$t\", \"seconds\": $secs, \"exit\": $rc, \"executions\": ${execs:-0}, \"cov\": ${cov:-0}, \"ft\": ${ft:-0}, \"corpus\": ${corp:-0}, \"artifacts\": $crashes}")
done
if [ -n "${FUZZ_JSON:-}" ]; then
  model=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo 2>/dev/null | head -1)
  { echo "{"
    echo "  \"device\": \"${model:-unknown CPU}, $(nproc) CPUs\","
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"commit\": \"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\","
    echo "  \"command\": \"scripts/fuzz.sh $secs ${targets[*]}\","
    echo "  \"compiler\": \"$("$cc" --version | head -1)\","
    echo "  \"runs\": ["
    for i in "${!summary[@]}"; do
      sep=,; [ "$i" -eq $((${#summary[@]} - 1)) ] && sep=
      echo "    ${summary[$i]}$sep"; done
    echo "  ]"
    echo "}"; } >"$FUZZ_JSON"
  echo "fuzz.sh: summary written to $FUZZ_JSON"
fi
exit $fail
