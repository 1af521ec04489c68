#!/usr/bin/env bash
# Builds the CPU image and proves it: the container starts and turns
# healthy, the lnorm CLI and the Python suite (tests/python) pass against
# it, and `podman stop` drains (exit status 0) while requests are in flight.
# Needs root, podman, runc and debootstrap (Debian packages); the Debian 12
# base image is made locally with debootstrap, no image registry is used.
#   deploy/container/smoke.sh BUILD_DIR     (a built tree: its lnorm CLI and venv-py)
# --format docker keeps HEALTHCHECK (the OCI image format has none).
# Runtime: runc (crun refuses hosts with hybrid cgroup v1/v2); ulimits are
# given explicitly, as podman's defaults exceed what a root without
# CAP_SYS_RESOURCE may set.
set -euo pipefail
build=$(readlink -f "${1:?usage: smoke.sh BUILD_DIR}")
src=$(cd "$(dirname "$0")/../.." && pwd)
base=localhost/lnorm-debian:12
image=localhost/lnormd:cpu
name=lnormd-smoke-$$
work=$(mktemp -d)
pod=(podman --runtime runc)
limits=(--ulimit "nofile=$(ulimit -n):$(ulimit -Hn)" --ulimit nproc=32768:32768)
trap '"${pod[@]}" rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

for t in podman runc debootstrap curl; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not installed (apt-get install podman runc debootstrap)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root"; exit 77; }

if ! podman image exists "$base"; then
  echo "== base image $base by debootstrap"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; echo "FAIL: debootstrap"; exit 1; }
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

echo "== building $image"
"${pod[@]}" build --format docker --network host "${limits[@]}" --build-arg "BASE=$base" -f "$src/deploy/container/Containerfile.cpu" \
  --ignorefile "$src/deploy/container/containerignore" -t "$image" "$src"

echo "== running it"
mkdir -m 0777 "$work/run"
"${pod[@]}" run -d --name "$name" "${limits[@]}" -p 127.0.0.1::7878 -p 127.0.0.1::7879 \
  -v "$work/run:/run/lnormd" "$image" >/dev/null
tcp=$(podman port "$name" 7878/tcp) http=$(podman port "$name" 7879/tcp)
for _ in $(seq 100); do curl -fsS "http://$http/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://$http/healthz" >/dev/null || { podman logs "$name"; echo "FAIL: /healthz"; exit 1; }
podman healthcheck run "$name" || { echo "FAIL: HEALTHCHECK did not pass"; exit 1; }
echo "healthcheck: healthy"
[[ $(podman exec "$name" id -u) == 10001 ]] || { echo "FAIL: not running as uid 10001"; exit 1; }
[[ $(podman top "$name" pid comm | awk 'NR==2 {print $1, $2}') == "1 lnormd" ]] ||
  { podman top "$name" pid comm; echo "FAIL: lnormd is not PID 1"; exit 1; }

echo "== C client (lnorm CLI) over tcp and over the ipc socket"
"$build/client/cli/lnorm" health --url "tcp://$tcp"
"$build/client/cli/lnorm" info --url "ipc://$work/run/lnormd.sock"
echo "== Python suite against the container"
LNORM_TEST_URL="tcp://$tcp" LNORMD=/bin/false LNORM_LIBRARY=$(readlink -f "$build/client/lib/liblnorm.so") \
  LNORM_PY_LAYOUT=$build/tests/python/lnorm_py_layout \
  "$build/venv-py/bin/python" -m pytest -q -p no:cacheprovider "$src/tests/python"

echo "== podman stop drains requests in flight"
LNORM_LIBRARY=$(readlink -f "$build/client/lib/liblnorm.so") "$build/venv-py/bin/python" \
  "$src/deploy/container/load.py" "tcp://$tcp" 6 >"$work/load.out" 2>&1 &
load=$!
sleep 2
podman stop -t 15 "$name" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
wait "$load" || true
cat "$work/load.out"
[[ $code == 0 ]] || { podman logs "$name" | tail -20; echo "FAIL: exit status $code after podman stop"; exit 1; }
grep -q "^wrong 0$" "$work/load.out" || { echo "FAIL: wrong results during the drain"; exit 1; }
echo "PASS: image built, served, passed the clients and drained on podman stop"
