import CStallCapture
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What the kernel accounts for this process and its threads, read from `/proc` and its clocks.
enum Kernel {
    /// CLOCK_MONOTONIC in nanoseconds (the clock stallmon's reports use).
    static func now() -> UInt64 { stallmon_now_ns() }

    /// Voluntary plus involuntary context switches of thread `tid` of this process: each time the
    /// thread stopped running, which for a sleeping watchdog is each time it woke up.
    static func contextSwitches(ofThread tid: Int32) -> Int? {
        guard tid > 0, let status = contents(of: "/proc/self/task/\(tid)/status") else { return nil }
        guard let voluntary = field("voluntary_ctxt_switches", in: status),
            let involuntary = field("nonvoluntary_ctxt_switches", in: status)
        else { return nil }
        return voluntary + involuntary
    }

    /// Resident set size of this process (`VmRSS`), in KiB.
    static func residentKiB() -> Int? {
        contents(of: "/proc/self/status").flatMap { field("VmRSS", in: $0) }
    }

    /// The anonymous part of the resident set (`RssAnon`: heap, malloc arenas, stacks), in KiB:
    /// unlike file pages, no reclaim and re-fault of library code moves it.
    static func anonymousResidentKiB() -> Int? {
        contents(of: "/proc/self/status").flatMap { field("RssAnon", in: $0) }
    }

    /// CPU time thread `tid` of this process has used, in nanoseconds.
    static func threadCPU(_ tid: Int32) -> UInt64? {
        let value = stallmon_thread_cpu_ns(tid)
        return value >= 0 ? UInt64(value) : nil
    }

    /// CPU time of all the threads of process `pid` (`/proc/PID/task/*/schedstat`), in nanoseconds:
    /// the scheduler's own count, finer than `/proc/PID/stat`'s clock ticks.
    static func cpuNanoseconds(ofProcess pid: Int32) -> UInt64 {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.reduce(0) { total, tid in
            let first = contents(of: "/proc/\(pid)/task/\(tid)/schedstat")?.split(separator: " ").first
            return total + (first.flatMap { UInt64($0) } ?? 0)
        }
    }

    /// The calling thread's kernel id.
    static func currentThreadID() -> Int32 { stallmon_gettid() }

    /// A whole `/proc` file; they report a size of 0, so this reads until end of file.
    static func contents(of path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes.append(contentsOf: buffer[..<count])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The first integer on the `name:` line of a `/proc/.../status` text.
    private static func field(_ name: String, in status: String) -> Int? {
        for line in status.split(separator: "\n") where line.hasPrefix(name + ":") {
            return Int(line.dropFirst(name.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
        }
        return nil
    }
}
