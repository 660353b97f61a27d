import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// StallmonNIOServer (built next to this executable, so that the benchmark never links SwiftNIO) as
/// a child process: started, read until it listens, stopped with SIGTERM.
final class NIOServerChild: @unchecked Sendable {
    static let executableName = "StallmonNIOServer"

    /// The server next to this executable, or an error that says how to build it.
    static func executablePath() throws -> String {
        let path = URL(fileURLWithPath: ChildRunner.executablePath).deletingLastPathComponent()
            .appendingPathComponent(executableName).path
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw ChildRunner.Failure(
                description: "\(path) is missing: build it with `swift build -c release --product \(executableName)`, "
                    + "or skip the SwiftNIO benchmark with --no-nio")
        }
        return path
    }

    let process = Process()
    private(set) var port = 0
    private let lock = NSLock()
    private var output = Data()
    private let reader = DispatchGroup()
    private let errorLog: URL

    /// Starts `command` (the server, or a wrapper followed by the server and its arguments), with
    /// no STALLMON_ variables of this environment, and waits until it listens.
    init(_ command: [String], environment: [String: String] = [:], timeout: Double = 30) throws {
        var inherited = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("STALLMON_") }
        inherited.merge(environment) { $1 }
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        process.environment = inherited
        let pipe = Pipe()
        process.standardOutput = pipe
        errorLog = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-bench-\(getpid())-nio-server.stderr")
        _ = FileManager.default.createFile(atPath: errorLog.path, contents: nil)
        let errors = try FileHandle(forWritingTo: errorLog)
        defer { try? errors.close() }
        process.standardError = errors
        try process.run()
        let handle = pipe.fileHandleForReading
        reader.enter()
        Thread.detachNewThread { [self] in
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                lock.withLock { output.append(chunk) }
            }
            reader.leave()
        }
        let deadline = Date(timeIntervalSinceNow: timeout)
        var port: Int?
        while port == nil, process.isRunning, Date() < deadline {
            usleep(5_000)
            port = text.split(separator: "\n").lazy.compactMap(Self.listeningPort).first
        }
        guard let port else {
            let errors = (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
            _ = stop()
            throw ChildRunner.Failure(
                description: "\(command.joined(separator: " ")) did not start listening: \(errors.suffix(2000))")
        }
        self.port = port
    }

    deinit {
        try? FileManager.default.removeItem(at: errorLog)
    }

    /// The port of StallmonNIOServer's `listening on N`, or of the example services'
    /// `{"event":"listening","port":N}`.
    static func listeningPort(_ line: Substring) -> Int? {
        if line.hasPrefix("listening on ") { return Int(line.dropFirst("listening on ".count)) }
        guard line.hasPrefix("{"), line.contains("\"event\":\"listening\""),
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        else { return nil }
        return (object["port"] as? NSNumber)?.intValue
    }

    /// Standard output so far.
    var text: String { lock.withLock { String(decoding: output, as: UTF8.self) } }

    /// SIGTERM (the monitor writes every report out), then SIGKILL after `grace` seconds; returns
    /// the whole standard output.
    @discardableResult
    func stop(grace: Double = 20) -> String {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date(timeIntervalSinceNow: grace)
            while process.isRunning, Date() < deadline { usleep(2_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        process.waitUntilExit()
        reader.wait()
        return text
    }

    /// The kernel id of the server's thread named `name` (`stallmon-nio`: the group's watchdog).
    func thread(named name: String) -> Int32? {
        threads().first { $0.value == name }?.key
    }

    /// The server's threads now: kernel id → name (`comm`).
    func threads() -> [Int32: String] {
        let pid = process.processIdentifier
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        var threads: [Int32: String] = [:]
        for tid in tasks.compactMap({ Int32($0) }) {
            threads[tid] = Kernel.contents(of: "/proc/\(pid)/task/\(tid)/comm")?.trimmingCharacters(in: .newlines)
        }
        return threads
    }

    /// CPU time of all the server's threads (`/proc/PID/task/*/schedstat`), in nanoseconds.
    func cpuNanoseconds() -> UInt64 { Kernel.cpuNanoseconds(ofProcess: process.processIdentifier) }

    /// Voluntary context switches of one of the server's threads: a watchdog that sleeps between
    /// looks makes one each time it goes back to sleep, i.e. one per wakeup (preemptions, which
    /// are not wakeups, are the involuntary ones).
    func voluntarySwitches(ofThread tid: Int32) -> Int? {
        guard let status = Kernel.contents(of: "/proc/\(process.processIdentifier)/task/\(tid)/status") else {
            return nil
        }
        for line in status.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches:") {
            return Int(line.dropFirst("voluntary_ctxt_switches:".count).trimmingCharacters(in: .whitespaces))
        }
        return nil
    }
}

/// One keep-alive HTTP/1.1 connection to the server on loopback, one request at a time.
final class HTTPConnection {
    private let descriptor: Int32
    private var buffer: [UInt8] = []

    init(port: Int) throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw ChildRunner.Failure(description: "socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(UInt32(0x7f00_0001).bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let error = errno
            close(descriptor)
            throw ChildRunner.Failure(description: "connect to 127.0.0.1:\(port): errno \(error)")
        }
        var one: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit {
        close(descriptor)
    }

    /// GET `path`; returns the body.
    func get(_ path: String) throws -> String {
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        var sent = 0
        while sent < request.count {
            let count = request[sent...].withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { throw ChildRunner.Failure(description: "send \(path): errno \(errno)") }
            sent += count
        }
        let separator = Array("\r\n\r\n".utf8)
        var headerEnd: Int?
        while true {
            if headerEnd == nil, let range = buffer.firstRange(of: separator) { headerEnd = range.upperBound }
            if let end = headerEnd {
                let head = String(decoding: buffer[..<end], as: UTF8.self)
                guard head.hasPrefix("HTTP/1.1 200") else {
                    throw ChildRunner.Failure(description: "GET \(path): \(head.prefix(100))")
                }
                let length =
                    head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }.flatMap {
                        Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
                    } ?? 0
                if buffer.count >= end + length {
                    let body = String(decoding: buffer[end..<(end + length)], as: UTF8.self)
                    buffer.removeFirst(end + length)
                    return body
                }
            }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                throw ChildRunner.Failure(description: "GET \(path): connection closed (errno \(errno))")
            }
            buffer.append(contentsOf: chunk[..<count])
        }
    }
}
