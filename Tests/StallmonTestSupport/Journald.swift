import Foundation
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A real journald for the tests: the one that listens, or one started here
/// (`/lib/systemd/systemd-journald` works standalone as root) and stopped when the tests exit.
enum Journald {
    /// The journald this process started, if any.
    private static let started = Mutex<pid_t>(0)

    /// Makes sure journald listens; returns false when it cannot be started (not root).
    ///
    /// "Listens", not "its socket exists": a journald that has exited leaves its socket behind, and
    /// that socket refuses every entry. journald replaces such a socket when it starts.
    static func ensureRunning() -> Bool {
        started.withLock { pid in
            if JournalWriter().isAvailable { return true }
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/lib/systemd/systemd-journald")
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            do { try process.run() } catch { return false }
            pid = process.processIdentifier
            atexit { Journald.stopStarted() }
            for _ in 0..<100 {
                if JournalWriter().isAvailable { return true }
                usleep(50_000)
            }
            return false
        }
    }

    /// Stops the journald started here, so the tests leave nothing running. Its journal files stay.
    private static func stopStarted() {
        let pid = started.withLock { $0 }
        guard pid > 0, kill(pid, SIGTERM) == 0 else { return }
        for _ in 0..<60 {
            var status: Int32 = 0
            // Gone once reaped, here or by Foundation's own child monitor (then ECHILD).
            if waitpid(pid, &status, WNOHANG) != 0 { return }
            usleep(50_000)
        }
    }

    /// `journalctl -o json OPTIONS MATCHES`, polled until `count` entries appear or `timeout` passes.
    static func entries(
        _ matches: [String], atLeast count: Int = 1, timeout: Double = 10, options: [String] = []
    ) throws -> [[String: String]] {
        let deadline = Date(timeIntervalSinceNow: timeout)
        var entries: [[String: String]] = []
        repeat {
            entries = try read(matches, options: options)
            if entries.count >= count { return entries }
            usleep(100_000)
        } while Date() < deadline
        return entries
    }

    /// `journalctl -o json OPTIONS MATCHES`, once.
    static func read(_ matches: [String], options: [String] = []) throws -> [[String: String]] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        process.arguments = ["-o", "json", "--no-pager"] + options + matches
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).split(separator: "\n").compactMap { line in
            guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
                return nil
            }
            // journalctl prints binary or oversized fields as arrays or null; keep the text ones.
            return object.compactMapValues { $0 as? String }
        }
    }
}
