import Foundation
import StallJournal

#if canImport(Glibc)
    import Glibc
#endif

/// A journald of its own namespace (`systemd-journald NAME`, what `LogNamespace=` starts), so a
/// test can write hostile entries that no other test's `stallmon report` reads. Entries go over
/// journald's native protocol, so they carry any field, any bytes, any length. ``remove()`` stops
/// it and deletes its journal files.
final class JournalNamespace {
    let name: String
    private var pid: pid_t = 0

    init() {
        name = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    }

    var socketPath: String { "/run/systemd/journal.\(name)/socket" }

    /// Starts its journald unless one listens (a namespace's journald exits when idle).
    func ensureRunning() -> Bool {
        if connects() { return true }
        if pid > 0 {
            var status: Int32 = 0
            _ = waitpid(pid, &status, WNOHANG)
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/lib/systemd/systemd-journald")
        process.arguments = [name]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return false }
        pid = process.processIdentifier
        for _ in 0..<100 {
            if connects() { return true }
            usleep(50_000)
        }
        return false
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

    /// Stops its journald and deletes its journal files and sockets.
    func remove() {
        if pid > 0, kill(pid, SIGTERM) == 0 {
            for _ in 0..<100 {
                var status: Int32 = 0
                if waitpid(pid, &status, WNOHANG) != 0 { break }
                usleep(50_000)
            }
        }
        let machine =
            (try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        for path in [
            "/var/log/journal/\(machine).\(name)", "/run/log/journal/\(machine).\(name)",
            "/run/systemd/journal.\(name)",
        ] where !machine.isEmpty {
            try? FileManager.default.removeItem(atPath: path)
        }
    }

    private func connects() -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return JournalWriter.withSocketAddress(socketPath) { connect(descriptor, $0, $1) } == 0
    }
}
