#!/usr/bin/env bash
# The long soak: lnormd under full load from several clients (tcp and ipc)
# for SECONDS (default 300), zero errors allowed, RSS growth after warm-up
# under 5%. Builds lnormd and the soak driver (tests/fault/test_soak.c) in
# build-rel, and writes bench/results/soak-<date>.json.
#
#   bench/soak/run.sh [SECONDS] [CLIENTS_PER_URL]
#
# Environment: SOAK_BUILD (build folder, default build-rel), SOAK_JOBS (-j, default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-300}
k=${2:-2}
build=${SOAK_BUILD:-build-rel}
bash scripts/bootstrap
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DLNORM_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "${SOAK_JOBS:-2}" --target lnormd fault_soak
mkdir -p bench/results
out=bench/results/soak-$(date -u +%Y-%m-%d).json
"$build/tests/fault/fault_soak" "$PWD/$build/server/lnormd" --seconds "$secs" --clients-per-url "$k" --json "$out"
