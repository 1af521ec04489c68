#!/bin/sh
# 1 row x 1024 f32 LayerNorm requests, closed loop at concurrency 1, 8 and
# 64: lnormd (spawned on a private ipc path, CPU backend) against the NNG
# echo server on the same transport with the same messages, alternating per
# point, ROUNDS times, through the client library (lib) and raw NNG (raw).
# Writes bench/results/load-small-vs-echo.{json,svg,csv}.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-2}
files=""
for drv in lib raw; do
    for r in $(seq 1 "$ROUNDS"); do
        extra=""
        if [ "$drv" = lib ] && [ "$r" = "$ROUNDS" ]; then
            extra="--plot $RESULTS/load-small-vs-echo.svg --csv $RESULTS/load-small-vs-echo.csv"
        fi
        # shellcheck disable=SC2086
        "$BENCH" --spawn "$LNORMD" --driver "$drv" --rows 1 --hidden 1024 --dtype f32 --op ln \
            --concurrency 1,8,64 --duration "$DURATION" --warmup 1 --echo --verify 50 \
            --no-progress --tag round="$r" --tag loadavg_before="$LOADAVG" \
            --json "$SCRATCH/$drv-$r.json" $extra || true
        files="$files $SCRATCH/$drv-$r.json"
    done
done
# shellcheck disable=SC2086
python3 "$(dirname "$0")/aggregate.py" --out "$RESULTS/load-small-vs-echo.json" \
    --name small-vs-echo --target-ratio 0.9 --tag loadavg_before="$LOADAVG" \
    --note "1x1024 f32 LayerNorm, closed loop; lnormd/echo = requests/s of lnormd over requests/s of the echo server at the same concurrency, same transport (ipc), same request bytes; medians over rounds" \
    $files
