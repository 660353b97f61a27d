import Foundation
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// A journald of the test's own: `/lib/systemd/systemd-journald NAMESPACE` (what `LogNamespace=`
/// starts) listens on `/run/systemd/journal.NAMESPACE/socket` and writes its own journal files, read
/// back with `journalctl --namespace`. A test can write hostile entries that no other test's
/// `stallmon report` reads, and kill, stop and restart it without touching the journald other tests
/// share. ``remove()`` kills it and deletes its socket folder and journal files.
final class JournalNamespace: @unchecked Sendable {
    let name: String
    private var process: Process?

    init() {
        // Namespace names are file-name-safe words; a fresh one per test keeps runs apart.
        name = "stallmontest\(getpid())x\(UInt32.random(in: 0...UInt32.max))"
    }

    var socketPath: String { "/run/systemd/journal.\(name)/socket" }

    /// The folder of its journal files (`<machine-id>.<namespace>` under `/var/log/journal`, or
    /// `/run/log/journal` without persistent storage), once journald made it.
    var directory: String? {
        let machineID = (try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard let machineID else { return nil }
        return ["/var/log/journal", "/run/log/journal"].map { "\($0)/\(machineID).\(name)" }.first {
            FileManager.default.fileExists(atPath: $0)
        }
    }

    /// Starts journald and waits until it takes a datagram; false when it cannot (not root).
    func start() -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/lib/systemd/systemd-journald")
        process.arguments = [name]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return false }
        self.process = process
        for _ in 0..<100 {
            if listens { return true }
            usleep(50_000)
        }
        return false
    }

    /// Starts its journald unless one listens (a namespace's journald exits when idle).
    func ensureRunning() -> Bool {
        if listens { return true }
        if let process, !process.isRunning { self.process = nil }
        return start()
    }

    /// Whether a datagram socket connects to journald's socket.
    var listens: Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(descriptor) }
        return JournalWriter.withSocketAddress(socketPath) { connect(descriptor, $0, $1) } == 0
    }

    /// Sends `signal` to journald; SIGKILL also waits until it is gone (its socket file stays).
    func signal(_ signal: Int32) {
        guard let process else { return }
        kill(process.processIdentifier, signal)
        if signal == SIGKILL {
            process.waitUntilExit()
            self.process = nil
        }
    }

    /// Fills the socket's queue (`net.unix.max_dgram_qlen` datagrams) of a stopped journald, so
    /// that the next sender would wait; returns how many datagrams it sent.
    func fillQueue() -> Int {
        let descriptor = socket(
            AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        defer { close(descriptor) }
        guard JournalWriter.withSocketAddress(socketPath, { connect(descriptor, $0, $1) }) == 0 else { return 0 }
        let entry = Array("MESSAGE=filler\nSYSLOG_IDENTIFIER=stallmon-test-filler\n".utf8)
        var sent = 0
        while sent < 10_000, entry.withUnsafeBytes({ Glibc.send(descriptor, $0.baseAddress, $0.count, 0) }) >= 0 {
            sent += 1
        }
        return sent
    }

    /// Kills journald and removes its socket folder and journal files.
    func remove() {
        if process != nil {
            signal(SIGCONT)
            signal(SIGKILL)
        }
        try? FileManager.default.removeItem(atPath: "/run/systemd/journal.\(name)")
        let machineID = (try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
        if let machineID {
            for root in ["/var/log/journal", "/run/log/journal"] {
                try? FileManager.default.removeItem(atPath: "\(root)/\(machineID).\(name)")
            }
        }
    }

    /// Sends one entry, every field in the binary-safe form of the native protocol.
    func send(_ fields: [(String, String)]) throws {
        guard ensureRunning() else { throw POSIXError(.ECONNREFUSED) }
        var datagram = [UInt8]()
        for (name, value) in fields {
            datagram.append(contentsOf: name.utf8)
            datagram.append(UInt8(ascii: "\n"))
            var length = UInt64(value.utf8.count).littleEndian
            withUnsafeBytes(of: &length) { datagram.append(contentsOf: $0) }
            datagram.append(contentsOf: value.utf8)
            datagram.append(UInt8(ascii: "\n"))
        }
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw POSIXError(.EIO) }
        defer { close(descriptor) }
        var size: Int32 = 8 << 20
        _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDBUFFORCE, &size, socklen_t(MemoryLayout<Int32>.size))
        let sent = JournalWriter.withSocketAddress(socketPath) { address, length in
            datagram.withUnsafeBytes { sendto(descriptor, $0.baseAddress, $0.count, 0, address, length) }
        }
        guard sent == datagram.count else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    }

    /// Waits until `journalctl --namespace` shows at least `count` entries with `MESSAGE_ID`s of
    /// `messageIDs`.
    func waitForEntries(_ count: Int, messageIDs: [String], timeout: Double = 10) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        repeat {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
            process.arguments =
                ["--namespace", name, "-o", "cat", "--output-fields=MESSAGE_ID", "--no-pager"]
                + messageIDs.flatMap { ["MESSAGE_ID=\($0)"] }
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            guard (try? process.run()) != nil else { return false }
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            if String(decoding: data, as: UTF8.self).split(separator: "\n").count >= count { return true }
            usleep(100_000)
        } while Date() < deadline
        return false
    }

    /// `journalctl --namespace NAME -o json --all` for the matches, polled until `count` entries
    /// appear or `timeout` passes.
    func entries(_ matches: [String], atLeast count: Int = 1, timeout: Double = 10) throws -> [[String: String]] {
        try Journald.entries(matches, atLeast: count, timeout: timeout, options: ["--namespace", name, "--all"])
    }
}
