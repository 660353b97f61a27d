#!/usr/bin/env bash
# Builds stallmon-bench in release mode and runs it; arguments go to the benchmark.
# Usage: Scripts/bench.sh [--quick] [--json] [--rounds N] [--scale X] [--callgrind | --no-callgrind] [--cf-run-loop]
#                        [--no-nio | --nio-only] [--hummingbird PATH | --no-hummingbird | --hummingbird-only]
#                        [--no-external | --external-only]
#        SCRATCH_PATH=DIR Scripts/bench.sh …   builds in DIR instead of .build
#
# The full run takes about 10 minutes on 2 cores; --quick takes well under one. Instruction
# counts need valgrind (apt-get install -y valgrind); the SwiftNIO part needs wrk (apt-get install -y wrk);
# the part watched from outside needs root, tracefs and stallmond (built here) next to stallmon-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=(${SCRATCH_PATH:+--scratch-path "$SCRATCH_PATH"})
swift build -c release "${scratch[@]}" --product stallmon-bench >&2
swift build -c release "${scratch[@]}" --product StallmonNIOServer >&2
swift build -c release "${scratch[@]}" --product stallmond >&2
swift build -c release "${scratch[@]}" --product stallmond-daemon >&2
bin=$(swift build -c release "${scratch[@]}" --show-bin-path)
exec "$bin/stallmon-bench" "$@"
