import Foundation
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// A real journald for the tests, started as `/lib/systemd/systemd-journald [NAMESPACE]` (it works
/// standalone, as root), and read back with `journalctl -o json`. Two kinds:
///
/// - ``host``: the host's journald, the one that listens on `/run/systemd/journal/socket`, or one
///   started here when none does and stopped when the tests exit (its journal files stay).
/// - ``namespaced()``: a journald of the test's own (what `LogNamespace=` starts), listening on
///   `/run/systemd/journal.NAMESPACE/socket` and writing its own journal files, read back with
///   `journalctl --namespace`. A test can write hostile entries that no other test's
///   `stallmon report` reads, and kill, stop and restart it without touching the journald other
///   tests share. ``remove()`` kills it and deletes its socket folder and journal files.
package final class Journald: @unchecked Sendable {
    /// The namespace; `nil` for the host's journald.
    package let namespace: String?
    private let lock = NSLock()
    private var process: Process?

    private init(namespace: String?) {
        self.namespace = namespace
    }

    /// The host's journald.
    package static let host = Journald(namespace: nil)

    /// A journald of a namespace of its own, not started yet (``ensureRunning()`` starts it).
    package static func namespaced() -> Journald {
        // Namespace names are file-name-safe words; a fresh one per test keeps runs apart.
        Journald(namespace: "stallmontest\(getpid())x\(UInt32.random(in: 0...UInt32.max))")
    }

    /// The namespace's name (empty for the host's journald).
    package var name: String { namespace ?? "" }

    package var socketPath: String {
        namespace.map { "/run/systemd/journal.\($0)/socket" } ?? "/run/systemd/journal/socket"
    }

    /// The folder of a namespace's journal files (`<machine-id>.<namespace>` under
    /// `/var/log/journal`, or `/run/log/journal` without persistent storage), once journald made it.
    package var directory: String? {
        guard let namespace, let machineID = Self.machineID else { return nil }
        return ["/var/log/journal", "/run/log/journal"].map { "\($0)/\(machineID).\(namespace)" }.first {
            FileManager.default.fileExists(atPath: $0)
        }
    }

    /// Whether a datagram socket connects to journald's socket.
    ///
    /// "Listens", not "its socket exists": a journald that has exited leaves its socket behind, and
    /// that socket refuses every entry. journald replaces such a socket when it starts.
    package var listens: Bool { JournalWriter(socketPath: socketPath).isAvailable }

    /// Makes sure journald listens (a namespace's journald exits when idle); returns false when it
    /// cannot be started (not root).
    package func ensureRunning() -> Bool {
        lock.withLock {
            if listens { return true }
            if let process, !process.isRunning { self.process = nil }
            return startLocked()
        }
    }

    /// Starts journald and waits until it takes a datagram; false when it cannot (not root).
    package func start() -> Bool {
        lock.withLock { startLocked() }
    }

    private func startLocked() -> Bool {
        let process = Process()
        let journald = "/lib/systemd/systemd-journald"
        let arguments = namespace.map { [$0] } ?? []
        // SIGTERM when the thread that started it ends: ``Spawner``'s thread ends only with the
        // test process, however it ends (a crash or a SIGKILL runs no atexit handler).
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--pdeathsig", "TERM", journald] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: journald)
            process.arguments = arguments
        }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard Spawner.shared.run(process) else { return false }
        self.process = process
        if namespace == nil {
            Self.hostStarted = process.processIdentifier
            atexit { Journald.stopHostStarted() }
        }
        for _ in 0..<100 {
            if listens { return true }
            usleep(50_000)
        }
        return false
    }

    /// The host's journald started here, if any, stopped at exit.
    nonisolated(unsafe) private static var hostStarted: pid_t = 0

    /// Stops the host's journald started here, so the tests leave nothing running. Its journal
    /// files stay.
    private static func stopHostStarted() {
        let pid = hostStarted
        guard pid > 0, kill(pid, SIGTERM) == 0 else { return }
        // A journald a test stopped (SIGSTOP) takes SIGTERM only once it runs again.
        kill(pid, SIGCONT)
        for _ in 0..<60 {
            var status: Int32 = 0
            // Gone once reaped, here or by Foundation's own child monitor (then ECHILD).
            if waitpid(pid, &status, WNOHANG) != 0 || kill(pid, 0) != 0 { return }
            usleep(50_000)
        }
        kill(pid, SIGKILL)
    }

    /// Starts the processes whose end must follow the test process's (`setpriv --pdeathsig`), from
    /// a thread that lives as long as it: a parent-death signal comes when the *thread* that
    /// started the child ends, and the test runner's threads come and go.
    private final class Spawner: @unchecked Sendable {
        static let shared = Spawner()
        private let condition = NSCondition()
        private var queue: [(process: Process, done: DispatchSemaphore, started: UnsafeMutablePointer<Bool>)] = []

        private init() {
            let thread = Thread { [self] in serve() }
            thread.name = "journald-spawner"
            thread.start()
        }

        /// Starts `process` on the spawner's thread; false when it cannot.
        func run(_ process: Process) -> Bool {
            let done = DispatchSemaphore(value: 0)
            let started = UnsafeMutablePointer<Bool>.allocate(capacity: 1)
            defer { started.deallocate() }
            started.initialize(to: false)
            condition.withLock {
                queue.append((process, done, started))
                condition.signal()
            }
            done.wait()
            return started.pointee
        }

        private func serve() -> Never {
            while true {
                let request = condition.withLock {
                    while queue.isEmpty { condition.wait() }
                    return queue.removeFirst()
                }
                request.started.pointee = (try? request.process.run()) != nil
                request.done.signal()
            }
        }
    }

    /// Sends `signal` to the journald started here; SIGKILL also waits until it is gone (its socket
    /// file stays).
    package func signal(_ signal: Int32) {
        lock.withLock {
            guard let process else { return }
            kill(process.processIdentifier, signal)
            if signal == SIGKILL {
                process.waitUntilExit()
                self.process = nil
            }
        }
    }

    /// Fills the socket's queue (`net.unix.max_dgram_qlen` datagrams) of a stopped journald, so
    /// that the next sender would wait; returns how many datagrams it sent.
    package func fillQueue() -> Int {
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

    /// Kills a namespace's journald and removes its socket folder and journal files; does nothing
    /// to the host's.
    package func remove() {
        guard let namespace else { return }
        if lock.withLock({ process != nil }) {
            signal(SIGCONT)
            signal(SIGKILL)
        }
        try? FileManager.default.removeItem(atPath: "/run/systemd/journal.\(namespace)")
        if let machineID = Self.machineID {
            for root in ["/var/log/journal", "/run/log/journal"] {
                try? FileManager.default.removeItem(atPath: "\(root)/\(machineID).\(namespace)")
            }
        }
    }

    private static var machineID: String? {
        (try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Sends one entry, every field in the binary-safe form of the native protocol.
    package func send(_ fields: [(String, String)]) throws {
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

    /// What `journalctl` reads this journald with: `--namespace NAME --all` for a namespace.
    private var options: [String] { namespace.map { ["--namespace", $0, "--all"] } ?? [] }

    /// Waits until `journalctl` shows at least `count` entries with `MESSAGE_ID`s of `messageIDs`.
    package func waitForEntries(_ count: Int, messageIDs: [String], timeout: Double = 10) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        repeat {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
            process.arguments =
                (namespace.map { ["--namespace", $0] } ?? [])
                + ["-o", "cat", "--output-fields=MESSAGE_ID", "--no-pager"]
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

    /// `journalctl -o json` for the matches, polled until `count` entries appear or `timeout`
    /// passes.
    package func entries(_ matches: [String], atLeast count: Int = 1, timeout: Double = 10) throws -> [[String: String]]
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

    /// `journalctl -o json` for the matches, once.
    package func read(_ matches: [String]) throws -> [[String: String]] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/journalctl")
        process.arguments = ["-o", "json", "--no-pager"] + options + matches
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Self.entries(json: String(decoding: data, as: UTF8.self))
    }

    /// The entries of `journalctl -o json`'s output, one JSON object a line. journalctl prints
    /// binary or oversized fields as arrays or null: only the text ones are kept.
    package static func entries(json output: String) -> [[String: String]] {
        output.split(separator: "\n").compactMap { line in
            guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
                return nil
            }
            return object.compactMapValues { $0 as? String }
        }
    }
}
