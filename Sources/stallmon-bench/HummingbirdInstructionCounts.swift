import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Instructions per `/hello` request of the whole HummingbirdFixture process, unmonitored
/// (`EXAMPLE_STALLMON=off`) and monitored by `startService()`, counted by callgrind: each variant
/// runs twice, answering different numbers of requests on one keep-alive connection, and the
/// difference cancels start-up and shutdown. A request runs on an event loop and on a pool thread,
/// so only the whole process tells what it costs; that count also holds work that comes with time
/// rather than with requests (the watchdogs' looks and heartbeats, Hummingbird's date timer), and
/// under valgrind a request takes some hundred times longer. Both run with io_uring denied
/// (`EXAMPLE_DENY_IO_URING=1`): valgrind holds its lock while a thread waits in io_uring_enter, which
/// hangs the monitored service; the event-loop watchdog then looks at idle loops once per threshold.
/// valgrind cannot run an async main's `dispatch_main()` (it crashes in libdispatch's sigsuspend
/// thread): the unmonitored service's main thread runs RunLoop.main instead (`EXAMPLE_MAIN_RUN_LOOP=1`),
/// as the monitored one's runs stallmon's drain; it takes no part in a `/hello` request.
enum HummingbirdInstructionCounts {
    static let requests = (short: 2_000, long: 6_000)
    static let variants: [Variant] = [.unmonitored, .stallmon]

    /// Each variant's count per request, `repeats` times, the order alternating: identical runs
    /// differ by several percent (how the loops' and the pool's threads take turns under valgrind
    /// changes how often each waits and wakes), so one pair cannot resolve a 1 % difference.
    static func measure(
        service: String, valgrind: String, repeats: Int, progress: (String) -> Void
    ) throws -> [Variant: [Double]] {
        let directory = FileManager.default.temporaryDirectory
        let stripped = directory.appendingPathComponent("stallmon-bench-\(getpid())-hummingbird-nodebug")
        defer { try? FileManager.default.removeItem(at: stripped) }
        let executable = try InstructionCounts.strip(service, to: stripped.path)
        var perRequest: [Variant: [Double]] = [:]
        for index in 0..<repeats {
            for variant in index % 2 == 0 ? variants : variants.reversed() {
                perRequest[variant, default: []].append(
                    try count(variant, executable: executable, valgrind: valgrind, progress: progress))
            }
        }
        return perRequest
    }

    /// One variant's instructions per request: two runs, the difference of their totals.
    private static func count(
        _ variant: Variant, executable: String, valgrind: String, progress: (String) -> Void
    ) throws -> Double {
        let directory = FileManager.default.temporaryDirectory
        var totals: [Int: Double] = [:]
        for count in [requests.short, requests.long] {
            let output = directory.appendingPathComponent(
                "stallmon-bench-\(getpid())-hummingbird-\(variant.rawValue)-\(count).callgrind")
            let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
            defer {
                try? FileManager.default.removeItem(at: output)
                try? FileManager.default.removeItem(at: log)
            }
            var environment = ["PORT": "0", "EXAMPLE_PRINT_REPORTS": "1", "EXAMPLE_DENY_IO_URING": "1"]
            if variant == .unmonitored {
                environment["EXAMPLE_STALLMON"] = "off"
                environment["EXAMPLE_MAIN_RUN_LOOP"] = "1"
            }
            let server = try NIOServerChild(
                [
                    valgrind, "--tool=callgrind", "--callgrind-out-file=\(output.path)", "--log-file=\(log.path)",
                    executable,
                ],
                environment: environment, timeout: 180
            )
            defer { server.stop() }
            let connection = try HTTPConnection(port: server.port)
            for _ in 0..<count { _ = try connection.get("/hello") }
            server.stop(grace: 120)
            guard server.process.terminationReason == .exit,
                FileManager.default.fileExists(atPath: output.path)
            else {
                let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
                throw ChildRunner.Failure(
                    description: "the service under valgrind did not exit cleanly: \(text.suffix(2000))")
            }
            totals[count] = try InstructionCounts.total(in: output)
        }
        guard let long = totals[requests.long], let short = totals[requests.short] else {
            throw ChildRunner.Failure(description: "callgrind: no totals")
        }
        let value = (long - short) / Double(requests.long - requests.short)
        progress(
            "callgrind hummingbird hello \(variant.rawValue): \(Report.grouped(value)) instructions/request "
                + "(whole process)")
        return value
    }
}
