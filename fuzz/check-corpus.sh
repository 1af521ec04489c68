#!/usr/bin/env bash
# Checks that the committed seed corpora are exactly what the generator
# writes today (so the seeds follow the schema). Regenerate with:
#   fuzz/check-corpus.sh GEN_BINARY --update
set -euo pipefail
gen=${1:?usage: check-corpus.sh GEN_BINARY [--update]}
src=$(cd "$(dirname "$0")" && pwd)/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dirs="server_request client_response client_wire"
for d in $dirs; do mkdir -p "$tmp/$d"; done
"$gen" "$tmp" >/dev/null
if [ "${2:-}" = "--update" ]; then
  for d in $dirs; do
    mkdir -p "$src/$d"
    rm -f "$src/$d"/*.pb
    cp "$tmp/$d"/*.pb "$src/$d/"
  done
  echo "check-corpus: updated $(ls "$tmp"/*/*.pb | wc -l) seeds in $src"
  exit 0
fi
# Only the generated seeds (*.pb) are compared; crash reproducers
# (crash-*, kept as regression inputs) are left alone.
if ! diff -r <(cd "$src" && find . -name '*.pb' | sort | xargs sha256sum) \
             <(cd "$tmp" && find . -name '*.pb' | sort | xargs sha256sum); then
  echo "check-corpus: committed seeds differ from the generator's; run fuzz/check-corpus.sh GEN --update" >&2
  exit 1
fi
echo "check-corpus: $(cd "$tmp" && find . -name '*.pb' | wc -l) seeds match the generator"
