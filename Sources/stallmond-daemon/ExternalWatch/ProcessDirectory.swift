import Foundation
import StallCollector

#if canImport(Glibc)
import Glibc
#endif

/// What stallmond reads of other processes in `/proc`: which ones `watch` names, and the kernel's
/// view of one of their threads. Plain reads of small files; nothing stops or signals them.
enum ProcessDirectory {
    /// The processes that `patterns` name, leaving out stallmond itself and those that run their
    /// own stall monitor (``runsOwnMonitor(_:)``). An executable path is resolved first, at each
    /// look (``resolvingLinks(_:)``).
    static func processes(matching patterns: [WatchPattern]) -> Set<Int32> {
        guard !patterns.isEmpty, let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else {
            return []
        }
        let patterns = patterns.map(resolvingLinks)
        let own = getpid()
        var found: Set<Int32> = []
        for name in names {
            guard let pid = Int32(name), pid != own, let executable = executable(of: pid) else { continue }
            let cgroup = self.cgroup(of: pid)
            if patterns.contains(where: { $0.matches(executable: executable, cgroup: cgroup) }), !runsOwnMonitor(pid) {
                found.insert(pid)
            }
        }
        return found
    }

    /// An executable path with its symbolic links resolved (`realpath`), since `/proc/PID/exe`
    /// names the file itself: `/usr/local/bin/web` linked to `/opt/web/bin/web` names the processes
    /// that run the latter. Resolved at each look, so a link moved to a new release names the
    /// new file from the next look on; a path that does not resolve (no such file yet) stays as
    /// written. A unit glob is returned unchanged.
    static func resolvingLinks(_ pattern: WatchPattern) -> WatchPattern {
        guard case .executable(let path) = pattern, let resolved = realpath(path, nil) else { return pattern }
        defer { free(resolved) }
        return .executable(String(cString: resolved))
    }

    /// The file process `pid` runs (`/proc/PID/exe`), without the ` (deleted)` the kernel adds
    /// once the file was replaced (an upgrade); `nil` for kernel threads and vanished processes.
    static func executable(of pid: Int32) -> String? {
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe") else {
            return nil
        }
        return target.hasSuffix(" (deleted)") ? String(target.dropLast(" (deleted)".count)) : target
    }

    /// Process `pid`'s cgroup as systemd places it: its path in the unified hierarchy (the `0::`
    /// line of `/proc/PID/cgroup`), or, where that is the root (a hybrid hierarchy, in which
    /// systemd keeps its units in the named v1 one), its `name=systemd` path.
    static func cgroup(of pid: Int32) -> String {
        guard let text = read("/proc/\(pid)/cgroup") else { return "" }
        // "ID:CONTROLLERS:PATH" a line; the unified hierarchy's is "0::PATH".
        var paths: [Substring: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            if parts.count == 3 { paths[parts[1]] = String(parts[2]) }
        }
        let unified = paths[""] ?? ""
        return unified.isEmpty || unified == "/" ? paths["name=systemd"] ?? unified : unified
    }

    /// The names of the threads a linked stallmon monitor runs while it watches: such a process
    /// reports its own stalls, with its own stacks, and is not watched from outside as well.
    static let monitorThreadNames: Set<String> = ["stallmon-watch", "stallmon-nio", "stallmon-pool"]

    /// Whether process `pid` runs a stallmon monitor: one of its threads bears one of
    /// ``monitorThreadNames``.
    static func runsOwnMonitor(_ pid: Int32) -> Bool {
        guard let tids = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return false }
        return tids.contains { tid in
            threadName(pid: pid, tid: Int32(tid) ?? 0).map(monitorThreadNames.contains) == true
        }
    }

    /// A thread's name (`comm`).
    static func threadName(pid: Int32, tid: Int32) -> String? {
        read("/proc/\(pid)/task/\(tid)/comm").map { $0.trimmingCharacters(in: .newlines) }
    }

    /// The state letter of a thread (`R`, `S`, `D`, …): the field after the name in its `stat`.
    static func threadState(pid: Int32, tid: Int32) -> String? {
        guard let stat = read("/proc/\(pid)/task/\(tid)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
        return stat[stat.index(after: close)...].split(separator: " ").first.map(String.init)
    }

    /// The system call a thread is blocked in (the first field of its `syscall` file), `nil` when it
    /// runs in user space.
    static func threadSyscall(pid: Int32, tid: Int32) -> Int? {
        guard let text = read("/proc/\(pid)/task/\(tid)/syscall") else { return nil }
        return text.split(separator: " ").first.flatMap { Int($0.trimmingCharacters(in: .newlines)) }
            .flatMap { $0 >= 0 ? $0 : nil }
    }

    /// Where a thread blocked in a system call sits (its `syscall` file: the call's number, six
    /// arguments, then the stack pointer and the program counter); `nil` while it runs in user
    /// space or when it cannot be read.
    struct SyscallView: Equatable {
        var number: Int
        var stackPointer: UInt64
        var programCounter: UInt64
    }

    static func threadSyscallView(pid: Int32, tid: Int32) -> SyscallView? {
        guard let text = read("/proc/\(pid)/task/\(tid)/syscall") else { return nil }
        let fields = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard fields.count == 9, let number = Int(fields[0]), number >= 0,
            let sp = UInt64(fields[7].dropFirst(2), radix: 16), let pc = UInt64(fields[8].dropFirst(2), radix: 16)
        else { return nil }
        return SyscallView(number: number, stackPointer: sp, programCounter: pc)
    }

    /// The kernel function a thread waits in (`wchan`), `nil` when it waits nowhere.
    static func threadWaitChannel(pid: Int32, tid: Int32) -> String? {
        guard let text = read("/proc/\(pid)/task/\(tid)/wchan"), !text.isEmpty, text != "0" else { return nil }
        return text
    }

    /// A thread's time on a CPU, in nanoseconds (the first field of its `schedstat`).
    static func threadCPUTime(pid: Int32, tid: Int32) -> UInt64? {
        read("/proc/\(pid)/task/\(tid)/schedstat")?.split(separator: " ").first.flatMap { UInt64($0) }
    }

    /// A small `/proc` file whole (at most 4 KiB): one open, read and close.
    private static func read(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count >= 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }
}
