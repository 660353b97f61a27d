import CStallWatch
import Foundation
import Logging
import StallCollector
import StallConfiguration
import StallJournal
import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// stallmond's watch from outside: the BPF program of CStallWatch on the wait system calls of the
/// processes `watch` names, and a thread of its own that scans the program's map every eighth of
/// the threshold, reports each tick that crosses it (``ExternalStall``), and looks for the watched
/// processes again every second. Nothing here stops, traces or signals the processes.
final class TickWatcher: @unchecked Sendable {
    private let handle: OpaquePointer
    private let patterns: [WatchPattern]
    private let threshold: Duration
    private let logger: Logger
    private let reporter: ExternalStallReporter
    /// Confined to the watcher's thread from ``start()`` on.
    private var watched: Set<Int32> = []
    private var stalls = ExternalStallTracker()
    /// The processes taken out of the watch since the last batch handed to the reporter.
    private var unwatched: Set<Int32> = []
    /// How many stalls were open after the last scan: fewer now (a thread gone) has the reporter
    /// drop what it kept of them.
    private var lastOpenStallCount = 0
    private var lastLookup: UInt64?
    /// Whether the log said that no process runs that `watch` names, since one last ran.
    private var saidNoneRuns = false
    /// The scan's copy of the loops: grown when a scan fills it, up to the map's 65,536 entries.
    private var buffer = [stallwatch_thread](repeating: stallwatch_thread(), count: 256)

    /// Loads and attaches the program; `nil`, after logging once what to grant, when the kernel
    /// refuses it. stallmond keeps collecting either way.
    init?(patterns: [WatchPattern], threshold: Duration, logger: Logger) {
        var failure = stallwatch_failure()
        guard let handle = stallwatch_open(UInt64(threshold.nanoseconds), &failure) else {
            logger.error("\(Self.refusal(failure)); stallmond watches nothing from outside")
            return nil
        }
        self.handle = handle
        self.reporter = ExternalStallReporter(handle: handle, threshold: threshold, logger: logger)
        self.patterns = patterns
        self.threshold = threshold
        self.logger = logger
    }

    deinit { stallwatch_close(handle) }

    /// What the operator must grant, by the step the kernel refused.
    static func refusal(_ failure: stallwatch_failure) -> String {
        let detail = withUnsafeBytes(of: failure.detail) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let reason = String(cString: strerror(failure.error))
        switch failure.step {
        case STALLWATCH_STEP_BTF:
            return "cannot watch from outside: the kernel has no BTF (\(detail): \(reason)): it needs "
                + "CONFIG_DEBUG_INFO_BTF (Debian's and Ubuntu's kernels have it)"
        case STALLWATCH_STEP_TRACEFS:
            return "cannot watch from outside: no tracefs with the system call tracepoints (\(detail)): "
                + "mount it (mount -t tracefs nodev /sys/kernel/tracing)"
        case STALLWATCH_STEP_LOAD where failure.error == EPERM || failure.error == EACCES:
            return "cannot watch from outside: the kernel refused the BPF program (\(reason)): run stallmond "
                + "as root or grant it CAP_BPF and CAP_PERFMON (AmbientCapabilities=CAP_BPF CAP_PERFMON)"
        case STALLWATCH_STEP_ATTACH where failure.error == EPERM || failure.error == EACCES:
            return "cannot watch from outside: attaching \(detail) was refused (\(reason)): grant CAP_PERFMON "
                + "(AmbientCapabilities=CAP_BPF CAP_PERFMON)"
        default:
            let libbpf = withUnsafeBytes(of: failure.libbpf_message) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            return "cannot watch from outside: \(Self.stepName(failure.step)) \(detail) failed (\(reason))"
                + (libbpf.isEmpty ? "" : "; \(libbpf)")
        }
    }

    private static func stepName(_ step: stallwatch_step) -> String {
        switch step {
        case STALLWATCH_STEP_OPEN: "opening the BPF object"
        case STALLWATCH_STEP_LOAD: "loading the BPF program"
        case STALLWATCH_STEP_ATTACH: "attaching"
        case STALLWATCH_STEP_CONFIG: "configuring the BPF program"
        default: "preparing"
        }
    }

    /// Starts the watcher's threads, the scan's and the reporter's; they run as long as the process.
    func start() {
        reporter.start()
        let thread = Thread { [self] in run() }
        thread.name = "stallmond-ticks"
        thread.start()
    }

    private func run() -> Never {
        let interval = threshold / 8
        while true {
            let now = stallwatch_now_ns()
            if lastLookup.map({ now &- $0 >= 1_000_000_000 }) ?? true {
                lastLookup = now
                lookUpProcesses()
            }
            scan()
            // A signal cutting it short (none is expected) only makes one scan early.
            usleep(UInt32(clamping: interval.microseconds))
        }
    }

    /// Puts the processes `watch` names now in the program's filter, and takes out the others.
    private func lookUpProcesses() {
        let current = ProcessDirectory.processes(matching: patterns)
        if current.isEmpty, !saidNoneRuns {
            let names = patterns.map(\.description).joined(separator: ", ")
            logger.notice("watch names no running process (\(names)): watching none from outside until one starts")
        }
        saidNoneRuns = current.isEmpty
        for pid in current.subtracting(watched) {
            let result = stallwatch_watch(handle, UInt32(pid))
            if result == 0 {
                watched.insert(pid)
                logger.info("watching a process from outside", metadata: ["pid": "\(pid)"])
            } else {
                logger.warning("cannot watch process \(pid): \(String(cString: strerror(-result)))")
            }
        }
        for pid in watched.subtracting(current) {
            _ = stallwatch_unwatch(handle, UInt32(pid))
            watched.remove(pid)
            unwatched.insert(pid)
        }
    }

    /// One pass over the loops: a stall that begins or ends is reported.
    private func scan() {
        var count = Int(stallwatch_read(handle, &buffer, Int32(buffer.count)))
        while count == buffer.count || count == -Int(ENOSPC), buffer.count < 65536 {
            buffer = [stallwatch_thread](repeating: stallwatch_thread(), count: buffer.count * 4)
            count = Int(stallwatch_read(handle, &buffer, Int32(buffer.count)))
        }
        guard count >= 0 else { return }
        let ticks = buffer[..<count].map { thread in
            LoopTick(
                pid: Int32(bitPattern: thread.tick.tgid), tid: Int32(bitPattern: thread.tid),
                tickStart: thread.tick.tick_start_ns, waitStart: thread.tick.wait_start_ns,
                longTickStart: thread.tick.long_tick_start_ns, longTickEnd: thread.tick.long_tick_end_ns,
                tickStartCPU: thread.tick.tick_start_cpu_ns, longTickCPU: thread.tick.long_tick_cpu_ns,
                exited: thread.tick.exit_ns != 0)
        }
        let events = stalls.update(ticks, now: stallwatch_now_ns(), threshold: UInt64(threshold.nanoseconds))
        // A thread that ended inside a long tick was kept for this scan, which accounted for it.
        for tick in ticks where !watched.contains(tick.pid) || tick.exited {
            _ = stallwatch_forget(handle, UInt32(bitPattern: tick.tid))
        }
        // The thread as it is now goes with a detected stall (an ended one is described as it was
        // detected); its stack is the reporter's to take, off this thread.
        guard !events.isEmpty || !unwatched.isEmpty || stalls.openStallCount < lastOpenStallCount else {
            lastOpenStallCount = stalls.openStallCount
            return
        }
        lastOpenStallCount = stalls.openStallCount
        reporter.submit(
            ExternalStallReporter.Batch(
                events: events.map {
                    ($0, $0.kind == .detected ? ExternalStall.ThreadView(pid: $0.pid, tid: $0.tid) : nil)
                },
                openStallIDs: stalls.openStallIDs, unwatched: unwatched))
        unwatched = []
    }
}
