#!/usr/bin/env bash
# Builds the sampler's C files with ThreadSanitizer and runs Tests/SamplerTSan/sampler_tsan.c: two
# watchdogs sample running, blocked and sleeping threads while the process forks. Any report of
# ThreadSanitizer fails the run (exit 66). Needs libunwind-dev (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
clang -std=gnu11 -g -O1 -fsanitize=thread -DSTALLMON_LINUX=1 -ISources/CStallPlatform/include -ISources/CStallCapture/include -ISources/CStallCapture \
    Sources/CStallCapture/*.c Tests/SamplerTSan/sampler_tsan.c -o "$out/sampler_tsan" -lunwind-generic -lunwind -ldl -lpthread \
    -L/opt/swift/usr/lib/swift/linux -Wl,-rpath,/opt/swift/usr/lib/swift/linux -ldispatch -lBlocksRuntime
TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" "$out/sampler_tsan"
