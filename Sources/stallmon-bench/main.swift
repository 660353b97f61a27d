// stallmon-bench: what stallmon costs the loop it watches, measured against an unmonitored loop, a
// no-op observer and the blog design, each workload in a fresh child process.
//
//   stallmon-bench [--rounds N] [--scale X] [--quick] [--json] [--callgrind | --no-callgrind]
//                  [--no-nio | --nio-only] [--hummingbird PATH | --no-hummingbird | --hummingbird-only]
//                  [--no-external | --external-only]
//
// Children are this executable again: /proc/self/exe --child VARIANT WORKLOAD [--NAME VALUE]...
// The SwiftNIO part runs StallmonNIOServer, found next to this executable, under wrk (NIOBench.swift);
// the Hummingbird part runs the example service Examples/.build/*/HummingbirdFixture (HummingbirdBench.swift);
// the part watched from outside runs that service without stallmon under stallmond, found next to this
// executable, and its BPF tick watcher (ExternalWatchBench.swift).
// STALLMON_BENCH_DEBUG=1 makes the stall children print their latencies, duration errors and
// memory growth to standard error.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--child" {
    guard let request = ChildRequest(arguments: Array(arguments.dropFirst())) else {
        Child.fail("usage: --child VARIANT WORKLOAD [--NAME VALUE]...")
    }
    Child.run(request)
}
if arguments.contains("-h") || arguments.contains("--help") {
    print(Options.usage)
    exit(0)
}
do {
    let options = try Options(arguments)
    exit(try Bench(options: options).run())
} catch {
    FileHandle.standardError.write(Data("stallmon-bench: \(error)\n".utf8))
    exit(error is Options.UsageError ? 64 : 1)
}
