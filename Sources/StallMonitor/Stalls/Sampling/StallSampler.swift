#if STALLMON_LINUX
import CStallCapture
import Logging
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What the samples of one stall saw: their counts, the kernel's view, the stacks and, when there is
/// none, why.
struct StallSamples {
    var samples = 0
    /// Samples that got no stack of their own (the latest stack of the stall may stand in).
    var unanswered = 0
    var kernel = KernelViewTally()
    var stacks: StackAggregator
    var firstStack: [UInt] = []
    var firstSource = StallReport.StackSource.signal
    /// The latest stack sampled, reused when a blocked thread cannot be unwound again.
    var latestStack: [UInt]?
    var noStackReason: String?
    /// Why the thread cannot be signalled at all (read with the first sample), or `nil`.
    fileprivate var blockedReason: String??
    /// The request the stalled work serves, looked up with the first samples (see ``StallRequestHandle``).
    var request: StallRequestHandle?
    fileprivate var requestLooks = 0
    /// The thread a perf event was opened on for this stall, and the sampler slot that holds it:
    /// closed when the stall ends (``endSampling()``).
    fileprivate var perfEvent: (slot: Int32, thread: pid_t)?

    /// Closes the perf event of the stall, if one was opened: an event never outlives its stall.
    mutating func endSampling() {
        guard let perfEvent else { return }
        stallmon_perf_close_thread(perfEvent.slot, perfEvent.thread)
        self.perfEvent = nil
    }

    init(capacity: Int) {
        stacks = StackAggregator(capacity: capacity)
    }

    /// The stacks of a detected report: the first one, if any, and how it was taken.
    var detectedStacks: (stacks: [(stack: [UInt], count: Int)], sources: [StallReport.StackSource]) {
        firstStack.isEmpty ? ([], []) : ([(firstStack, 1)], [firstSource])
    }
}

/// Samples stalled threads for one watchdog thread: the kernel's view and the stack of each
/// sample. A thread that runs is sampled by a perf event on it where the kernel allows (no signal),
/// else signalled, and its handler copies its stack for the watchdog to unwind; by default a thread
/// in a system call is never signalled (a handler would end `nanosleep`, `poll`, `epoll_wait`…
/// with EINTR): it is unwound in place from the kernel's view of it. A thread that blocks the
/// signal, or a signal the program took over, is not signalled at all.
///
/// It owns the buffer the C sampler fills, so it is used on the watchdog thread only.
final class StallSampler {
    private let slot: Int32
    private let signal: Int32?
    private let maximumFrames: Int
    private let sampleTimeout: Duration
    private let interruptBlockedThreads: Bool
    private let stackSource: StallMonitor.Configuration.StackSource
    private let logger: Logger?
    /// Said once per process on a logger: the kernel refused a perf event.
    private static let perfRefusalLogged = Atomic<Bool>(false)
    private var sample = stallmon_sample()
    /// The thread's signal mask, read at most once a second per thread.
    private var signalChecked: [pid_t: (time: UInt64, problem: String?)] = [:]
    /// Said once on the logger: the program took the sampling signal over; a signal ended one of
    /// its system calls.
    private var signalTakenLogged = false
    private var interruptionLogged = false

    /// - Parameters:
    ///   - signal: The sampling signal, `nil` when none was free.
    ///   - slot: The sampler slot of the watchdog thread.
    ///   - interruptBlockedThreads: Whether a thread in a system call is signalled too.
    ///   - logger: Where the program's takeover of the signal and an interrupted call are said, once.
    init(
        configuration: StallMonitor.Configuration, signal: Int32?, slot: Int32, interruptBlockedThreads: Bool,
        logger: Logger?
    ) {
        self.slot = slot
        self.signal = signal
        self.maximumFrames = configuration.maximumFrames
        self.sampleTimeout = configuration.sampleTimeout
        self.interruptBlockedThreads = interruptBlockedThreads
        self.stackSource = configuration.stackSource
        self.logger = logger
        stallmon_sampler_set_perf_period(slot, UInt64(configuration.sampleInterval.nanoseconds))
    }

    /// Takes one sample of a stalled loop into `stall`: the kernel's view (every 100 ms at most) and
    /// the stack.
    /// - Returns: `false` when the sample shows the loop idle in its own wait: then there is no
    ///   stall, and the sample is not counted.
    func sample(_ stall: inout StallSamples, of loop: some SampledThread, inspector: ThreadInspector) -> Bool {
        if stall.blockedReason == nil { stall.blockedReason = signalProblem(of: inspector) }
        stall.samples += 1
        let viewed = stall.kernel.look(at: inspector, now: MonotonicClock.now())
        func idle() -> Bool {
            stall.samples -= 1
            if let viewed { stall.kernel.forget(viewed) }
            return false
        }
        let idleTest = loop.idleTest()
        if case .waitCall(let isIdle) = idleTest, isIdle(viewed?.syscall ?? inspector.syscall()) {
            return idle()
        }
        guard let (addresses, source) = capture(&stall, threadID: loop.threadID) else {
            findRequest(&stall, threadID: loop.threadID, signalled: false)
            stall.unanswered += 1
            return true
        }
        if case .waitFunction(let function) = idleTest, IdleTest.isInWait(addresses, function: function) {
            return idle()
        }
        // A sample that got no stack of its own counts as unanswered; the latest stack of the
        // stall stands in for it.
        if source == .previous { stall.unanswered += 1 }
        findRequest(&stall, threadID: loop.threadID, signalled: source == .signal)
        stall.stacks.add(addresses, source: source)
        if stall.firstStack.isEmpty { (stall.firstStack, stall.firstSource) = (addresses, source) }
        return true
    }

    /// Looks the stalled thread's request up, at the first two samples until one finds it (a
    /// sample that got no stack looks by the pool job and the thread alone).
    private func findRequest(_ stall: inout StallSamples, threadID: pid_t, signalled: Bool) {
        guard stall.request == nil, stall.requestLooks < 2 else { return }
        stall.requestLooks += 1
        stall.request = StallRequestHandle.find(
            threadID: threadID, currentTask: signalled ? UInt(sample.current_task) : 0,
            currentTaskID: signalled ? sample.current_task_id : 0)
    }

    /// The stack of one sample and how it was taken, or `nil` (with the reason in `stall`).
    private func capture(_ stall: inout StallSamples, threadID: pid_t) -> (
        stack: [UInt], source: StallReport.StackSource
    )? {
        let blockedReason = stall.blockedReason ?? nil
        var flags = interruptBlockedThreads ? 0 : Int32(STALLMON_SAMPLE_SPARE_SYSCALLS)
        if blockedReason != nil {
            flags = Int32(STALLMON_SAMPLE_SPARE_SYSCALLS | STALLMON_SAMPLE_NO_SIGNAL)
        }
        // A perf event cannot read which Swift task the thread runs, which names the stall's request
        // where the pool's records do not (a main-actor job): while request spans are in use and
        // the stall's request is not known yet, its first two samples are the signal's, in auto.
        let wantsTask = stall.request == nil && stall.requestLooks < 2 && stallmon_request_used() != 0
        switch stackSource {
        case .auto: if !wantsTask { flags |= Int32(STALLMON_SAMPLE_PERF) }
        case .perf: flags |= Int32(STALLMON_SAMPLE_PERF_ONLY)
        case .signal: break
        }
        stallmon_sample_stack(
            slot, threadID, signal ?? 0, Int32(maximumFrames), UInt64(sampleTimeout.nanoseconds), flags, &sample
        )
        if sample.source == Int32(STALLMON_STACK_PERF.rawValue) { stall.perfEvent = (slot, threadID) }
        if stackSource != .signal { notePerfRefusal() }
        if sample.interrupted_syscall != 0 { noteInterruptedSyscall() }
        switch sample.status {
        case Int32(STALLMON_SAMPLE_OK.rawValue):
            let count = Int(sample.frame_count)
            let stack = withUnsafeBytes(of: sample.frames) { raw in
                Array(raw.bindMemory(to: UInt.self).prefix(count))
            }
            stall.latestStack = stack
            let source: StallReport.StackSource =
                switch sample.source {
                case Int32(STALLMON_STACK_KERNEL.rawValue): .kernel
                case Int32(STALLMON_STACK_PERF.rawValue): .perf
                default: .signal
                }
            return (stack, source)
        case Int32(STALLMON_SAMPLE_PERF_REFUSED.rawValue):
            stall.noStackReason =
                sample.error == 0
                ? "the watchdog has as many perf events open as it may (stack_source perf)"
                : "the kernel refused a perf event (\(String(cString: strerror(sample.error)))) and stack_source is perf"
        case Int32(STALLMON_SAMPLE_SIGNAL_TAKEN.rawValue) where blockedReason != nil:
            stall.noStackReason = blockedReason
        case Int32(STALLMON_SAMPLE_SIGNAL_TAKEN.rawValue):
            stall.noStackReason = signalTaken(sample.disposition)
        case Int32(STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED.rawValue):
            if let latest = stall.latestStack { return (latest, .previous) }
            let why = sample.error == EAGAIN ? "it kept waking up" : "libunwind error \(sample.error)"
            stall.noStackReason =
                "blocked in \(SyscallNames.name(Int(sample.syscall))) and not unwound from the kernel's view (\(why))"
        case Int32(STALLMON_SAMPLE_SYSCALL_BUSY.rawValue):
            if let latest = stall.latestStack { return (latest, .previous) }
            stall.noStackReason = "thread kept blocking in short system calls, which a signal would end with EINTR"
        case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue) where sample.error == EAGAIN:
            stall.noStackReason =
                "thread has not run since the last sample request (blocked in the kernel or descheduled)"
        case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue) where sample.error == EDEADLK:
            stall.noStackReason = "the sampler is stuck in an earlier unwind"
        case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue):
            stall.noStackReason = "thread did not answer within \(sampleTimeout.milliseconds) ms"
        case Int32(STALLMON_SAMPLE_SEND_FAILED.rawValue):
            stall.noStackReason = "signal could not be sent (errno \(sample.error))"
        default:
            stall.noStackReason = "unwinding failed (\(sample.error))"
        }
        return nil
    }

    /// Why the thread cannot be signalled at all, or `nil` when it can (`SigBlk`, read at most once
    /// a second).
    private func signalProblem(of inspector: ThreadInspector) -> String? {
        guard let signal else { return "no free signal for sampling" }
        let now = MonotonicClock.now()
        if let checked = signalChecked[inspector.threadID], now - checked.time < 1_000_000_000 {
            return checked.problem
        }
        let problem = inspector.blocks(signal) ? "thread blocks \(SignalName.name(of: signal))" : nil
        signalChecked[inspector.threadID] = (now, problem)
        return problem
    }

    /// Why running threads get no stack while the program owns the sampling signal; said once on
    /// the logger too. The signal is not sent: SIG_DFL would kill the program, SIG_IGN drop it, and
    /// a handler of the program's would run its code.
    private func signalTaken(_ disposition: Int32) -> String {
        let name = signal.map(SignalName.name(of:)) ?? "the sampling signal"
        let how =
            switch disposition {
            case Int32(STALLMON_DISPOSITION_DEFAULT.rawValue): "reset it to SIG_DFL"
            case Int32(STALLMON_DISPOSITION_IGNORED.rawValue): "ignores it"
            default: "installed its own handler"
            }
        let reason = "the program took over \(name) (\(how)); it is not sent, so only blocked threads are sampled"
        if let logger, !signalTakenLogged {
            signalTakenLogged = true
            logger.warning(
                "the program took over the sampling signal after the monitor started; stalls on the CPU get no stack",
                metadata: ["stallmon.signal": "\(name)", "stallmon.disposition": "\(how)"]
            )
        }
        return reason
    }

    /// The kernel refused a perf event (said once per process): where and why, and what follows.
    private func notePerfRefusal() {
        var step: Int32 = 0
        let error = stallmon_perf_refusal(&step)
        guard error != 0, let logger, !Self.perfRefusalLogged.exchange(true, ordering: .relaxed) else { return }
        let fallback =
            stackSource == .perf
            ? "stack_source is perf: running threads get no stack"
            : "running threads are sampled with the signal from now on"
        if step == Int32(STALLMON_PERF_STEP_SECCOMP.rawValue) {
            logger.warning(
                """
                no perf event tried: a seccomp filter applies to the process, and a filter may kill it for a \
                call it does not list; \(fallback) (set stack_source to perf where the filter allows \
                perf_event_open)
                """)
            return
        }
        let call = step == Int32(STALLMON_PERF_STEP_MAP.rawValue) ? "mmap of its ring" : "perf_event_open"
        logger.warning(
            """
            the kernel refused a perf event (\(call): \(String(cString: strerror(error)))); \(fallback) \
            (allow it with kernel.perf_event_paranoid <= 2, CAP_PERFMON, a seccomp filter that allows \
            perf_event_open)
            """)
    }

    /// The handler found it had ended a system call of the program with EINTR: the thread entered
    /// the call within microseconds of the last look, or blocked threads are interrupted by choice.
    private func noteInterruptedSyscall() {
        guard let logger, !interruptionLogged else { return }
        interruptionLogged = true
        logger.warning(
            "a sample interrupted a system call of the monitored thread, which returned EINTR",
            metadata: ["stallmon.interrupt_blocked_threads": "\(interruptBlockedThreads)"]
        )
    }
}
#endif  // STALLMON_LINUX
