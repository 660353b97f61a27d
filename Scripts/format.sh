#!/usr/bin/env bash
# Lints the Swift sources with swift-format (.swift-format: 4 spaces, 120 columns).
# Usage: Scripts/format.sh          lint, exit 1 on findings
#        Scripts/format.sh --fix    rewrite the files in place
set -euo pipefail
cd "$(dirname "$0")/.."
# Not the snippets that Scripts/check-snippets.sh copies from the Markdown into Examples/Sources/Snippets/Generated.
paths=(Package.swift Sources Tests Examples/Package.swift)
for path in Examples/Sources/* Examples/Sources/Snippets/*; do
    case "$path" in
        Examples/Sources/Snippets | Examples/Sources/Snippets/Generated) ;;
        *) paths+=("$path") ;;
    esac
done
if [[ "${1:-}" == "--fix" ]]; then
    swift format format --in-place --recursive "${paths[@]}"
    exit 0
fi
findings=$(swift format lint --recursive "${paths[@]}" 2>&1 || true)
if [[ -n "$findings" ]]; then
    echo "$findings"
    echo "swift-format: $(echo "$findings" | wc -l) findings; run Scripts/format.sh --fix" >&2
    exit 1
fi
echo "swift-format: clean"
