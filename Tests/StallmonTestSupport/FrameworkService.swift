import Foundation
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// One of the example services (Examples/: Hummingbird, Vapor, gRPC on their defaults, adopting
/// stallmon as the README shows), one of their fixtures (the same service with the EXAMPLE_*
/// switches the tests and the benchmark need), or a fixture's routes built without stallmon, as a
/// child process, built by `swift build
/// --package-path Examples`.
/// Driven by curl over loopback; its reports read back from the journal under its own identifier.
package final class FrameworkService: Sendable {
    package enum Kind: String, Sendable, CaseIterable, CustomStringConvertible {
        case hummingbird = "HummingbirdService"
        case vapor = "VaporService"
        case grpc = "GRPCService"
        case hummingbirdFixture = "HummingbirdFixture"
        case vaporFixture = "VaporFixture"
        /// The fixtures' routes in services built without stallmon (nothing of it in the binary).
        case hummingbirdWithoutStallmon = "HummingbirdWithoutStallmon"
        case vaporWithoutStallmon = "VaporWithoutStallmon"

        package var description: String { rawValue }
    }

    /// Examples/ of this checkout.
    package static let examples = Repository.root.appendingPathComponent("Examples")

    /// Examples/.build/debug/<service>, when it has been built.
    package static func binary(_ kind: Kind) -> URL? {
        let url = examples.appendingPathComponent(".build/debug/\(kind.rawValue)")
        return FileManager.default.isExecutableFile(atPath: url.path) ? url : nil
    }

    package let kind: Kind
    package let identifier: String
    package let port: Int
    private let running: Executable.Running

    /// Starts the service with stallmon configured by `environment` (`STALLMON_*`), under a syslog
    /// identifier of its own, on a free loopback port, and waits until it listens.
    /// - Parameter inContainer: Whether it runs as in a container: in a mount namespace of its own
    ///   whose `/run` is an empty tmpfs, so that no journald socket is there (needs root and
    ///   util-linux's `unshare`; ``canRunInContainer``).
    package init(_ kind: Kind, binary: URL, environment: [String: String], inContainer: Bool = false) throws {
        self.kind = kind
        identifier = "stallmon-\(kind.rawValue.prefix(4).lowercased())-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let process = Process()
        if inContainer {
            // unshare and sh exec the service: its pid is the process's.
            process.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
            process.arguments = [
                "--mount", "--propagation", "private", "/bin/sh", "-c",
                "mount -t tmpfs -o mode=0755 tmpfs /run && exec \"$0\"", binary.path,
            ]
        } else {
            process.executableURL = binary
            process.arguments = []
        }
        process.environment = ProcessInfo.processInfo.environment.merging(
            environment.merging(["STALLMON_SYSLOG_IDENTIFIER": identifier, "PORT": "0"]) { $1 }
        ) { $1 }
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.runWithEmptySignalMask()
        running = Executable.Running(process: process, output: output, errors: errors)
        guard running.waitForOutput(timeout: 30, { output, _ in Self.listeningPort(output) != nil }),
            let port = Self.listeningPort(running.outputSoFar)
        else {
            let result = running.terminate(grace: 5)
            throw Failure(description: "\(kind) did not start (exit \(result.status)): \(result.errors.suffix(3000))")
        }
        self.port = port
    }

    /// Whether ``init(_:binary:environment:inContainer:)`` can run a service as in a container here.
    package static var canRunInContainer: Bool {
        geteuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare")
    }

    package var processID: Int32 { running.process.processIdentifier }
    package var outputSoFar: String { running.outputSoFar }
    package var errorsSoFar: String { running.errorsSoFar }

    package struct Failure: Error, CustomStringConvertible {
        package var description: String
    }

    /// The JSON objects the service printed so far, one a line.
    package var lines: [[String: Any]] {
        Self.lines(running.outputSoFar)
    }

    package static func lines(_ output: String) -> [[String: Any]] {
        output.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
    }

    package static func listeningPort(_ output: String) -> Int? {
        lines(output).first { $0["event"] as? String == "listening" }.flatMap { ($0["port"] as? NSNumber)?.intValue }
            .flatMap { $0 > 0 ? $0 : nil }
    }

    /// An HTTP GET over loopback, a new connection each time; returns the body.
    package func get(_ path: String, headers: [String: String] = [:], timeout: Double = 20) throws -> String {
        let headerArguments = headers.sorted { $0.key < $1.key }.flatMap { ["-H", "\($0.key): \($0.value)"] }
        return String(
            decoding: try Curl.run(headerArguments + ["http://127.0.0.1:\(port)\(path)"], timeout: timeout),
            as: UTF8.self)
    }

    /// A unary call of the gRPC service's `method` over HTTP/2 without TLS (curl, prior knowledge),
    /// the request `{"milliseconds":N}` in gRPC's length-prefixed framing; returns the response
    /// message, or a failure when there is none (the gRPC status is in the trailers).
    package func call(_ method: String, milliseconds: Int, timeout: Double = 20) throws -> String {
        let message = Data("{\"milliseconds\":\(milliseconds)}".utf8)
        var framed = Data([0])
        withUnsafeBytes(of: UInt32(message.count).bigEndian) { framed.append(contentsOf: $0) }
        framed.append(message)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-grpc-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try framed.write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let response = try Curl.run(
            [
                "--http2-prior-knowledge", "-X", "POST", "-H", "content-type: application/grpc", "-H", "te: trailers",
                "--data-binary", "@\(file.path)", "http://127.0.0.1:\(port)/stallmon.examples.Stalls/\(method)",
            ], timeout: timeout)
        guard response.count > 5 else { throw Failure(description: "\(method): no response message") }
        return String(decoding: response.dropFirst(5), as: UTF8.self)
    }

    /// What a stalling handler measured (ExampleStalls' `StallAnswer`).
    package struct Answer: CustomStringConvertible {
        package var handler: String
        package var truthMilliseconds: Double
        package var thread: String
        package var tid: Int
        package var mainThread: Bool

        package var description: String { "\(handler) on \(thread) (\(tid)): \(truthMilliseconds) ms" }

        package init(_ body: String) throws {
            guard let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
                let handler = object["handler"] as? String, let truth = (object["truth_us"] as? NSNumber)?.doubleValue,
                let thread = object["thread"] as? String, let tid = (object["tid"] as? NSNumber)?.intValue
            else { throw Failure(description: "unexpected answer: \(body)") }
            self.handler = handler
            self.truthMilliseconds = truth / 1000
            self.thread = thread
            self.tid = tid
            self.mainThread = object["main_thread"] as? Bool ?? false
        }
    }

    /// Its journal entries with `messageID`, polled until `count` appear.
    package func entries(_ messageID: String, atLeast count: Int = 1, timeout: Double = 10) throws -> [[String: String]]
    {
        try Journald.host.entries(
            ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(messageID)"], atLeast: count, timeout: timeout)
    }

    /// Voluntary plus involuntary context switches of each thread so far, by `name (tid)`: a
    /// thread cannot wake without one.
    package var contextSwitches: [String: Int] {
        var counts: [String: Int] = [:]
        for thread in threads {
            guard
                let status = try? String(
                    contentsOfFile: "/proc/\(processID)/task/\(thread.tid)/status", encoding: .utf8)
            else { continue }
            counts["\(thread.name) (\(thread.tid))"] = status.split(separator: "\n")
                .filter { $0.contains("ctxt_switches") }
                .compactMap { $0.split(separator: "\t").last.flatMap { Int($0.trimmingCharacters(in: .whitespaces)) } }
                .reduce(0, +)
        }
        return counts
    }

    /// Every thread of the service: its kernel name and id.
    private var threads: [(name: String, tid: Int)] {
        let pid = processID
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.compactMap(Int.init).sorted().compactMap { tid in
            (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8)).map {
                ($0.trimmingCharacters(in: .newlines), tid)
            }
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited after 10 s.
    @discardableResult
    package func stop() -> Executable.Result {
        running.terminate(grace: 10)
    }
}
