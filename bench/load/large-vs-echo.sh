#!/bin/sh
# 64 MiB requests (16384 rows x 1024 f32 LayerNorm), one in flight:
# lnormd through the client library (split into chunks, pipelined) against
# the echo server receiving each request as one 64 MiB NNG message; plus
# lnormd over raw NNG with single 64 MiB messages (max-message-bytes raised)
# to separate chunking from the service. ROUNDS rounds.
# Writes bench/results/load-large-vs-echo.json.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6}
files=""
for drv in lib raw; do
    for r in $(seq 1 "$ROUNDS"); do
        "$BENCH" --spawn "$LNORMD" --driver "$drv" --rows 16384 --hidden 1024 --dtype f32 --op ln \
            --concurrency 1 --duration "$DURATION" --warmup 1 --echo --verify 2 --variants 1 \
            --timeout 60000 --grace 10 --no-progress --tag round="$r" --tag loadavg_before="$LOADAVG" \
            --json "$SCRATCH/$drv-$r.json" -- --max-message-bytes 134217728 || true
        files="$files $SCRATCH/$drv-$r.json"
    done
done
# shellcheck disable=SC2086
python3 "$(dirname "$0")/aggregate.py" --out "$RESULTS/load-large-vs-echo.json" \
    --name large-vs-echo --target-ratio 3.0 --tag loadavg_before="$LOADAVG" \
    --note "64 MiB f32 requests, concurrency 1; driver lib = lnormd through liblnorm (chunked, its default chunk size and pipeline depth), driver raw = lnormd with one 64 MiB message per request; echo always gets one 64 MiB message per request; ratio = requests/s lnormd over echo" \
    $files
