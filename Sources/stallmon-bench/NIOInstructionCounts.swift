import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Instructions per `/hello` request of the whole StallmonNIOServer process (its event loop, and
/// the group watchdog when monitored), counted by callgrind: the server runs twice per variant,
/// answering different numbers of requests on one keep-alive connection, and the difference
/// cancels start-up and shutdown. Both run with io_uring denied (`--deny-io-uring`): valgrind holds
/// its lock while a thread waits in io_uring_enter, which hangs the monitored server, so under it the
/// group watchdog looks at the idle loop once per threshold instead (its wakeups are part of the count).
enum NIOInstructionCounts {
    static let requests = (short: 2_000, long: 6_000)
    static let variants: [Variant] = [.unmonitored, .stallmon]

    static func measure(server: String, valgrind: String, progress: (String) -> Void) throws -> [Variant: Double] {
        let directory = FileManager.default.temporaryDirectory
        let stripped = directory.appendingPathComponent("stallmon-bench-\(getpid())-nio-nodebug")
        defer { try? FileManager.default.removeItem(at: stripped) }
        let executable = try InstructionCounts.strip(server, to: stripped.path)
        var perRequest: [Variant: Double] = [:]
        for variant in variants {
            var totals: [Int: Double] = [:]
            for count in [requests.short, requests.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-nio-\(variant.rawValue)-\(count).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    try? FileManager.default.removeItem(at: output)
                    try? FileManager.default.removeItem(at: log)
                }
                let server = try NIOServerChild(
                    [
                        valgrind, "--tool=callgrind", "--callgrind-out-file=\(output.path)", "--log-file=\(log.path)",
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
                totals[count] = try InstructionCounts.total(in: output)
            }
            if let long = totals[requests.long], let short = totals[requests.short] {
                perRequest[variant] = (long - short) / Double(requests.long - requests.short)
                progress(
                    "callgrind nio hello \(variant.rawValue): \(Report.grouped(perRequest[variant]!)) "
                        + "instructions/request (whole process)")
            }
        }
        return perRequest
    }
}
