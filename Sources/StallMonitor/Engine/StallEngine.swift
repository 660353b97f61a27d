#if STALLMON_LINUX
import CStallCapture
import Logging
import StallJournal
import Synchronization

/// The watch loop every watchdog runs, whatever loop it watches (``run(_:)``), and the steps of a
/// stall: it begins one (suppressed in the startup grace period or under a debugger), samples it at
/// the sample interval, reports it when detected, before a service-manager kill and when it ends,
/// and tells waits that a stop of the process made late from waits that merely waited for a CPU.
/// A ``WatchdogBackend`` answers what differs per kind of loop; the engine knows nothing of the
/// loops' kinds.
///
/// Used on the watchdog thread, but for the counters and ``beginStopping()``.
final class StallEngine: @unchecked Sendable {
    let configuration: StallMonitor.Configuration
    let threshold: UInt64
    let sampleInterval: UInt64
    let startedAt = MonotonicClock.now()
    /// Tells a stop of the process (SIGSTOP and SIGCONT, a debugger) from a late wakeup: time the
    /// process spent stopped is no loop's stall.
    let stops: StopDetector
    let sampler: StallSampler
    private let stopping = Atomic<Bool>(false)
    private let stallCount = Atomic<Int>(0)
    private let wakeupCount = Atomic<Int>(0)
    private let watchdogThreadID = Atomic<Int32>(0)
    /// When the process last resumed from a stop: no work item counts from before it, whichever
    /// one a thread is in by the time the watchdog looks.
    private(set) var resumedAt: UInt64 = 0
    /// When the latest wait of ``run(_:)`` ended, and the deadline it was given (`UInt64.max`: none).
    private(set) var lastWake: (woke: UInt64, deadline: UInt64) = (0, .max)

    /// - Parameters:
    ///   - signal: The sampling signal, `nil` when none was free.
    ///   - slot: The sampler slot of the watchdog thread.
    ///   - interruptBlockedThreads: Whether a thread in a system call is signalled too.
    ///   - logger: Where the sampler says, once, that the program took its signal over.
    init(
        configuration: StallMonitor.Configuration, signal: Int32?, slot: Int32, interruptBlockedThreads: Bool,
        logger: Logger?
    ) {
        self.configuration = configuration
        threshold = UInt64(configuration.threshold.nanoseconds)
        sampleInterval = UInt64(configuration.sampleInterval.nanoseconds)
        stops = StopDetector(threshold: threshold, sampleTimeout: UInt64(configuration.sampleTimeout.nanoseconds))
        sampler = StallSampler(
            configuration: configuration, signal: signal, slot: slot,
            interruptBlockedThreads: interruptBlockedThreads, logger: logger)
    }

    // MARK: - The thread

    /// The watchdog thread's kernel id (0 until it runs).
    var threadID: pid_t { watchdogThreadID.load(ordering: .acquiring) }
    var stalls: Int { stallCount.load(ordering: .relaxed) }
    var wakeups: Int { wakeupCount.load(ordering: .relaxed) }
    var isStopping: Bool { stopping.load(ordering: .acquiring) }

    func noteThreadStarted() { watchdogThreadID.store(stallmon_gettid(), ordering: .releasing) }
    func beginStopping() { stopping.store(true, ordering: .releasing) }
    func noteWakeup() { wakeupCount.add(1, ordering: .relaxed) }

    // MARK: - The watch loop

    /// The watchdog thread's loop, until ``beginStopping()``: `backend` looks at its threads and
    /// says when it must look again, the engine waits through it, and a wait that a stop of the
    /// process made late restarts what was being timed (``noteResumed(at:)``). At the end, the
    /// stalls in progress get their ended reports.
    func run(_ backend: some WatchdogBackend) {
        stops.runQueue.open()
        defer { stops.runQueue.close() }
        while !isStopping {
            let next = backend.visit(now: MonotonicClock.now())
            guard !isStopping else { break }
            // A deadline already past when the wait begins (the visit ran late) asks for no sleep:
            // lateness counts from the wait's start.
            let deadline = max(next ?? .max, MonotonicClock.now())
            stops.measuringWait { backend.wait(until: next) }
            noteWakeup()
            let woke = MonotonicClock.now()
            lastWake = (woke, deadline)
            if stops.wasStopped(wokeAt: woke, deadline: deadline) {
                noteResumed(at: woke)
                backend.restartAfterStop(now: woke)
            }
        }
        backend.finishStalls(end: MonotonicClock.now())
    }

    /// The process resumed from a stop at `now` (the latest wait woke that late, or a backend saw
    /// a work item begin that long before the watchdog could look).
    func noteResumed(at now: UInt64) { resumedAt = max(resumedAt, now) }

    /// Where a work item that began at `start` counts from: not before the latest resume.
    func countedStart(_ start: UInt64) -> UInt64 { max(start, resumedAt) }

    // MARK: - Stall steps

    /// Whether a stall detected at `now` goes unreported: inside the startup grace period, or
    /// under a debugger unless the configuration wants reports then.
    func isSuppressed(at now: UInt64) -> Bool {
        isInGracePeriod(now) || (!configuration.reportWhileDebuggerAttached && ThreadInspector.tracerPID() != 0)
    }

    func isInGracePeriod(_ now: UInt64) -> Bool {
        now < startedAt + UInt64(configuration.startupGracePeriod.nanoseconds)
    }

    /// A stall of the window (cycle, job) `sequence` that counts from `start`, detected at `now`;
    /// its first sample is due at once, the next one a sample interval later.
    func beginStall(
        start: UInt64, sequence: UInt64, now: UInt64, activity: StallReport.Activity, runLoopMode: String = "none",
        threadID: Int? = nil
    ) -> StallInProgress {
        StallInProgress(
            start: start, sequence: sequence, suppressed: isSuppressed(at: now), nextSample: now + sampleInterval,
            capacity: configuration.maximumStacks, activity: activity, runLoopMode: runLoopMode, threadID: threadID)
    }

    /// One sample of the stalled thread of `source`.
    /// - Returns: `false` when it shows the loop idle in its own wait: then there is no stall.
    @discardableResult
    func sample(_ stall: StallInProgress, of source: some SampledThread, inspector: ThreadInspector) -> Bool {
        sampler.sample(&stall.samples, of: source, inspector: inspector)
    }

    /// Moves the next sample of `stall` on by an interval, or to an interval from now when the
    /// sample ran late past it.
    func scheduleNextSample(_ stall: StallInProgress) {
        stall.nextSample += sampleInterval
        let now = MonotonicClock.now()
        if stall.nextSample < now { stall.nextSample = now + sampleInterval }
    }

    /// Samples `stall` when its next sample is due at `now`, and schedules the one after.
    /// - Returns: `false` when the sample showed the loop idle (the schedule is left as it was).
    @discardableResult
    func sampleIfDue(_ stall: StallInProgress, of source: some SampledThread, inspector: ThreadInspector, now: UInt64)
        -> Bool
    {
        guard now >= stall.nextSample else { return true }
        guard sample(stall, of: source, inspector: inspector) else { return false }
        scheduleNextSample(stall)
        return true
    }

    /// The report of `stall` at `end` (now while it lasts).
    /// - Parameters:
    ///   - paused: How long the process was stopped in it.
    ///   - cpu: The CPU time the thread used in a stall of the duration it is given.
    func captured(
        _ stall: StallInProgress, _ event: StallReport.Event, end: UInt64, paused: UInt64 = 0,
        cpu: (_ duration: UInt64) -> UInt64
    ) -> CapturedStall {
        let stacks = event == .detected ? stall.samples.detectedStacks : stall.samples.allStacks
        var report = CapturedStall(
            event, of: stall.samples, stallID: stall.stallID, start: stall.start, end: end, paused: paused,
            activity: stall.activity, runLoopMode: stall.runLoopMode, stacks: stacks, cpu: cpu)
        report.threadID = stall.threadID
        return report
    }

    /// Hands the detected report of `stall` to `reporter`, unless it is suppressed.
    func reportDetected(
        _ stall: StallInProgress, paused: UInt64 = 0, to reporter: Reporter, cpu: (_ duration: UInt64) -> UInt64
    ) {
        guard !stall.suppressed else { return }
        reporter.submit(captured(stall, .detected, end: MonotonicClock.now(), paused: paused, cpu: cpu))
    }

    /// Counts `stall`, which ended at `end`, and hands its ended report to `reporter` unless it is
    /// suppressed.
    func finishStall(
        _ stall: StallInProgress, end: UInt64, paused: UInt64 = 0, to reporter: Reporter,
        cpu: (_ duration: UInt64) -> UInt64
    ) {
        stallCount.add(1, ordering: .relaxed)
        stall.samples.endSampling()
        guard !stall.suppressed else { return }
        reporter.submit(captured(stall, .ended, end: end, paused: paused, cpu: cpu))
    }

    /// When the final report of `stall` is due, and systemd's deadline; `nil` when none is.
    /// - Parameter pings: The pings of a backend that pings the service manager itself: its loop's
    ///   stall held them back, so the report is due before systemd's kill whatever the stall's
    ///   age. `nil` for a loop whose watchdog does not ping: under `WatchdogSec=`, the report is due
    ///   for a stall that will have held its loop past half the interval by then (the process's
    ///   pinger holds the pings back for it, ``ServiceHealth``), early enough to land before the kill.
    ///
    /// A kill ends the service whatever suppressed the stall's other reports: the final one goes
    /// out for a suppressed stall too.
    func finalReportDue(_ stall: StallInProgress, pings: ServiceWatchdogSchedule? = nil)
        -> (due: UInt64, deadline: UInt64, interval: UInt64)?
    {
        guard !stall.finalReportWritten else { return nil }
        if let pings { return (pings.finalReportTime, pings.deadline, pings.interval) }
        guard let schedule = ServiceHealth.shared.finalReport, schedule.due >= stall.start + schedule.interval / 2
        else { return nil }
        return schedule
    }

    /// Writes the final report of `stall` once ``finalReportDue(_:pings:)`` says it is due at
    /// `now`, and waits until the sinks have it or systemd's deadline passes.
    func reportBeforeKillIfDue(
        _ stall: StallInProgress, now: UInt64, pings: ServiceWatchdogSchedule? = nil, paused: UInt64 = 0,
        to reporter: Reporter, cpu: (_ duration: UInt64) -> UInt64
    ) {
        guard let schedule = finalReportDue(stall, pings: pings), now >= schedule.due else { return }
        stall.finalReportWritten = true
        var report = captured(stall, .watchdog, end: MonotonicClock.now(), paused: paused, cpu: cpu)
        report.watchdogInterval = schedule.interval
        reporter.submitNow(report, waitingUntil: schedule.deadline)
    }

    /// When the engine must look at `stall` next: its next sample, or its final report when that
    /// comes first.
    func nextLook(at stall: StallInProgress, pings: ServiceWatchdogSchedule? = nil) -> UInt64 {
        min(stall.nextSample, finalReportDue(stall, pings: pings)?.due ?? .max)
    }

    /// The share of CPU `threadID` used since `base`, applied to a whole stall of the duration
    /// given (which may have begun before `base`); 0 where the thread's clock cannot be read.
    static func cpuShare(of threadID: pid_t, since base: (cpu: Int64, time: UInt64)) -> (UInt64) -> UInt64 {
        { duration in
            let used = stallmon_thread_cpu_ns(threadID)
            let readAt = MonotonicClock.now()
            guard base.cpu >= 0, used >= base.cpu, readAt > base.time else { return 0 }
            let share = min(1, Double(used - base.cpu) / Double(readAt - base.time))
            return UInt64(share * Double(duration))
        }
    }
}
#endif  // STALLMON_LINUX
