# Shared by the bench/load scripts: where the binaries are, the commit, and
# a scratch folder. Source it; BUILD may be set (default build-bench).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
BENCH=$BUILD/client/bench/lnorm-bench
LNORMD=$BUILD/server/lnormd
RESULTS=$ROOT/bench/results
for f in "$BENCH" "$LNORMD"; do
    if [ ! -x "$f" ]; then
        echo "missing $f: cmake -S . -B build-bench -DLNORM_WITH_CUDA=OFF && cmake --build build-bench -j2" >&2
        exit 1
    fi
done
COMMIT=$(git -C "$ROOT" rev-parse --short=12 HEAD)
if ! git -C "$ROOT" diff --quiet HEAD -- client server kernels include proto 2>/dev/null; then
    COMMIT="$COMMIT-dirty"
fi
export LNORM_BENCH_COMMIT=$COMMIT
SCRATCH=$(mktemp -d /tmp/lnorm-load.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$RESULTS"
