import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A real systemd, booted as PID 1 in private namespaces by `Scripts/systemd-namespace.sh`, for tests
/// that install units, start services and read what they wrote to the journal.
///
/// Nothing done inside reaches the host: `/etc`, `/usr` and `/var` are copy-on-write overlays,
/// `/run`, `/tmp` and `/etc/systemd/system` are its own, and it has its own journald, machine id,
/// cgroup subtree and network (see the script's header). The build folder (and the rest of the file
/// system) is shared, so units can run the package's executables in place; put other host files in
/// with ``copy(_:to:mode:)``.
///
/// ```swift
/// let systemd = try SystemdNamespace.started()
/// defer { systemd.stop() }
/// try systemd.install(unit: "demo.service", contents: "[Service]\nExecStart=/bin/sleep 60\n")
/// try systemd.systemctl(["start", "demo.service"])
/// let entries = try systemd.journal(matches: ["_SYSTEMD_UNIT=demo.service"], atLeast: 1)
/// ```
///
/// - Important: Needs root (check ``isSupported``). ``stop()``, also called on deinit, kills every
///   process inside and removes everything the namespace made.
package final class SystemdNamespace: @unchecked Sendable {
    /// A command that could not run, failed, or outlived its timeout.
    package struct Failure: Error, CustomStringConvertible {
        package var arguments: [String]
        package var status: Int32?
        package var output: String

        package var description: String {
            let what = status.map { "exited with status \($0)" } ?? "timed out"
            return "\(arguments.joined(separator: " ")) \(what): \(output)"
        }
    }

    /// `Scripts/systemd-namespace.sh`, found from this file's path.
    package static let script = Repository.root.appendingPathComponent("Scripts/systemd-namespace.sh")

    /// Whether one can run here: root, systemd, and util-linux's `unshare` and `nsenter`.
    package static var isSupported: Bool {
        geteuid() == 0
            && ["/lib/systemd/systemd", "/usr/bin/unshare", "/usr/bin/nsenter", script.path].allSatisfy {
                FileManager.default.isExecutableFile(atPath: $0)
            }
    }

    /// The instance's name: its state in `/run/stallmon-ns/NAME`, its cgroup `stallmon-ns.NAME`.
    package let name: String

    private let lock = NSLock()
    private var running = false

    /// - Parameter name: Unique among the instances that run at once; the default is.
    package init(name: String? = nil) {
        self.name = name ?? "swift-\(getpid())-\(String(UInt32.random(in: .min ... .max), radix: 16))"
    }

    /// A new instance, booted.
    package static func started(name: String? = nil, timeout: Double = 60) throws -> SystemdNamespace {
        let namespace = SystemdNamespace(name: name)
        try namespace.start(timeout: timeout)
        return namespace
    }

    deinit {
        stop()
    }

    package var isRunning: Bool { lock.withLock { running } }

    /// Boots systemd and waits until `systemctl is-system-running` says `running` (or `degraded`);
    /// about half a second.
    package func start(timeout: Double = 60) throws {
        try lock.withLock {
            guard !running else { return }
            let result = try Self.script(
                ["--name", name, "start", "--timeout", String(Int(timeout.rounded(.up)))],
                timeout: timeout + 10)
            guard result.status == 0 else {
                throw Failure(
                    arguments: ["systemd-namespace.sh", "start"], status: result.status, output: result.output)
            }
            running = true
        }
    }

    /// Kills every process inside and removes the instance; does nothing when it does not run.
    package func stop() {
        lock.withLock {
            guard running else { return }
            running = false
            do {
                let result = try Self.script(["--name", name, "stop"], timeout: 60)
                if result.status != 0 {
                    FileHandle.standardError.write(Data("SystemdNamespace \(name): stop: \(result.output)\n".utf8))
                }
            } catch {
                FileHandle.standardError.write(Data("SystemdNamespace \(name): stop: \(error)\n".utf8))
            }
        }
    }

    /// Runs a command inside (in its PID, mount, cgroup, UTS, IPC and network namespaces).
    ///
    /// - Parameters:
    ///   - arguments: The program (looked up in `PATH`) and its arguments.
    ///   - input: Written to its standard input, which is otherwise empty.
    ///   - timeout: After this many seconds the command is killed and ``Failure`` thrown.
    /// - Returns: Its exit status and its output: standard output and standard error, interleaved.
    @discardableResult
    package func run(_ arguments: [String], input: Data? = nil, timeout: Double = 120) throws -> (
        status: Int32, output: String
    ) {
        try Self.script(["--name", name, "exec"] + arguments, input: input, timeout: timeout)
    }

    /// Runs a command inside and returns its output; throws ``Failure`` unless it exits with 0.
    @discardableResult
    package func check(_ arguments: [String], input: Data? = nil, timeout: Double = 120) throws -> String {
        let result = try run(arguments, input: input, timeout: timeout)
        guard result.status == 0 else {
            throw Failure(arguments: arguments, status: result.status, output: result.output)
        }
        return result.output
    }

    /// `systemctl ARGUMENTS` inside. A non-zero status is returned, not thrown: `is-active` and
    /// `is-failed` answer with it.
    @discardableResult
    package func systemctl(_ arguments: [String], timeout: Double = 120) throws -> (status: Int32, output: String) {
        try run(["systemctl", "--no-pager"] + arguments, timeout: timeout)
    }

    /// One property of a unit, e.g. `property("NRestarts", of: "demo.service")`.
    package func property(_ property: String, of unit: String) throws -> String {
        try check(["systemctl", "show", "--property", property, "--value", unit])
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Writes a unit (`demo.service`) or a drop-in (`demo.service.d/stallmon.conf`) into the
    /// namespace's `/etc/systemd/system` and reloads systemd.
    package func install(unit name: String, contents: String) throws {
        let result = try Self.script(["--name", self.name, "install-unit", "-", name], input: Data(contents.utf8))
        guard result.status == 0 else {
            throw Failure(arguments: ["install-unit", name], status: result.status, output: result.output)
        }
    }

    /// Writes `data` to `path` inside, creating its directory.
    package func copy(_ data: Data, to path: String, mode: Int = 0o644) throws {
        let result = try Self.script(
            ["--name", name, "copy", "-", path, String(mode, radix: 8)], input: data, timeout: 120)
        guard result.status == 0 else {
            throw Failure(arguments: ["copy", path], status: result.status, output: result.output)
        }
    }

    /// The namespace's journal entries that match (`journalctl -o json --all MATCHES`), polled until
    /// at least `count` are there or `timeout` passes. Fields that are not text are left out.
    package func journal(matches: [String], atLeast count: Int = 0, timeout: Double = 10) throws -> [[String: String]] {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while true {
            let result = try Self.script(
                ["--name", name, "exec", "journalctl", "--no-pager", "--output=json", "--all"] + matches,
                mergingErrors: false)
            let entries = Journald.entries(json: result.output)
            if entries.count >= count || Date() >= deadline { return entries }
            usleep(100_000)
        }
    }

    // MARK: - The script

    /// Runs the script. Output is standard output and, unless `mergingErrors` is false, standard
    /// error on the same pipe.
    private static func script(
        _ arguments: [String], input: Data? = nil, timeout: Double = 120, mergingErrors: Bool = true
    ) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script.path] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = mergingErrors ? output : FileHandle.nullDevice
        let standardInput = input.map { _ in Pipe() }
        process.standardInput = standardInput ?? FileHandle.nullDevice
        try process.run()

        if let input, let writer = standardInput?.fileHandleForWriting {
            DispatchQueue.global().async {
                try? writer.write(contentsOf: input)
                try? writer.close()
            }
        }
        let pid = process.processIdentifier
        let timedOut = TimeoutFlag()
        // Foundation starts the script in a process group of its own: killing the group kills the
        // command inside the namespace too (nsenter forks it), which holds the output pipe.
        let killer = DispatchWorkItem {
            timedOut.set()
            kill(-pid, SIGKILL)
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: killer)
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        killer.cancel()
        let text = String(decoding: data, as: UTF8.self)
        if timedOut.isSet {
            throw Failure(arguments: arguments, status: nil, output: text)
        }
        return (process.terminationStatus, text)
    }

    private final class TimeoutFlag: @unchecked Sendable {
        private let lock = NSLock()
        private var value = false
        func set() { lock.withLock { value = true } }
        var isSet: Bool { lock.withLock { value } }
    }
}
