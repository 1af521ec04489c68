#!/usr/bin/env bash
# python.client: install the lnorm package (client/python) into a virtualenv
# under the build folder (numpy, ml_dtypes, pytest from PyPI, made once) and
# run its pytest suite against this build's lnormd and liblnorm.
# No network / no venv: the test FAILS, it is never skipped.
#   run.sh BUILD_DIR SOURCE_DIR LNORMD LIBLNORM LAYOUT_PROGRAM SANITIZE(ON|OFF)
set -uo pipefail
build=$1 src=$2 lnormd=$3 liblnorm=$4 layout=$5 sanitize=${6:-OFF}
. "$(dirname "$0")/venv.sh"

export LNORMD=$lnormd LNORM_LIBRARY=$liblnorm LNORM_PY_LAYOUT=$layout
if [[ $sanitize == ON ]]; then
  # liblnorm is built with ASan + UBSan: its runtime must be loaded first in
  # the (uninstrumented) Python process; Python's own allocations are not
  # leak-checked (they live until exit by design).
  asan=$(gcc -print-file-name=libasan.so)
  [[ -e $asan ]] || { echo "SKIP: sanitized build but no libasan.so to preload"; exit 77; }
  export LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
fi
cd "$src/tests/python" || exit 1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$src/tests/python"
