import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Writers of journal entries as the host's other parties are: a user without privileges
/// (`setpriv` to uid and gid 65534, no groups), or a system unit (a process placed in the cgroup
/// `system.slice/NAME`, from which journald derives `_SYSTEMD_UNIT` as systemd's own units get it).
/// Each runs `/usr/bin/python3` (Debian's; CI installs it), which sends the entries in journald's
/// native protocol to a socket: journald stamps them with the writer's trusted fields.
package enum JournalWriters {
    package enum Writer: Sendable {
        case nobody
        case systemUnit(String)
    }

    /// Sends each entry to `socket`: at most `perSecond` a second, or as fast as journald takes them.
    package static func send(
        _ entries: [[(String, String)]], to socket: String, as writer: Writer, perSecond: Double? = nil
    ) throws {
        let process = try start(entries, to: socket, as: writer, perSecond: perSecond)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw POSIXError(
                .EIO, userInfo: [NSLocalizedDescriptionKey: "the writer exited \(process.terminationStatus)"])
        }
    }

    /// Starts sending in the background; the caller waits for (or kills) the process.
    package static func start(
        _ entries: [[(String, String)]], to socket: String, as writer: Writer, perSecond: Double? = nil
    ) throws -> Process {
        // A file the unprivileged writer may read: the entries as JSON lists of [name, value].
        let file = NSTemporaryDirectory() + "stallmon-entries-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
        let json = try JSONSerialization.data(withJSONObject: entries.map { $0.map { [$0.0, $0.1] } })
        try json.write(to: URL(fileURLWithPath: file))
        chmod(file, 0o644)
        // A system unit's writer lingers for journald to read its cgroup (see `script`).
        let linger: String
        if case .systemUnit = writer { linger = "2" } else { linger = "0" }
        let arguments = ["-c", script, socket, file, perSecond.map { "\($0)" } ?? "0", linger]
        let process = Process()
        switch writer {
        case .nobody:
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments =
                ["--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3"] + arguments
        case .systemUnit(let name):
            let groups = try systemUnitCgroups(name)
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            let moves = groups.map { "echo $$ > \($0)/cgroup.procs" }.joined(separator: " && ")
            process.arguments = ["-c", "\(moves) && exec /usr/bin/python3 \"$@\"", "sh"] + arguments
        }
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        return process
    }

    /// The cgroup directories of a system unit `name`, made in each hierarchy journald may read a
    /// sender's unit from: the unified one (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
    /// hybrid host) and the named `systemd` one of a hybrid host.
    package static func systemUnitCgroups(_ name: String) throws -> [String] {
        var roots: [String] = []
        if FileManager.default.fileExists(atPath: "/sys/fs/cgroup/cgroup.controllers") {
            roots.append("/sys/fs/cgroup")
        } else {
            for root in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"]
            where FileManager.default.fileExists(atPath: root + "/cgroup.procs") {
                roots.append(root)
            }
        }
        guard !roots.isEmpty else { throw CgroupError(path: "/sys/fs/cgroup", reason: "no cgroup hierarchy found") }
        let groups = roots.map { "\($0)/system.slice/\(name)" }
        for group in groups {
            do {
                try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            } catch {
                throw CgroupError(path: group, reason: "\(error)")
            }
        }
        return groups
    }

    /// A system unit's cgroup that could not be made (these tests run as root, with the cgroup
    /// hierarchies mounted writable, as on CI's machine).
    package struct CgroupError: Error, CustomStringConvertible {
        package var path: String
        package var reason: String
        package var description: String {
            "cannot make the cgroup \(path) that a system unit's writer runs in: \(reason)"
        }
    }

    /// Removes the cgroups of a system unit made by ``systemUnitCgroups(_:)`` (once its processes
    /// exited), and `system.slice` where that was made for it (a slice in use is not removed).
    package static func removeSystemUnit(_ name: String) {
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"] {
            rmdir("\(root)/system.slice/\(name)")
            rmdir("\(root)/system.slice")
        }
    }

    /// Sends the entries of the JSON file argv[2] to the socket argv[1], argv[3] a second at most
    /// (0: no pause); a datagram journald cannot take yet is sent again.
    package static let script = """
        import json, socket, struct, sys, time
        path, entries, rate = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for fields in entries:
            datagram = b"".join(
                name.encode() + b"\\n" + struct.pack("<Q", len(value.encode("utf-8", "surrogateescape")))
                + value.encode("utf-8", "surrogateescape") + b"\\n" for name, value in fields)
            for attempt in range(1000):
                try:
                    sock.sendto(datagram, path)
                    break
                except (BlockingIOError, ConnectionRefusedError, OSError):
                    time.sleep(0.01)
            if rate > 0:
                time.sleep(1 / rate)
        # journald reads a sender's cgroup (its _SYSTEMD_UNIT) from /proc when it gets to the
        # datagram: a writer that is gone by then, on a loaded machine, is logged without a unit.
        time.sleep(float(sys.argv[4]))
        """
}
