import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A real journald for the tests: the one that runs, or one started here
/// (`/lib/systemd/systemd-journald` works standalone as root).
enum Journald {
    static let socket = "/run/systemd/journal/socket"

    /// Makes sure journald listens; returns false when it cannot be started (not root).
    static func ensureRunning() -> Bool {
        if FileManager.default.fileExists(atPath: socket) { return true }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/lib/systemd/systemd-journald")
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return false }
        for _ in 0..<100 {
            if FileManager.default.fileExists(atPath: socket) { return true }
            usleep(50_000)
        }
        return false
    }

    /// `journalctl -o json` for the matches, polled until `count` entries appear or `timeout` passes.
    static func entries(_ matches: [String], atLeast count: Int = 1, timeout: Double = 10) throws -> [[String: String]]
    {
        let deadline = Date(timeIntervalSinceNow: timeout)
        var entries: [[String: String]] = []
        repeat {
            entries = try read(matches)
            if entries.count >= count { return entries }
            usleep(100_000)
        } while Date() < deadline
        return entries
    }

    static func read(_ matches: [String]) throws -> [[String: String]] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        process.arguments = ["-o", "json", "--no-pager"] + matches
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
