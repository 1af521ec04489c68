#!/bin/sh
# Latency against throughput: open loop, Poisson arrivals at rising offered
# rates, 1x1024 f32 LayerNorm through the client library, lnormd and the
# echo baseline at each rate (the rates reach past where either can keep
# up). Writes bench/results/load-curve.{json,svg,csv}.
. "$(dirname "$0")/common.sh"
RATES=${RATES:-2000,5000,10000,20000,30000,40000,60000,80000,100000,120000}
DURATION=${DURATION:-3}
"$BENCH" --spawn "$LNORMD" --rows 1 --hidden 1024 --dtype f32 --op ln \
    --rate "$RATES" --arrivals poisson --max-in-flight 512 --duration "$DURATION" --warmup 1 \
    --echo --verify 50 --no-progress --tag loadavg_before="$LOADAVG" \
    --json "$RESULTS/load-curve.json" --csv "$RESULTS/load-curve.csv" \
    --plot "$RESULTS/load-curve.svg" || true
