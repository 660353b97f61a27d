import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Instructions per `/hello` request of the whole StallmonNIOServer process (its event loop, and
/// the group watchdog when monitored), and of its event loop thread alone, counted by callgrind:
/// the server runs twice per variant, answering different numbers of requests on one keep-alive
/// connection, and the difference cancels start-up and shutdown. The loop's own figure is the cost
/// a request pays: the rest of the process also counts work that comes with time rather than with
/// requests (the watchdog's looks, and whatever the main thread does while valgrind slows it all). Both run with io_uring denied (`--deny-io-uring`): valgrind holds
/// its lock while a thread waits in io_uring_enter, which hangs the monitored server, so under it the
/// group watchdog looks at the idle loop once per threshold instead (its wakeups are part of the count).
enum NIOInstructionCounts {
    static let requests = (short: 2_000, long: 6_000)
    static let variants: [Variant] = [.unmonitored, .stallmon]

    struct PerRequest {
        var process: [Variant: Double] = [:]
        var loop: [Variant: Double] = [:]
    }

    static func measure(server: String, valgrind: String, progress: (String) -> Void) throws -> PerRequest {
        let directory = FileManager.default.temporaryDirectory
        let stripped = directory.appendingPathComponent("stallmon-bench-\(getpid())-nio-nodebug")
        defer { try? FileManager.default.removeItem(at: stripped) }
        let executable = try InstructionCounts.strip(server, to: stripped.path)
        var perRequest = PerRequest()
        for variant in variants {
            var totals: [Int: (process: Double, loop: Double?)] = [:]
            for count in [requests.short, requests.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-nio-\(variant.rawValue)-\(count).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    try? FileManager.default.removeItem(at: output)  // empty beside the threads' files
                    for file in threadFiles(output) { try? FileManager.default.removeItem(atPath: file) }
                    try? FileManager.default.removeItem(at: log)
                }
                let server = try NIOServerChild(
                    [
                        valgrind, "--tool=callgrind", "--separate-threads=yes", "--callgrind-out-file=\(output.path)",
                        "--log-file=\(log.path)",
                        executable, "--port", "0", "--threads", "1", "--print-reports", "--deny-io-uring",
                    ] + (variant == .stallmon ? [] : ["--no-monitor"]),
                    timeout: 120
                )
                defer { server.stop() }
                let connection = try HTTPConnection(port: server.port)
                for _ in 0..<count { _ = try connection.get("/hello") }
                server.stop(grace: 120)
                guard server.process.terminationReason == .exit, server.process.terminationStatus == 0 else {
                    let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
                    throw ChildRunner.Failure(
                        description: "the server under valgrind did not exit cleanly: \(text.suffix(2000))")
                }
                totals[count] = try threadTotals(output)
            }
            if let long = totals[requests.long], let short = totals[requests.short] {
                let difference = Double(requests.long - requests.short)
                let process = (long.process - short.process) / difference
                perRequest.process[variant] = process
                if let longLoop = long.loop, let shortLoop = short.loop {
                    perRequest.loop[variant] = (longLoop - shortLoop) / difference
                }
                progress(
                    "callgrind nio hello \(variant.rawValue): \(Report.grouped(process)) instructions/request "
                        + "(whole process), \(perRequest.loop[variant].map(Report.grouped) ?? "n/a") on the event loop")
            }
        }
        return perRequest
    }

    /// callgrind's files of one run, one per thread (`<output>-01`, `-02`, …).
    private static func threadFiles(_ output: URL) -> [String] {
        let directory = output.deletingLastPathComponent().path
        let prefix = output.lastPathComponent
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.filter { $0.hasPrefix(prefix + "-") }.map { directory + "/" + $0 }
    }

    /// The run's instructions, all threads together, and those of the thread that ran the event
    /// loop (the one whose profile holds `SelectableEventLoop.run`).
    private static func threadTotals(_ output: URL) throws -> (process: Double, loop: Double?) {
        var process = 0.0
        var loop: Double?
        for file in threadFiles(output) {
            let url = URL(fileURLWithPath: file)
            let total = try InstructionCounts.total(in: url)
            process += total
            let text = try String(contentsOf: url, encoding: .utf8)
            if text.contains("SelectableEventLoopC3run") { loop = total }
        }
        guard process > 0 else { throw ChildRunner.Failure(description: "no callgrind output at \(output.path)") }
        return (process, loop)
    }
}
