#!/usr/bin/env bash
# python.wheel: scripts/build-wheel.sh makes a wheel that carries this
# build's liblnorm; installed on its own into a folder (LNORM_LIBRARY unset),
# the package loads the liblnorm inside it and normalizes through a real
# lnormd, checked against float64.
#   wheel.sh BUILD_DIR SOURCE_DIR LNORMD LIBLNORM LAYOUT_PROGRAM SANITIZE(ON|OFF)
set -uo pipefail
build=$1 src=$2 lnormd=$3 liblnorm=$4 layout=$5 sanitize=${6:-OFF}
. "$(dirname "$0")/venv.sh"
tmp=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
bash "$src/scripts/build-wheel.sh" "$build" "$tmp/whl" "$venv/bin/python" || { echo "FAIL: build-wheel.sh"; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$tmp/site" "$tmp"/whl/lnorm-*.whl ||
  { echo "FAIL: pip install the wheel"; exit 1; }
"$lnormd" --backend cpu --cpu-threads 1 --listen "ipc://$tmp/l.sock" --http off --ready-file "$tmp/ready" \
  >"$tmp/lnormd.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [[ -f $tmp/ready ]] && break; sleep 0.1; done
[[ -f $tmp/ready ]] || { cat "$tmp/lnormd.log"; echo "FAIL: lnormd did not start"; exit 1; }
if [[ $sanitize == ON ]]; then
  # the wheel carries the ASan + UBSan liblnorm: its runtime first (as run.sh)
  asan=$(gcc -print-file-name=libasan.so)
  [[ -e $asan ]] || { echo "SKIP: sanitized build but no libasan.so to preload"; exit 77; }
  export LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
fi
cd "$tmp" && env -u LNORM_LIBRARY PYTHONPATH="$tmp/site" "$venv/bin/python" - "$tmp" <<'PY'
import os
import sys

import numpy as np

site = os.path.realpath(os.path.join(sys.argv[1], "site"))
import lnorm  # noqa: E402
import lnorm._lib as L  # noqa: E402

assert os.path.realpath(lnorm.__file__).startswith(site), f"lnorm imported from {lnorm.__file__}, not the wheel"
assert os.path.realpath(L.lib._name).startswith(site), f"liblnorm loaded from {L.lib._name}, not the wheel"
rng = np.random.default_rng(7)
x = rng.standard_normal((33, 1000)).astype(np.float32) * 3 + 1
g = rng.standard_normal(1000).astype(np.float32)
with lnorm.Client("ipc://" + sys.argv[1] + "/l.sock") as c:
    y = c.normalize(x, op="ln", gamma=g)
xd = x.astype(np.float64)
ref = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * g
err = float(np.max(np.abs(y - ref)))
assert err < 1e-4, f"max error {err} against float64"
print(f"python.wheel: {os.path.basename(L.lib._name)} from the wheel, 33 x 1000 LayerNorm, max error {err:.2e}")
PY
