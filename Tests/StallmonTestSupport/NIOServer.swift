import Foundation
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// The NIO HTTP server fixture (Sources/StallmonNIOServer) as a child process, driven over loopback
/// by curl, its reports read back from the journal under its own syslog identifier.
package final class NIOServer: Sendable {
    package static let executable = Executable(name: "StallmonNIOServer")

    package let identifier: String
    package let port: Int
    private let running: Executable.Running

    /// Starts the server with a monitor (threshold `thresholdMilliseconds`) on `threads` loops and
    /// waits until it listens.
    /// - Parameter tickDelegate: The group is made with the monitor's metrics delegate (stalls timed
    ///   from tick ends) rather than watched with heartbeats, as a framework's group is.
    package init(threads: Int = 2, thresholdMilliseconds: Int = 100, monitor: Bool = true, tickDelegate: Bool = false)
        throws
    {
        identifier = "stallmon-nio-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        var arguments = ["--port", "0", "--threads", String(threads), "--threshold-ms", String(thresholdMilliseconds)]
        if !monitor { arguments.append("--no-monitor") }
        if tickDelegate { arguments.append("--tick-delegate") }
        running = try Self.executable.start(arguments, environment: ["STALLMON_SYSLOG_IDENTIFIER": identifier])
        guard running.waitForOutput(timeout: 30, { output, _ in output.contains("listening on ") }),
            let line = running.outputSoFar.split(separator: "\n").first(where: { $0.hasPrefix("listening on ") }),
            let port = Int(line.dropFirst("listening on ".count))
        else {
            let result = running.terminate()
            throw Failure(description: "the server did not start: \(result.errors)")
        }
        self.port = port
    }

    package var processID: Int32 { running.process.processIdentifier }

    package struct Failure: Error, CustomStringConvertible {
        package var description: String
    }

    /// One request with curl (a new connection each time); returns the body.
    package func get(_ path: String, timeout: Double = 20) throws -> String {
        String(decoding: try Curl.run(["http://127.0.0.1:\(port)\(path)"], timeout: timeout), as: UTF8.self)
    }

    /// A stalling handler's answer: which loop ran it and how long it measured itself.
    package struct Answer {
        package var handler: String
        package var truthMilliseconds: Double
        package var loop: String
    }

    package func stall(_ path: String) throws -> Answer {
        let body = try get(path)
        guard let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
            let handler = object["handler"] as? String, let truth = object["truth_us"] as? Double,
            let loop = object["loop"] as? String
        else { throw Failure(description: "unexpected answer to \(path): \(body)") }
        return Answer(handler: handler, truthMilliseconds: truth / 1000, loop: loop)
    }

    /// The server's counters: watchdog wakeups, stalls, EINTRs its handlers saw.
    package func stats() throws -> [String: Int] {
        let body = try get("/stats")
        let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Int]
        return try object ?? { throw Failure(description: "unexpected stats: \(body)") }()
    }

    /// Its journal entries with `messageID`, polled until `count` appear.
    package func entries(_ messageID: String, atLeast count: Int = 1, timeout: Double = 10) throws -> [[String: String]]
    {
        try Journald.host.entries(
            ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(messageID)"], atLeast: count, timeout: timeout)
    }

    /// SIGTERM: the monitor stops (every report out) and the server exits.
    @discardableResult
    package func stop() -> Executable.Result {
        running.terminate(grace: 10)
    }
}

/// The HTTP client of the server tests: curl over loopback.
package enum Curl {
    package struct Failure: Error, CustomStringConvertible {
        package var description: String
    }

    /// `curl -s --max-time TIMEOUT ARGUMENTS`; its standard output, or a failure naming the exit status.
    package static func run(_ arguments: [String], timeout: Double) throws -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-s", "--max-time", String(Int(timeout))] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.runWithEmptySignalMask()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw Failure(description: "curl \(arguments.last ?? "") exited with \(process.terminationStatus)")
        }
        return data
    }
}
