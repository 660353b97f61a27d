#!/usr/bin/env bash
# Checks that docs/api.md lists every public declaration of the library products and nothing else,
# and that the modules that are no product (the collector, the fixtures' kit) declare nothing public.
# `--write` regenerates docs/api.md. Reads the symbol graphs SwiftPM extracts from the debug build
# (`swift package dump-symbol-graph`): after `swift build --build-tests` it builds nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=check
case "${1:-}" in
    --write) mode=write ;;
    "") ;;
    *) echo "usage: $0 [--write]" >&2; exit 64 ;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! swift package dump-symbol-graph --skip-synthesized-members >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
directory=$(sed -n 's/^Files written to //p' "$log")
python3 Scripts/api-list.py "$mode" "$directory" docs/api.md
