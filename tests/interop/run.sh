#!/usr/bin/env bash
# interop.python: set up (once) a virtualenv under the build folder with pynng,
# protobuf, numpy and grpcio-tools (for protoc) from PyPI, generate the
# Python protobuf module from proto/lnorm.proto, and run interop_test.py.
# No network / no venv: the test FAILS, it is never skipped.
#   run.sh BUILD_DIR SOURCE_DIR LNORMD
set -uo pipefail
build=$1 src=$2 lnormd=$3
venv=$build/venv
py=${PYTHON:-python3}
[[ -x $lnormd ]] || { echo "FAIL: lnormd not built at $lnormd"; exit 1; }
(
  flock 9
  if [[ ! -f $venv/.lnorm-interop-ok ]]; then
    echo "== creating $venv (pip from PyPI)"
    rm -rf "$venv"
    "$py" -m venv "$venv" || { echo "FAIL: cannot create a virtualenv with $py"; exit 1; }
    "$venv/bin/pip" install --disable-pip-version-check -q pynng numpy grpcio-tools ||
      { echo "FAIL: pip could not install pynng numpy grpcio-tools (no network?)"; exit 1; }
    touch "$venv/.lnorm-interop-ok"
  fi
) 9>"$build/.venv.lock" || exit 1
out=$build/tests/interop/pb
mkdir -p "$out"
"$venv/bin/python" -m grpc_tools.protoc -I "$src/proto" --python_out="$out" "$src/proto/lnorm.proto" ||
  { echo "FAIL: protoc (grpc_tools) could not generate lnorm_pb2.py"; exit 1; }
exec "$venv/bin/python" "$src/tests/interop/interop_test.py" "$lnormd" "$out"
