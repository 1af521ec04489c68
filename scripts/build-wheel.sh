#!/usr/bin/env bash
# Build the Python package (client/python) as a wheel that carries this
# build's liblnorm, so that `pip install lnorm-*.whl` needs nothing else:
#   scripts/build-wheel.sh BUILD_DIR OUT_DIR [PYTHON]
# PYTHON (default python3) needs pip; without setuptools and wheel of its
# own, pip fetches them for the build (network). The package is staged in a
# temporary folder: nothing is written into the source tree.
# The wheel is tagged for this platform (it holds a native library).
set -euo pipefail
build=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
py=${3:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)/client/python
lib=$build/client/lib/liblnorm.so.0
[[ -e $lib ]] || { echo "build-wheel: $lib is not built (make first)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$src/src" "$src/pyproject.toml" "$src/README.md" "$stage/"
cp -L "$lib" "$stage/src/lnorm/liblnorm.so.0"
plat=$("$py" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
iso=--no-build-isolation
"$py" -c 'import setuptools, wheel' 2>/dev/null || iso=
"$py" -m pip wheel --disable-pip-version-check -q --no-deps $iso \
  -C--build-option=--plat-name="$plat" -w "$out" "$stage"
ls "$out"/lnorm-*.whl
