import ArgumentParser
import Foundation
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `stallmon demo --nio`: runs the SwiftNIO HTTP server (StallmonNIOServer, built next to stallmon,
/// so that the CLI itself never links NIO), sends it three stalling requests over loopback, and
/// prints what its monitor reported, read back from the journal when journald runs.
struct NIODemo {
    var stallMilliseconds: Int
    var configurationFile: String?
    var json: Bool

    static let serverName = "StallmonNIOServer"

    func run() throws {
        let server = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
            .deletingLastPathComponent().appendingPathComponent(Self.serverName)
        guard FileManager.default.isExecutableFile(atPath: server.path) else {
            fail("\(server.path) is missing: build it with swift build --product \(Self.serverName)")
            throw ExitStatus.unavailable
        }
        let identifier = "stallmon-demo-nio"
        let process = Process()
        process.executableURL = server
        process.arguments = ["--port", "0", "--threads", "2"]
        var environment = ProcessInfo.processInfo.environment
        environment["STALLMON_SYSLOG_IDENTIFIER"] = identifier
        if let configurationFile { environment["STALLMON_CONFIG"] = configurationFile }
        process.environment = environment
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let collected = ErrorOutput(errors)

        guard let port = Self.port(from: output) else {
            process.waitUntilExit()
            fail("the server did not start: \(collected.text)")
            throw process.terminationStatus == 78 ? ExitStatus.configuration : ExitStatus.software
        }
        print("stallmon demo --nio: server pid \(process.processIdentifier) on 127.0.0.1:\(port), 2 event loops")
        let requests = [
            ("a handler computes on the CPU", "/cpu"), ("a handler sleeps in a blocking system call", "/sleep"),
            ("a handler waits for a lock another thread holds", "/lock"),
        ]
        var answered = 0
        for (index, (what, path)) in requests.enumerated() {
            let target = "\(path)?ms=\(stallMilliseconds)"
            print("  \(index + 1). GET \(target): \(what)…")
            do {
                let body = try HTTPClient.get(port: port, path: target)
                print("     answered: \(body.trimmingCharacters(in: .whitespacesAndNewlines))")
                answered += 1
            } catch {
                print("     failed: \(error)")
            }
        }
        // SIGTERM: the server's monitor stops and writes every report before it exits.
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()

        let pid = process.processIdentifier
        if JournalWriter().isAvailable {
            let records = try Self.readBack(pid: pid, expected: requests.count)
            print("\n\(records.count) stall\(records.count == 1 ? "" : "s") reported, read back from the journal:\n")
            for (index, record) in records.enumerated() { print(record, index: index, json: json) }
            print("See them with: journalctl MESSAGE_ID=\(MessageID.stallEnded) _PID=\(pid)")
            guard records.count == requests.count, answered == requests.count else { throw ExitStatus.software }
        } else {
            // The ended reports (`stalled 401 ms`), not the detected ones (`stalled for 250 ms`).
            let lines = collected.text.split(separator: "\n").filter {
                $0.contains(" stalled ") && !$0.contains(" stalled for ")
            }
            print("\nReported (journald is not running; the server's standard error):\n")
            for line in lines { print(DisplayText.escaped(String(line))) }
            guard lines.count == requests.count, answered == requests.count else { throw ExitStatus.software }
        }
    }

    private func print(_ record: StallRecord, index: Int, json: Bool) {
        if json {
            Swift.print(JSONLines.encode(record.fields))
            return
        }
        Swift.print("\(index + 1). \(DisplayText.escaped(record.message))")
        Swift.print(
            DisplayText.escaped(
                "   loop \(record.loop), callout \(record.callout), thread \(record.threadState)"
                    + (record.threadSyscall.isEmpty ? "" : " in \(record.threadSyscall)"))
                + ", cpu \(record.cpuMicroseconds / 1000) ms, \(record.stackSamples)/\(record.samples) samples")
        let lines = record.backtrace.split(separator: "\n")
        let culprit = lines.firstIndex { $0.contains(record.frame.split(separator: " (").first ?? "") } ?? 0
        for line in lines[culprit...].prefix(4) { Swift.print("   \(DisplayText.escaped(String(line)))") }
        Swift.print("")
    }

    private func print(_ text: String) { Swift.print(text) }

    private func fail(_ message: String) {
        FileHandle.standardError.write(Data("stallmon demo --nio: \(message)\n".utf8))
    }

    /// The port from the server's `listening on <port>` line (30 s at most).
    private static func port(from output: Pipe) -> Int? {
        var text = ""
        let deadline = Date(timeIntervalSinceNow: 30)
        let handle = output.fileHandleForReading
        while Date() < deadline, !text.contains("\n") {
            let data = handle.availableData
            if data.isEmpty { return nil }
            text += String(decoding: data, as: UTF8.self)
        }
        guard let line = text.split(separator: "\n").first, line.hasPrefix("listening on ") else { return nil }
        return Int(line.dropFirst("listening on ".count))
    }

    private static func readBack(pid: Int32, expected: Int) throws -> [StallRecord] {
        let deadline = Date(timeIntervalSinceNow: 5)
        var records: [StallRecord] = []
        repeat {
            let reader = try JournalReader()
            try reader.addMatch("MESSAGE_ID", MessageID.stallEnded)
            try reader.addMatch("_PID", String(pid))
            try reader.seekHead()
            records = []
            while let entry = try reader.next() { records.append(try StallRecord(journalFields: entry.fields)) }
            if records.count >= expected { break }
            usleep(100_000)
        } while Date() < deadline
        return records
    }
}

/// Collects what a child writes to standard error, as it comes.
private final class ErrorOutput: Sendable {
    private let data = Mutex(Data())

    init(_ pipe: Pipe) {
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let chunk = handle.availableData
            self?.data.withLock { $0.append(chunk) }
        }
    }

    var text: String { data.withLock { String(decoding: $0, as: UTF8.self) } }
}

/// A minimal HTTP/1.1 client over a loopback TCP socket: one GET, `Connection: close`, the body.
enum HTTPClient {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static func get(port: Int, path: String, timeout: Int = 60) throws -> String {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        defer { close(descriptor) }
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw Failure(description: "connect to 127.0.0.1:\(port): errno \(errno)") }
        let request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n"
        let sent = request.utf8CString.withUnsafeBufferPointer { send(descriptor, $0.baseAddress, $0.count - 1, 0) }
        guard sent == request.utf8.count else { throw Failure(description: "send: errno \(errno)") }
        var response = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count < 0, errno == EINTR { continue }
            guard count >= 0 else { throw Failure(description: "recv: errno \(errno)") }
            if count == 0 { break }
            response.append(contentsOf: buffer[0..<count])
        }
        let text = String(decoding: response, as: UTF8.self)
        guard text.hasPrefix("HTTP/1.1 200"), let separator = text.range(of: "\r\n\r\n") else {
            throw Failure(description: "unexpected response: \(text.prefix(80))")
        }
        return String(text[separator.upperBound...])
    }
}
