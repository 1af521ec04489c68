# The virtualenv the Python tests share, under the build folder (numpy,
# ml_dtypes, pytest, setuptools, wheel from PyPI, made once, under a lock),
# with the lnorm package installed from a copy of client/python.
# Sourced with $build, $src, $lnormd, $liblnorm, $layout set; sets $venv.
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
