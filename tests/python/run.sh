#!/usr/bin/env bash
# python.client: install the lnorm package (client/python) into a virtualenv
# under the build folder (numpy, ml_dtypes, pytest from PyPI, made once) and
# run its pytest suite against this build's lnormd and liblnorm.
# No network / no venv: the test FAILS, it is never skipped.
#   run.sh BUILD_DIR SOURCE_DIR LNORMD LIBLNORM LAYOUT_PROGRAM SANITIZE(ON|OFF)
set -uo pipefail
build=$1 src=$2 lnormd=$3 liblnorm=$4 layout=$5 sanitize=${6:-OFF}
venv=$build/venv-py
py=${PYTHON:-python3}
for f in "$lnormd" "$liblnorm" "$layout"; do [[ -e $f ]] || { echo "FAIL: $f not built"; exit 1; }; done
(
  flock 9
  if [[ ! -f $venv/.lnorm-py-ok ]]; then
    echo "== creating $venv (pip from PyPI)"
    rm -rf "$venv"
    "$py" -m venv "$venv" || { echo "FAIL: cannot create a virtualenv with $py"; exit 1; }
    "$venv/bin/pip" install --disable-pip-version-check -q numpy ml_dtypes pytest setuptools wheel ||
      { echo "FAIL: pip could not install numpy ml_dtypes pytest (no network?)"; exit 1; }
    touch "$venv/.lnorm-py-ok"
  fi
  # The package is installed from a copy, so that no build output lands in the source tree.
  stage=$(mktemp -d) && cp -r "$src/client/python/src" "$src/client/python/pyproject.toml" "$src/client/python/README.md" "$stage/" &&
    "$venv/bin/pip" install --disable-pip-version-check -q --no-cache-dir --no-deps --no-build-isolation \
      --force-reinstall "$stage" >"$stage.log" 2>&1 ||
    { cat "$stage.log"; echo "FAIL: pip install client/python"; rm -rf "$stage" "$stage.log"; exit 1; }
  rm -rf "$stage" "$stage.log"
) 9>"$build/.venv-py.lock" || exit 1

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
