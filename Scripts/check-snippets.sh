#!/usr/bin/env bash
# Every ```swift block of README.md, Examples/README.md and the DocC articles compiles: this writes
# each into a file of the Examples package's Snippets target (Examples/Sources/Snippets/Generated,
# git-ignored), which `swift build --package-path Examples` then builds (`--build` builds that
# target here), and evaluates each whole Package.swift with `swift package dump-package`. CI runs it
# before the Examples build. Compiler messages point at the Markdown file and line.
#
# A block is compiled as the HTML comment on the line before it says (invisible where the Markdown
# is shown):
#   (none)                                  statements: the body of an `async throws` function
#   <!-- snippet: statements M1 M2 -->      the same, with `import M1`, `import M2` added
#   <!-- snippet: main M1 -->               the top-level code of a main.swift: the body of a
#                                           synchronous throwing function
#   <!-- snippet: declarations M1 M2 -->    types and functions, in a namespace of their own, so that
#                                           two snippets may both declare `App`; `@main` is dropped
#                                           (a module has one); no extensions
#   <!-- snippet: manifest -->              a whole Package.swift
# A snippet's own `import` lines are moved to the top of its file. Blocks that are not Swift (shell,
# JSON, journal output) are not ```swift; a Swift block that must not compile has no place here.
set -euo pipefail
cd "$(dirname "$0")/.."

build=false
case "${1:-}" in
    --build) build=true ;;
    "") ;;
    *) echo "usage: $0 [--build]" >&2; exit 64 ;;
esac

manifests=$(mktemp -d)
trap 'rm -rf "$manifests"' EXIT
python3 - "$manifests" README.md Examples/README.md Sources/*/*.docc/*.md <<'PY'
import os, re, sys

manifests, sources = sys.argv[1], sys.argv[2:]
root = os.getcwd()
out = os.path.join("Examples", "Sources", "Snippets", "Generated")
os.makedirs(out, exist_ok=True)
marker = re.compile(r"^<!--\s*snippet:\s*(statements|main|declarations|manifest)((?:\s+[A-Za-z_][A-Za-z0-9_]*)*)\s*-->$")
written, count, basenames = set(), 0, {}
for source in sources:
    # Messages name the Markdown file (#sourceLocation), except for a second file of one name
    # (Examples/README.md): a module's #fileID strings must differ. Its snippets' files say where
    # they come from in their first line.
    located = basenames.setdefault(os.path.basename(source), source) == source
    lines = open(source).read().split("\n")
    parent = os.path.basename(os.path.dirname(source))
    stem = os.path.splitext(os.path.basename(source))[0]
    if parent and not parent.endswith(".docc"):
        stem = f"{parent}_{stem}"
    stem = re.sub(r"[^A-Za-z0-9]", "_", stem)
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```swift":
            if re.match(r"^\s*<!--\s*snippet", lines[index]) and not marker.match(lines[index].strip()):
                sys.exit(f"{source}:{index + 1}: unknown snippet marker: {lines[index].strip()}")
            index += 1
            continue
        start = index + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            sys.exit(f"{source}:{start}: ```swift block without its end")
        body = lines[start:end]
        previous = next((l.strip() for l in reversed(lines[:index]) if l.strip()), "")
        match = marker.match(previous)
        kind, extra = (match.group(1), match.group(2).split()) if match else ("statements", [])
        count += 1
        name = f"{stem}_{start}"
        index = end + 1
        if kind == "manifest":
            directory = os.path.join(manifests, name)
            os.makedirs(directory)
            open(os.path.join(directory, "Package.swift"), "w").write("\n".join(body) + "\n")
            open(os.path.join(manifests, "list"), "a").write(f"{directory} {source}:{start + 1}\n")
            continue
        imports = [f"import {module}" for module in extra]
        code = []
        for line in body:
            if re.match(r"^import \w+$", line.strip()):
                imports.append(line.strip())
                code.append("")
            elif kind == "declarations" and line.startswith("@main "):
                code.append(line[len("@main "):])
            else:
                code.append(line)
        opening = {
            "declarations": f"enum Snippet_{name} {{",
            "main": f"func snippet_{name}() throws {{",
            "statements": f"func snippet_{name}() async throws {{",
        }[kind]
        text = "\n".join(
            [f"// {source}:{start + 1}, compiled as {kind} by Scripts/check-snippets.sh: edit it there."]
            + sorted(set(imports)) + ["", opening]
            + ([f'#sourceLocation(file: "{os.path.join(root, source)}", line: {start + 1})'] if located else [])
            + code + (["#sourceLocation()"] if located else []) + ["}", ""]
        )
        path = os.path.join(out, f"{name}.swift")
        written.add(path)
        # Unchanged files keep their time, so that the build recompiles only what changed.
        if not os.path.exists(path) or open(path).read() != text:
            open(path, "w").write(text)
for stale in set(os.path.join(out, f) for f in os.listdir(out)) - written:
    os.remove(stale)
print(f"{count} Swift snippets in {len(sources)} files: {len(written)} into {out}")
PY

if [ -f "$manifests/list" ]; then
    while read -r directory location; do
        if ! swift package dump-package --package-path "$directory" >/dev/null 2>"$directory/log"; then
            echo "$location: this Package.swift does not load:" >&2
            cat "$directory/log" >&2
            exit 1
        fi
    done < "$manifests/list"
fi

if $build; then
    swift build --package-path Examples --target Snippets
fi
