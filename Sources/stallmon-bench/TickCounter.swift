import CStallBench
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The loop ticks of a process, counted exactly: a counting perf event on each of its threads that
/// counts the returns of the epoll waits (`epoll_wait`, `epoll_pwait`, `epoll_pwait2`: see
/// `stallbench_wait_counter`). Every return from a wait begins a tick, as the tick watcher's program
/// counts them. `io_uring_enter` is left out: it counts as a wait only with some arguments, and the
/// services measured wait in epoll.
///
/// The counters cost every system call of the counted threads something of their own (the
/// tracepoint's perf handler), so they are open only while stallmond's cost per tick is measured,
/// never in the runs whose requests are compared.
final class TickCounter {
    private var descriptors: [Int32] = []

    /// Counters on every thread process `pid` has now (a thread it starts later is not counted).
    init(process pid: Int32) throws {
        guard
            let id = Kernel.contents(of: "/sys/kernel/tracing/events/raw_syscalls/sys_exit/id").flatMap({
                UInt64($0.trimmingCharacters(in: .whitespacesAndNewlines))
            })
        else {
            throw ChildRunner.Failure(description: "no tracepoint raw_syscalls/sys_exit under /sys/kernel/tracing")
        }
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        for tid in tasks.compactMap({ Int32($0) }) {
            let descriptor = stallbench_wait_counter(tid, id)
            guard descriptor >= 0 else {
                // A thread that ended meanwhile has no more ticks to count.
                if descriptor == -ESRCH { continue }
                close()
                throw ChildRunner.Failure(
                    description: "perf_event_open of raw_syscalls/sys_exit on thread \(tid): "
                        + String(cString: strerror(-descriptor)))
            }
            descriptors.append(descriptor)
        }
    }

    deinit {
        close()
    }

    /// The waits returned on the counted threads since the counters opened.
    func count() -> UInt64 {
        descriptors.reduce(0) { total, descriptor in
            total + UInt64(max(0, stallbench_counter_read(descriptor)))
        }
    }

    func close() {
        for descriptor in descriptors { Glibc.close(descriptor) }
        descriptors = []
    }
}

/// The time the kernel spent in the tick watcher's BPF programs, from its run-time statistics
/// (`BPF_ENABLE_STATS`, on while this lives): the programs stallmond loaded after ``init()``.
final class BPFRunTime {
    private let statistics: Int32
    private let before: Set<UInt32>

    /// `nil` when the kernel keeps no statistics here (then the figure is left out).
    init?() {
        let descriptor = stallbench_bpf_enable_run_time_stats()
        guard descriptor >= 0 else { return nil }
        statistics = descriptor
        before = Set(Self.programs().keys)
    }

    deinit {
        Glibc.close(statistics)
    }

    /// Every loaded program now: id → (name, run time, runs).
    private static func programs() -> [UInt32: (name: String, nanoseconds: UInt64, runs: UInt64)] {
        var result: [UInt32: (name: String, nanoseconds: UInt64, runs: UInt64)] = [:]
        var id: UInt32 = 0
        while true {
            let next = stallbench_bpf_next_program(id)
            guard next > 0 else { break }
            id = UInt32(next)
            var name = [CChar](repeating: 0, count: 16)
            var nanoseconds: UInt64 = 0
            var runs: UInt64 = 0
            guard stallbench_bpf_program_stats(id, &name, &nanoseconds, &runs) == 0 else { continue }
            let length = name.firstIndex(of: 0) ?? name.count
            result[id] = (
                String(decoding: name[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self), nanoseconds, runs
            )
        }
        return result
    }

    /// The tick watcher's programs loaded since ``init()`` (names from ticks.bpf.c, cut to 15
    /// characters by the kernel): their run time and runs so far, all of them together.
    func sample() -> (nanoseconds: UInt64, runs: UInt64) {
        Self.programs().filter { id, program in
            !before.contains(id)
                && (program.name.hasPrefix("enter_") || program.name.hasPrefix("exit_")
                    || program.name == "thread_exits")
        }.values.reduce((0, 0)) { ($0.0 + $1.nanoseconds, $0.1 + $1.runs) }
    }
}
