import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// stallmond, built next to this executable (`stallmond` and the `stallmond-daemon` it executes in
/// its place), as a child process watching one executable from outside with a scratch
/// configuration: its metrics, state and log in a directory of its own, removed at ``stop()``.
final class WatchDaemon {
    static let executableNames = ["stallmond", "stallmond-daemon"]

    /// `stallmond` next to this executable, or `nil` when it or `stallmond-daemon` is missing.
    static func executablePath() -> String? {
        let directory = URL(fileURLWithPath: ChildRunner.executablePath).deletingLastPathComponent()
        let paths = executableNames.map { directory.appendingPathComponent($0).path }
        return paths.allSatisfy(FileManager.default.isExecutableFile) ? paths[0] : nil
    }

    let process = Process()
    private let directory: URL
    private let log: URL

    /// Starts `stallmond` with `watch` [`executable`] and `watch_threshold_ms` `threshold`; the
    /// collector counts only what is written from its start on, and writes no digest.
    init(_ stallmond: String, watching executable: String, thresholdMilliseconds threshold: Int) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-bench-\(getpid())-stallmond-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let configuration = directory.appendingPathComponent("stallmond.json")
        let json =
            #"{"metrics_path": "\#(directory.path)/stallmon.prom", "metrics_interval_s": 1, "cold_start_entries": 0, "#
            + #""state_directory": "\#(directory.path)/state", "digest_interval_s": 0, "watch": ["\#(executable)"], "#
            + #""watch_threshold_ms": \#(threshold)}"#
        try json.write(to: configuration, atomically: true, encoding: .utf8)
        log = directory.appendingPathComponent("stallmond.log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        let output = try FileHandle(forWritingTo: log)
        defer { try? output.close() }
        process.executableURL = URL(fileURLWithPath: stallmond)
        process.arguments = ["--config", configuration.path]
        process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("STALLMON_") }
        process.standardOutput = output
        process.standardError = output
        try process.run()
    }

    deinit {
        stop()
    }

    var pid: Int32 { process.processIdentifier }

    /// What stallmond logged so far.
    var logText: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Waits until stallmond's log says it watches process `pid` (`watching a process from outside
    /// pid=N`); throws with its log when it does not within `timeout` seconds (no BPF, no tracefs).
    func waitUntilWatching(_ pid: Int32, timeout: Double = 15) throws {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while Date() < deadline {
            if logText.contains("pid=\(pid) ") || logText.hasSuffix("pid=\(pid)") { return }
            if !process.isRunning { break }
            usleep(10_000)
        }
        throw ChildRunner.Failure(description: "stallmond did not watch process \(pid): \(logText.suffix(2000))")
    }

    /// CPU time of all stallmond's threads, in nanoseconds.
    func cpuNanoseconds() -> UInt64 { Kernel.cpuNanoseconds(ofProcess: pid) }

    /// SIGTERM, then SIGKILL after 10 s; its directory is removed. Its BPF programs go with it.
    func stop() {
        if process.isRunning {
            kill(pid, SIGTERM)
            let deadline = Date(timeIntervalSinceNow: 10)
            while process.isRunning, Date() < deadline { usleep(2_000) }
            if process.isRunning { kill(pid, SIGKILL) }
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// journald, where stallmond writes what it sees from outside: the host's, or one started here when
/// none listens (as the tests' `Journald.host` does), stopped by its PID at the end.
enum BenchJournal {
    static let socketPath = "/run/systemd/journal/socket"
    static let journald = "/lib/systemd/systemd-journald"

    /// Whether a datagram socket connects to journald's socket (a journald that exited leaves its
    /// socket behind, which refuses every datagram).
    static var listens: Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { bytes in
            for (index, byte) in socketPath.utf8.enumerated() where index < bytes.count - 1 { bytes[index] = byte }
        }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }

    /// `nil` when journald listens already; otherwise the journald started here (stop it with
    /// ``stop(_:)``), or an error when it cannot start.
    static func ensureListening() throws -> Process? {
        if listens { return nil }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: journald)
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        for _ in 0..<100 where !listens { usleep(50_000) }
        guard listens else {
            stop(process)
            throw ChildRunner.Failure(description: "\(journald) started but does not listen on \(socketPath)")
        }
        return process
    }

    static func stop(_ process: Process) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }

    /// An entry stallmond wrote from outside, as `journalctl -o json` gives it.
    struct Entry {
        var event: String
        var stallID: String
        /// When journald received it (`__MONOTONIC_TIMESTAMP`: CLOCK_MONOTONIC, as the handlers' times).
        var receivedNanoseconds: UInt64
        var durationMicroseconds: Double
        var tid: Int
    }

    /// The entries with `STALL_SOURCE=external` and `OBJECT_PID=pid` of this boot that journald
    /// received at `since` (CLOCK_MONOTONIC) or later: a process of an earlier run may have had
    /// that PID.
    static func externalEntries(of pid: Int32, since: UInt64) throws -> [Entry] {
        let bootID = (Kernel.contents(of: "/proc/sys/kernel/random/boot_id") ?? "")
            .trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "-", with: "")
        // The realtime clock only narrows what journalctl reads; the monotonic one decides.
        let elapsed = Double(Kernel.now() - min(since, Kernel.now())) / 1e9
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        process.arguments = [
            "-o", "json", "--no-pager", "--since", "@\(Int(Date().timeIntervalSince1970 - elapsed) - 5)",
            "--output-fields", "_BOOT_ID,STALL_EVENT,STALL_ID,STALL_DURATION_USEC,STALL_THREAD_TID",
            "STALL_SOURCE=external", "OBJECT_PID=\(pid)",
        ]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return data.split(separator: UInt8(ascii: "\n")).compactMap { line in
            guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any],
                (object["_BOOT_ID"] as? String) == bootID,
                let received = (object["__MONOTONIC_TIMESTAMP"] as? String).flatMap({ UInt64($0) }),
                received * 1000 >= since,
                let event = object["STALL_EVENT"] as? String, let stallID = object["STALL_ID"] as? String
            else { return nil }
            return Entry(
                event: event, stallID: stallID, receivedNanoseconds: received * 1000,
                durationMicroseconds: (object["STALL_DURATION_USEC"] as? String).flatMap(Double.init) ?? .nan,
                tid: (object["STALL_THREAD_TID"] as? String).flatMap { Int($0) } ?? 0)
        }
    }
}
