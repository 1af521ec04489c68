#!/bin/sh
# 64 MiB requests (16384 rows x 1024 f32 LayerNorm), one in flight:
# lnormd through the client library (split into chunks, pipelined) against
# the echo server receiving each request as one 64 MiB NNG message; plus
# lnormd over raw NNG with single 64 MiB messages (max-message-bytes raised)
# to separate chunking from the service. ROUNDS rounds; each round is one
# lnorm-bench invocation that spawns a fresh lnormd and a fresh echo server
# and measures lnormd, then echo, with the same load (one request in flight)
# for the same time. Writes bench/results/load-large-vs-echo.json.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-6}
# CHUNK=2M: liblnorm's chunk_bytes for the lib driver (default: the
# library's default, 1 MiB); OUT: the result file.
CHUNK=${CHUNK:-}
OUT=${OUT:-$RESULTS/load-large-vs-echo.json}
chunk_note="its default chunk size and pipeline depth: chunks of 1 MiB of x (256 rows, 64 chunks per request), pipeline depth 2"
if [ -n "$CHUNK" ]; then
    chunk_note="chunk_bytes $CHUNK (--chunk-bytes $CHUNK; the library's default is 1 MiB) and its default pipeline depth 2"
fi
files=""
for r in $(seq 1 "$ROUNDS"); do
    for drv in lib raw; do
        extra=""
        if [ "$drv" = lib ] && [ -n "$CHUNK" ]; then
            extra="--chunk-bytes $CHUNK"
        fi
        # shellcheck disable=SC2086
        "$BENCH" --spawn "$LNORMD" --driver "$drv" $extra --rows 16384 --hidden 1024 --dtype f32 --op ln \
            --concurrency 1 --duration "$DURATION" --warmup 1 --echo --verify 2 --variants 1 \
            --timeout 60000 --grace 10 --no-progress --tag round="$r" --tag loadavg_before="$LOADAVG" \
            --json "$SCRATCH/$drv-$r.json" -- --max-message-bytes 134217728 || true
        files="$files $SCRATCH/$drv-$r.json"
    done
done
# shellcheck disable=SC2086
python3 "$(dirname "$0")/aggregate.py" --out "$OUT" \
    --name large-vs-echo --target-ratio 3.0 --tag loadavg_before="$LOADAVG" \
    --note "64 MiB f32 LayerNorm requests (16384 rows x 1024), concurrency 1 (closed loop), ipc transport for both servers (each on its own private ipc path), both servers spawned by lnorm-bench in the same invocation and measured one after the other (lnormd, then echo) with the same load and duration. lnormd: CPU backend, default options plus --max-message-bytes 134217728 (which only the raw row needs). driver lib = lnormd through liblnorm's async API with $chunk_note, each chunk one NNG message. driver raw = lnormd with the whole request as one 64 MiB message. echo: lnorm-bench --echo-serve (NNG rep0, 1024 contexts, each message sent back unchanged), always sent the whole 64 MiB request as one message by the raw driver (encoded once up front, one req0 context). ratio = lnormd requests/s over echo requests/s of the same round; median, min and max over the rounds." \
    $files
