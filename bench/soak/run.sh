#!/usr/bin/env bash
# The long soak: lnormd under full load from several clients (tcp and ipc)
# for SECONDS (default 300): zero errors, no growth of the heap in use
# between the idle points after warm-up and at the end, bounded RSS (the
# checks are tests/fault/test_soak.c's). Builds lnormd and that driver in
# build-rel, and writes bench/results/soak.json (with device, date, commit).
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
out=bench/results/soak.json
"$build/tests/fault/fault_soak" "$PWD/$build/server/lnormd" --seconds "$secs" --clients-per-url "$k" --json "$out"
python3 - "$out" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$secs" "$k" <<'PY'
import json, os, sys
out, commit, secs, k = sys.argv[1:]
d = json.load(open(out))
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
head = {"device": "%s, %d CPUs" % (model, os.cpu_count()), "date": d.get("date"), "commit": commit,
        "command": "bench/soak/run.sh %s %s" % (secs, k)}
json.dump({**head, **{key: v for key, v in d.items() if key not in head}}, open(out, "w"), indent=1)
PY
