#!/usr/bin/env python3
"""Lists the public declarations of the library products from SwiftPM's symbol graphs, and checks
that docs/api.md lists exactly those (Scripts/check-api.sh runs it).

    api-list.py check SYMBOLGRAPH_DIR docs/api.md   # exit 1 when the two lists differ
    api-list.py write SYMBOLGRAPH_DIR docs/api.md   # rewrites docs/api.md

A declaration's line in docs/api.md starts with "- `path` " (its path and kind are what is
checked); the rest of the line, its declaration and the first sentence of its doc comment, is
written by `write` and not checked, so that a reworded doc comment does not fail CI.
"""
import glob
import json
import os
import re
import sys

# Each library product, and the modules whose public declarations it gives its users:
# StallMonitor re-exports StallConfiguration (`@_exported import`), and the symbol graph of
# StallMonitorNIO's extensions of StallMonitor is a file of its own.
PRODUCTS = {
    "StallMonitor": ["StallMonitor", "StallConfiguration"],
    "StallJournal": ["StallJournal"],
    "StallMonitorNIO": ["StallMonitorNIO", "StallMonitorNIO@StallMonitor"],
    "StallMonitorServiceLifecycle": ["StallMonitorServiceLifecycle"],
    "StallMonitorTracing": ["StallMonitorTracing"],
    "StallMonitorTestKit": ["StallMonitorTestKit"],
}
# What each product is for, the line under its heading.
PURPOSE = {
    "StallMonitor": "The monitor of a service's loops, its configuration, its reports and the sinks they go to.",
    "StallJournal": "stallmon's journal entries, for programs that read them: message IDs, field names, records, the reader.",
    "StallMonitorNIO": "SwiftNIO event loops: `startService()` for async servers, and `NIOStallMonitor` for a group.",
    "StallMonitorServiceLifecycle": "The monitor as a `Service` of a swift-service-lifecycle `ServiceGroup`.",
    "StallMonitorTracing": "`StallmonTracer`: spans of swift-distributed-tracing that tell the monitor which request a thread serves.",
    "StallMonitorTestKit": "For a service's own tests: `withStallDetection` fails a test on a stall of the pool; `CollectingSink` keeps reports in memory.",
}
KIND = {
    "swift.class": "class", "swift.struct": "struct", "swift.enum": "enum", "swift.protocol": "protocol",
    "swift.typealias": "typealias", "swift.enum.case": "case", "swift.init": "init", "swift.method": "method",
    "swift.type.method": "static method", "swift.property": "property", "swift.type.property": "static property",
    "swift.func.op": "operator", "swift.func": "function", "swift.var": "variable", "swift.subscript": "subscript",
    "swift.associatedtype": "associated type",
}
LINE = re.compile(r"^- `([^`]+)` \(([^)]+)\)")


def load(directory):
    """Every module's public symbols: {module file name: [symbol]}."""
    graphs = {}
    for path in glob.glob(os.path.join(directory, "*.symbols.json")):
        name = os.path.basename(path)[: -len(".symbols.json")]
        graphs[name] = [s for s in json.load(open(path))["symbols"] if s["accessLevel"] in ("public", "open")]
    return graphs


def summary(symbol):
    """The first sentence of the doc comment, on one line."""
    lines = [line["text"].strip() for line in symbol.get("docComment", {}).get("lines", [])]
    paragraph = []
    for line in lines:
        if not line or line.startswith("- ") or line.startswith("```"):
            break
        paragraph.append(line)
    text = " ".join(paragraph)
    # A sentence ends at a full stop outside backticks, not at "e.g." or "i.e.".
    inside, end = False, len(text)
    for i, c in enumerate(text):
        if c == "`":
            inside = not inside
        elif c == "." and not inside and (i + 1 == len(text) or text[i + 1] == " ") and not text[: i + 1].endswith(("e.g.", "i.e.")):
            end = i + 1
            break
    return text[:end].rstrip(":;,")


def declaration(symbol):
    text = "".join(f["spelling"] for f in symbol["declarationFragments"])
    return re.sub(r"\s+", " ", text).strip()


def listed(graphs):
    """{product: [(path, kind, symbol)]}, sorted so that members follow their type."""
    result = {}
    for product, modules in PRODUCTS.items():
        entries = []
        for module in modules:
            for symbol in graphs.get(module, []):
                path = ".".join(symbol["pathComponents"])
                entries.append((path, KIND.get(symbol["kind"]["identifier"], symbol["kind"]["identifier"]), symbol))
        result[product] = sorted(entries, key=lambda e: (e[0].split("."), e[1]))
    return result


def write(graphs, out):
    lines = [
        "# The public API",
        "",
        "Every public declaration of the six library products, one line each: its path, kind and",
        "declaration, and the first sentence of its doc comment (the full comments are in the sources and",
        "in the DocC documentation, `Sources/StallMonitor/StallMonitor.docc`). Everything else the package",
        "shares between its own targets (the collector, the CLI, the daemon, the benchmark, the test",
        "fixtures) is `package`, not a promise to users.",
        "",
        "Generated by `Scripts/check-api.sh --write` from the symbol graphs of a debug build; CI runs",
        "`Scripts/check-api.sh`, which fails when a public declaration is missing here or one listed here",
        "is gone, and when a module outside the products declares anything `public`.",
        "",
    ]
    for product, entries in listed(graphs).items():
        lines += [f"## {product}", "", PURPOSE[product], ""]
        for path, kind, symbol in entries:
            if "." not in path:
                lines += ["", f"### {path}", ""]
            text = summary(symbol)
            lines.append(f"- `{path}` ({kind}) `{declaration(symbol)}`" + (f": {text}" if text else ""))
        lines.append("")
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"
    open(out, "w").write(text)


def check(graphs, path):
    expected = {(p, k) for entries in listed(graphs).values() for p, k, _ in entries}
    documented = set()
    for line in open(path):
        match = LINE.match(line)
        if match:
            documented.add((match.group(1), match.group(2)))
    problems = []
    for p, k in sorted(expected - documented):
        problems.append(f"public but not in {path}: {p} ({k})")
    for p, k in sorted(documented - expected):
        problems.append(f"in {path} but not public: {p} ({k})")
    # Modules that are no product promise nothing: what they share is `package`.
    product_modules = {m for modules in PRODUCTS.values() for m in modules}
    for module, symbols in sorted(graphs.items()):
        if module in product_modules or module.endswith("Tests"):
            continue
        for symbol in symbols:
            problems.append(f"public in {module}, which is no product (use `package`): {'.'.join(symbol['pathComponents'])}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("Scripts/check-api.sh --write regenerates docs/api.md", file=sys.stderr)
        return 1
    print(f"{path}: the {len(expected)} public declarations of the library products, and nothing else public")
    return 0


if __name__ == "__main__":
    mode, directory, out = sys.argv[1:4]
    graphs = load(directory)
    missing = [m for modules in PRODUCTS.values() for m in modules if m not in graphs]
    if missing:
        sys.exit(f"no symbol graph for {missing} in {directory}")
    if mode == "write":
        write(graphs, out)
    else:
        sys.exit(check(graphs, out))
