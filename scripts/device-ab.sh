#!/usr/bin/env bash
# A quick A/B device call (about 1-2 minutes of device time): unpack the
# bundle made by scripts/device-pack.sh, run test_gpu --quick (and, with
# SAN=1, racecheck on it), then bench/kernels.py without peers on a few
# hidden sizes, timing the default library beside every tuning variant in
# the bundle (b/ab/NAME, built by scripts/device-ab-build.sh) and any
# run-time variants given. Not the proof (scripts/device-run.sh is): a way
# to decide between kernel variants in one short call.
# Usage (device, repository root):
#   OUT=dir [SAN=1] scripts/device-ab.sh [bundle] [hs] [ops] [dtypes] [--variant NAME=KEY:VAL ...]
#   e.g. OUT=$OUT scripts/device-ab.sh .devpack/lnorm-sm90.tar.xz 16384,65536,262144 ln,rms bfloat16,float32 \
#          --variant nobulk=bulk:0
set -u
PACK=${1:-.devpack/lnorm-sm90.tar.xz}
HS=${2:-1024,4096,16384,32768,65536,131072,262144}
OPS=${3:-ln,rms}
DTS=${4:-bfloat16,float32}
shift $(($# < 4 ? $# : 4))
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/lnorm-ab-XXXXXX)
trap 'rm -rf "$W"' EXIT
tar xJf "$PACK" -C "$W" || { echo "cannot unpack $PACK"; exit 1; }
B=$W/b
echo "commit $(cat "$B/lnorm_commit.txt")  $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)  $(date -u +%FT%TZ)"
rc=0
t0=$SECONDS
timeout 150 "$B/tests/gpu/test_gpu" --quick >"$OUT/quick-test.log" 2>&1 || rc=1
echo "test_gpu --quick: rc=$rc ($((SECONDS - t0)) s) $(tail -n 1 "$OUT/quick-test.log")"
if [ "${SAN:-0}" = 1 ]; then
  t0=$SECONDS
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/gpu/test_gpu" --quick \
    >"$OUT/racecheck.log" 2>&1
  r=$?
  [ $r -eq 0 ] || rc=1
  echo "racecheck: rc=$r ($((SECONDS - t0)) s) $(tail -n 1 "$OUT/racecheck.log")"
fi
ALTS=()
for so in "$B"/ab/*/liblnorm_cuda_bench.so; do
  [ -f "$so" ] && ALTS+=(--alt "$(basename "$(dirname "$so")")=$so")
done
t0=$SECONDS
timeout 300 python3 bench/kernels.py --lib "$B/kernels/cuda/liblnorm_cuda_bench.so" --out "$OUT" --no-peers \
  --hs "$HS" --ops "$OPS" --dtypes "$DTS" --commit "$(cat "$B/lnorm_commit.txt")" "${ALTS[@]}" "$@" \
  >"$OUT/ab.log" 2>&1 || rc=1
echo "bench: rc=$rc ($((SECONDS - t0)) s)"
grep -v '^wrote' "$OUT/ab.log"
exit $rc
