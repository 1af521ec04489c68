#!/usr/bin/env bash
# client.install: install the build into a temporary prefix, build
# client/examples against it with find_package(lnorm) (shared and static)
# and with pkg-config, and run each example against a real lnormd.
#   install_test.sh BUILD_DIR SOURCE_DIR LNORMD
set -euo pipefail
build=$1 src=$2 lnormd=$3
# Extra compile/link flags for the consumer builds (a sanitized build needs them).
xflags=${LNORM_CONSUMER_FLAGS:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lnorm-install-XXXXXX")
pid=
cleanup() {
  if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== install into $tmp/prefix"
cmake --install "$build" --component client --prefix "$tmp/prefix" >"$tmp/install.log"
for f in include/lnorm/lnorm.h include/lnorm/errors.h include/lnorm/types.h; do
  [[ -f $tmp/prefix/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done
cfg=$(find "$tmp/prefix" -name lnormConfig.cmake | head -1)
pc=$(find "$tmp/prefix" -name lnorm.pc | head -1)
[[ -n $cfg && -n $pc ]] || { echo "FAIL: package files missing (config '$cfg', pc '$pc')"; exit 1; }
libdir=$(dirname "$(find "$tmp/prefix" -name 'liblnorm.so' | head -1)")
[[ -f $libdir/liblnorm.a ]] || { echo "FAIL: liblnorm.a not installed"; exit 1; }

echo "== configure + build client/examples with find_package(lnorm)"
cmake -S "$src/client/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$xflags" -DCMAKE_EXE_LINKER_FLAGS="$xflags" \
  >"$tmp/ex-config.log" || { cat "$tmp/ex-config.log"; exit 1; }
cmake --build "$tmp/ex" -j2 >"$tmp/ex-build.log" || { cat "$tmp/ex-build.log"; exit 1; }

echo "== build with pkg-config"
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags=$(pkg-config --cflags --libs lnorm)
echo "pkg-config --cflags --libs lnorm: $flags"
cc $xflags -std=c11 -Wall -Wextra -Werror -o "$tmp/normalize_pc" "$src/client/examples/normalize.c" $flags -lm

# The installed library must not need the build tree.
if ldd "$tmp/ex/normalize" | grep -q "$build"; then
  echo "FAIL: the example links the build tree's library"; ldd "$tmp/ex/normalize"; exit 1
fi

echo "== start lnormd"
[[ -x $lnormd ]] || { echo "FAIL: lnormd not built at $lnormd"; exit 1; }
"$lnormd" --listen "ipc://$tmp/lnormd.sock" --http off --backend cpu --cpu-threads 1 \
  --ready-file "$tmp/ready" >"$tmp/lnormd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [[ -s $tmp/ready ]] && break; sleep 0.05; done
[[ -s $tmp/ready ]] || { echo "FAIL: lnormd not ready"; cat "$tmp/lnormd.log"; exit 1; }
url=$(awk '$1 == "listen" {print $2; exit}' "$tmp/ready")

echo "== run the examples against $url"
LD_LIBRARY_PATH="$libdir" "$tmp/ex/normalize" "$url"
"$tmp/ex/normalize_static" "$url"
LD_LIBRARY_PATH="$libdir" "$tmp/normalize_pc" "$url"
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
[[ $rc -eq 0 ]] || { echo "FAIL: lnormd exit status $rc after SIGTERM"; exit 1; }
echo "client.install: PASS"
