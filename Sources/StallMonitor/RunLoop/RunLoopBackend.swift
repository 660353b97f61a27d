#if STALLMON_LINUX
import CStallCapture
import CoreFoundation
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// The ``WatchdogBackend`` of a run loop, and of the main queue an async main drains: reads the
/// windows the observers (or the drain) publish in the loop's ring (`loop.c`), sleeps until the
/// current window could become a stall, parks while the loop is idle, and samples the stalled
/// thread while a stall lasts. It pings the service manager's watchdog (`WATCHDOG=1`) too.
final class RunLoopBackend: WatchdogBackend {
    struct Target: @unchecked Sendable {
        var threadID: pid_t
        var loopName: String
        var runLoop: CFRunLoop
    }

    let engine: StallEngine
    /// The loop as the sampler sees it.
    let source: RunLoopSource
    /// The observer's state; the watchdog holds one reference.
    let loop: OpaquePointer
    let semaphore: DispatchSemaphore
    private let slot: Int32
    private let inspector: ThreadInspector
    private let clocks: ThreadClocks
    private let reporter: Reporter

    // Owned by the watchdog thread.
    /// The loop's phase: `idle` while it sleeps or runs outside its windows, `timing` a window
    /// (counted from the window's start as the watchdog last looked), `stalled` one past the
    /// threshold, with ``stall`` holding the run loop's part of it.
    private var phase = WatchPhase.idle
    private var stall: Stall?
    /// Why the watchdog waits, when it waits parked or on a quiet loop: what its next look learns
    /// from that wait.
    private var waiting: Waiting?
    private var armedSequence: UInt64 = 0
    /// The thread's CPU clock when the watchdog first saw the armed window, and the reading
    /// before that (with whether the loop slept from it until the window began).
    private var armedReading: CPUReading?
    private var armedBefore: (reading: CPUReading, sleptUntilStart: Bool)?
    /// The latest reading of the thread's CPU clock, the transition it was taken in, and whether
    /// the loop slept in that transition when it was taken.
    private var lastCPUReading: (reading: CPUReading, sequence: UInt64, asleep: Bool)?
    /// A window may not count from before this point (set after a stop, an idle sample or an allowed stall).
    private var floor: (sequence: UInt64, time: UInt64) = (0, 0)
    /// Whether the next idle phase parks the watchdog. After the observer woke it, it first waits
    /// out one quiet threshold: a loop that sleeps briefly on every pass would otherwise wake it
    /// on every pass.
    private var parkNext = true
    /// Pings of the service manager's watchdog, when the service runs with `WatchdogSec=`.
    private var serviceWatchdog: ServiceWatchdogSchedule?
    /// Whether the loop has turned since the start, and whether the monitor warned that it did not.
    private var firstTurn = FirstTurn.awaited
    private let notice: @Sendable (LoopNotice) -> Void
    /// Hands the loop's latency histogram to the metrics backend while the watchdog is awake anyway.
    let latency: LoopLatencyExporter?

    /// What the monitor tells its logger about the loop itself (not about a stall).
    enum LoopNotice: Sendable {
        /// The loop has not turned once in `waited` nanoseconds since the monitor started.
        case notTurning(waited: UInt64)
        /// The loop turned for the first time, in time.
        case turned
        /// The loop turned for the first time `waited` nanoseconds after the start, after a warning.
        case turnedLate(waited: UInt64)
    }

    private enum FirstTurn {
        case awaited
        case warned
        case seen
    }

    init(
        engine: StallEngine, target: Target, loop: OpaquePointer, semaphore: DispatchSemaphore, slot: Int32,
        reporter: Reporter, notice: @escaping @Sendable (LoopNotice) -> Void, latency: LoopLatencyExporter? = nil
    ) {
        self.engine = engine
        self.latency = latency
        self.source = RunLoopSource(threadID: target.threadID, runLoop: target.runLoop)
        self.loop = loop
        self.semaphore = semaphore
        self.slot = slot
        self.inspector = ThreadInspector(threadID: target.threadID)
        self.clocks = ThreadClocks(threadID: target.threadID)
        self.reporter = reporter
        self.notice = notice
        self.serviceWatchdog = ServiceNotifier.watchdogInterval().map {
            ServiceWatchdogSchedule(interval: $0, now: MonotonicClock.now())
        }
    }

    /// One of the monitor's observers, for telling the modes it sees from those it does not.
    func setObserver(_ observer: CFRunLoopObserver) {
        source.setObserver(observer)
    }

    /// The watchdog thread's name, in Foundation and in the kernel (at most 15 bytes).
    static let threadName = "stallmon-watch"
    var threadName: String { Self.threadName }

    func willStart() {
        if serviceWatchdog != nil {
            // A held-back ping goes out as soon as another watchdog's wedged loop recovers.
            let semaphore = self.semaphore
            ServiceHealth.shared.addPinger(self) { semaphore.signal() }
        }
    }

    func wakeForStop() { semaphore.signal() }

    func didStop() { ServiceHealth.shared.removePinger(self) }

    private var threshold: UInt64 { engine.threshold }
    private var configuration: StallMonitor.Configuration { engine.configuration }
    private var stops: StopDetector { engine.stops }

    // MARK: - Watching

    /// What a wait that is not a window's was for.
    private enum Waiting {
        /// Parked before the loop's first transition.
        case firstTurn
        /// Parked while the loop slept or ran outside its windows after transition `sequence`.
        case parked(sequence: UInt64)
        /// Parking was unsafe: a threshold's wait instead.
        case polling
        /// A quiet threshold's wait after the observer woke the watchdog, before it parks again.
        case quiet(sequence: UInt64)
    }

    func visit(now: UInt64) -> UInt64? {
        if let waiting {
            self.waiting = nil
            endWait(waiting)
        }
        if let stall = phase.stall {
            if let next = followStall(stall) { return next }
            // The stall ended; a stopping watchdog looks at nothing more.
            if engine.isStopping { return nil }
        }
        var event = stallmon_event()
        guard stallmon_loop_latest(loop, &event) == 1 else { return awaitFirstTurn() }
        if firstTurn != .seen {
            notice(firstTurn == .warned ? .turnedLate(waited: MonotonicClock.now() - engine.startedAt) : .turned)
            firstTurn = .seen
        }
        pingServiceWatchdog(event)
        latency?.exportIfDue()
        if event.phase == UInt32(STALLMON_LOOP_ACTIVE.rawValue) { return watchWindow(event) }
        phase = .idle
        noteCPUWhileIdle(event)
        if !parkNext {
            // A window that starts from now on cannot cross the threshold before now + threshold,
            // so this wait delays no detection. A loop that stays quiet throughout gets the
            // watchdog parked next time.
            waiting = .quiet(sequence: event.sequence)
            return cappedByPing(MonotonicClock.now() + threshold)
        }
        // Asleep or outside the loop: nothing can stall until the observer wakes us (or the
        // service manager's watchdog wants its next ping).
        return park(after: event.sequence, until: serviceWatchdog?.nextPing, pollingUntil: cappedByPing)
    }

    /// Parks the watchdog until the observer publishes a transition after `sequence` (0: the
    /// first), or until `deadline`; where parking is unsafe, a wait of a threshold (passed
    /// through `polling`) instead. Returns the deadline of the wait.
    private func park(after sequence: UInt64, until deadline: UInt64?, pollingUntil polling: (UInt64) -> UInt64)
        -> UInt64?
    {
        switch stallmon_loop_park(loop, sequence) {
        case 1:
            waiting = sequence == 0 ? .firstTurn : .parked(sequence: sequence)
            return deadline
        case -1:
            waiting = .polling
            return polling(MonotonicClock.now() + threshold)
        default:
            // A transition came first: look again at once.
            _ = stallmon_loop_unpark(loop)
            return MonotonicClock.now()
        }
    }

    /// What the watchdog learns from a wait it took outside a window.
    private func endWait(_ waiting: Waiting) {
        switch waiting {
        case .firstTurn, .polling:
            _ = stallmon_loop_unpark(loop)
        case .parked(let sequence):
            _ = stallmon_loop_unpark(loop)
            noteLateWakeFromPark(after: sequence)
            parkNext = false
        case .quiet(let sequence):
            var latest = stallmon_event()
            parkNext = stallmon_loop_latest(loop, &latest) == 1 && latest.sequence == sequence
        }
    }

    /// Waits on the semaphore, which the observer signals, until `deadline`.
    func wait(until deadline: UInt64?) {
        guard let deadline else {
            semaphore.wait()
            return
        }
        let now = MonotonicClock.now()
        if deadline > now { _ = semaphore.wait(timeout: .now() + .nanoseconds(Int(deadline - now))) }
    }

    /// A stall in progress ends where its window ended, when it closed before the stop.
    func finishStalls(end: UInt64) {
        if waiting != nil { _ = stallmon_loop_unpark(loop) }
        waiting = nil
        guard let core = phase.stall, let stall else { return }
        accountLatestWait()
        finishStall(end: windowEnd(of: core, watchedAt: stall.watchedAt) ?? end)
    }

    // MARK: - Before the loop turns

    /// No transition yet: the loop does not run (an async main that never runs the main run loop, a
    /// thread that never runs its own), or the monitor started inside a callout. A loop never seen
    /// turning is not healthy, so the service watchdog gets no ping; nothing can stall either, so
    /// the watchdog parks until the first transition wakes it, once waking at the deadline to warn.
    private func awaitFirstTurn() -> UInt64? {
        var deadline: UInt64?
        if firstTurn == .awaited {
            let grace = UInt64(configuration.startupGracePeriod.nanoseconds)
            let timeout = UInt64(configuration.loopStartTimeout.nanoseconds)
            // Under a service watchdog, the warning lands before systemd kills the service for the missing pings.
            deadline = min(engine.startedAt + grace + timeout, serviceWatchdog?.finalReportTime ?? .max)
            if let due = deadline, MonotonicClock.now() >= due {
                firstTurn = .warned
                notice(.notTurning(waited: MonotonicClock.now() - engine.startedAt))
                return MonotonicClock.now()
            }
        }
        return park(after: 0, until: deadline) { min(deadline ?? .max, $0) }
    }

    /// Reads the thread's CPU clock once per sleep of the loop: while the loop sleeps, that is the
    /// clock at the start of the next window (see ``StallCPUAccount``).
    private func noteCPUWhileIdle(_ event: stallmon_event) {
        guard event.phase == UInt32(STALLMON_LOOP_ASLEEP.rawValue), lastCPUReading?.sequence != event.sequence,
            let reading = clocks.read()
        else { return }
        // Asleep at the reading only if no transition came between the event and the reading.
        var latest = stallmon_event()
        let stillAsleep = stallmon_loop_latest(loop, &latest) == 1 && latest.sequence == event.sequence
        lastCPUReading = (reading, event.sequence, stillAsleep)
    }

    // MARK: - Service watchdog

    /// Pings `WATCHDOG=1` when one is due and the loop is healthy: idle, outside the loop, inside
    /// `allowingStall`, or in a window younger than the threshold. A loop with no transition yet
    /// never gets here.
    private func pingServiceWatchdog(_ event: stallmon_event) {
        guard serviceWatchdog != nil else { return }
        let now = MonotonicClock.now()
        var healthy = true
        if event.phase == UInt32(STALLMON_LOOP_ACTIVE.rawValue), stallmon_loop_allowed(loop) == 0 {
            healthy = now < windowStart(of: event) + threshold
        }
        serviceWatchdog?.pingIfDue(now: now, healthy: healthy)
    }

    /// `deadline`, or the next ping of the service watchdog when that comes first.
    private func cappedByPing(_ deadline: UInt64) -> UInt64 {
        guard let nextPing = serviceWatchdog?.nextPing, nextPing > MonotonicClock.now() else { return deadline }
        return min(deadline, nextPing)
    }

    /// Times the loop's current window; returns when to look again.
    private func watchWindow(_ event: stallmon_event) -> UInt64? {
        if event.sequence != armedSequence {
            armedSequence = event.sequence
            armedBefore = lastCPUReading.map { ($0.reading, $0.asleep && $0.sequence + 1 == event.sequence) }
            armedReading = clocks.read()
            if let armedReading { lastCPUReading = (armedReading, event.sequence, false) }
            if !configuration.interruptBlockedThreads { stallmon_sampler_note_running(slot, source.threadID) }
        }
        let windowStart = windowStart(of: event)
        phase = .timing(start: windowStart, sequence: event.sequence)
        let deadline = windowStart + threshold
        let now = MonotonicClock.now()
        if now < deadline { return cappedByPing(deadline) }
        if stops.wasStoppedSinceWake() {
            // The process was stopped and continued since the watchdog woke: the time it spent
            // stopped is no stall, so the window counts from now.
            engine.noteResumed(at: now)
            return now
        }
        if stallmon_loop_allowed(loop) > 0 {
            // Work inside allowingStall: look again later; its end starts a fresh window.
            floor = (event.sequence, now)
            return now
        }
        return beginStall(event, windowStart: windowStart)
    }

    /// Where a window counts from: its first transition, unless the process resumed from a stop
    /// since, or the watchdog restarted the window (allowed work, an idle sample).
    private func windowStart(of event: stallmon_event) -> UInt64 {
        var start = engine.countedStart(event.timestamp_ns)
        if floor.sequence == event.sequence { start = max(start, floor.time) }
        return start
    }

    /// The observer wakes a parked watchdog within microseconds of the loop waking up. When the
    /// first window after the park is already old, and not because the watchdog waited for a CPU,
    /// the process was stopped in between (a debugger's stop sends no SIGCONT): that window counts
    /// from now.
    private func noteLateWakeFromPark(after parkedSequence: UInt64) {
        var event = stallmon_event()
        guard stallmon_loop_event_after(loop, parkedSequence, &event) == 1,
            event.phase == UInt32(STALLMON_LOOP_ACTIVE.rawValue)
        else { return }
        let now = MonotonicClock.now()
        if stops.isLate(now, after: event.timestamp_ns) {
            engine.noteResumed(at: now)
        }
    }

    // MARK: - Stalls

    /// The run loop's part of a window past the threshold while the watchdog samples it.
    private struct Stall {
        /// When the watchdog began to watch for the window's end.
        let watchedAt: UInt64
        var time: StallTimeAccount
        /// The end of the latest wait recorded in ``time``: each wait counts once.
        var accountedWake: UInt64

        /// The CPU time the thread used in `stall`, for a report that ends at `start + paused + duration`.
        func cpu(of stall: StallInProgress) -> (UInt64) -> UInt64 {
            { [time] duration in time.used(until: stall.start + time.paused + duration) }
        }
    }

    /// Begins the stall of a window past the threshold: asks the observer for its exact end, takes
    /// the first sample and hands over the detected report. Returns when to look again.
    private func beginStall(_ event: stallmon_event, windowStart: UInt64) -> UInt64 {
        stallmon_loop_watch(loop, event.sequence)
        let watchedAt = MonotonicClock.now()
        var latest = stallmon_event()
        guard stallmon_loop_latest(loop, &latest) == 1, latest.sequence == event.sequence,
            let (core, stall) = sampleFirst(event, windowStart: windowStart, watchedAt: watchedAt)
        else {
            // The window closed just as it crossed the threshold, or the loop idles in it.
            stallmon_loop_watch(loop, 0)
            return MonotonicClock.now()
        }
        phase = .stalled(core)
        self.stall = stall
        engine.reportDetected(core, paused: stall.time.paused, to: reporter, cpu: stall.cpu(of: core))
        core.nextSample = MonotonicClock.now() + engine.sampleInterval
        return engine.nextLook(at: core, pings: serviceWatchdog)
    }

    /// Takes the first sample of a window that crossed the threshold, and starts its time account.
    /// - Returns: The stall, or `nil` when the sample shows the loop idle in its own wait (a nested
    ///   run in a mode the observers do not see): then there is no stall.
    private func sampleFirst(_ event: stallmon_event, windowStart: UInt64, watchedAt: UInt64)
        -> (StallInProgress, Stall)?
    {
        let sequence = event.sequence
        let activity: StallReport.Activity =
            event.window == UInt32(STALLMON_WINDOW_AFTER_WAITING.rawValue) ? .afterWaiting : .beforeSources
        let core = engine.beginStall(
            start: windowStart, sequence: sequence, now: watchedAt, activity: activity,
            runLoopMode: source.currentMode())

        let startReading = clocks.read()
        var sampleBegan = stops.sampleStarts()
        guard engine.sample(core, of: source, inspector: inspector) else {
            floor = (sequence, MonotonicClock.now())
            return nil
        }
        let armed = armedSequence == sequence
        let time = StallTimeAccount(
            windowStart: windowStart, before: armed ? armedBefore?.reading : nil,
            sleptUntilStart: armed && armedBefore?.sleptUntilStart == true,
            after: [armed ? armedReading : nil, startReading].compactMap { $0 })
        var stall = Stall(watchedAt: watchedAt, time: time, accountedWake: engine.lastWake.woke)
        stall.time.record(clocks, stopped: stops.sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)
        return (core, stall)
    }

    /// After each wait of a stall: accounts the wait, writes the final report when due (with a
    /// service watchdog, no pings go out meanwhile), ends the stall once the window closed, and
    /// samples when due. Returns when to look again, `nil` once the stall has ended.
    private func followStall(_ core: StallInProgress) -> UInt64? {
        accountLatestWait()
        guard let stall else { return nil }
        // Not past systemd's deadline: should the stall end before it (and the reports queued
        // before this one not), the pings must resume.
        engine.reportBeforeKillIfDue(
            core, now: MonotonicClock.now(), pings: serviceWatchdog, paused: stall.time.paused, to: reporter,
            cpu: stall.cpu(of: core))
        if let end = windowEnd(of: core, watchedAt: stall.watchedAt) {
            finishStall(end: end)
            return nil
        }
        if MonotonicClock.now() >= core.nextSample {
            var sampleBegan = stops.sampleStarts()
            guard engine.sample(core, of: source, inspector: inspector) else {
                let end = MonotonicClock.now()
                floor = (core.sequence, end)
                finishStall(end: end)
                return nil
            }
            self.stall?.time.record(clocks, stopped: stops.sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)
            engine.scheduleNextSample(core)
        }
        return engine.nextLook(at: core, pings: serviceWatchdog)
    }

    /// Records the engine's latest wait, once, in the stall's time account: late by a stop, less
    /// any time spent waiting for a CPU (no stop); the thread's runnable time tells when the stop
    /// began.
    private func accountLatestWait() {
        let (woke, deadline) = engine.lastWake
        guard var stall, woke > stall.accountedWake else { return }
        stall.accountedWake = woke
        stall.time.record(
            clocks, stopped: stops.wasStopped(wokeAt: woke, deadline: deadline),
            late: stops.lateness(wokeAt: woke, deadline: deadline))
        self.stall = stall
    }

    /// The end of the stall's window, once the loop has left it.
    private func windowEnd(of core: StallInProgress, watchedAt: UInt64) -> UInt64? {
        let sequence = core.sequence
        var endTime: UInt64 = 0
        if stallmon_loop_watched_end(loop, sequence, &endTime) == 1 { return endTime }
        var current = stallmon_event()
        guard stallmon_loop_latest(loop, &current) == 1, current.sequence != sequence else { return nil }
        // The loop moved on. The observer records the end before it publishes the next
        // transition, so look again; if it never saw the watch, the transition that ended the
        // window is the exact end while it is still in the ring, and watchedAt (which it
        // preceded) bounds it otherwise.
        var next = stallmon_event()
        if stallmon_loop_watched_end(loop, sequence, &endTime) == 1 { return endTime }
        if stallmon_loop_event_after(loop, sequence, &next) == 1, next.timestamp_ns != 0 {
            return next.timestamp_ns
        }
        return watchedAt
    }

    /// Takes a reading after the end, and hands over the ended report.
    private func finishStall(end: UInt64) {
        guard let core = phase.stall, var stall else { return }
        stallmon_loop_watch(loop, 0)
        let sequence = core.sequence
        // The loop slept from the end through the reading if no transition followed its sleep.
        let reading = stall.time.recordAfterEnd(clocks)
        var afterEnd = stallmon_event()
        stall.time.sleptSinceEnd =
            stallmon_loop_latest(loop, &afterEnd) == 1 && afterEnd.sequence == sequence + 1
            && afterEnd.phase == UInt32(STALLMON_LOOP_ASLEEP.rawValue)
        if let reading { lastCPUReading = (reading, sequence, false) }
        phase = .idle
        self.stall = nil
        let time = stall.time
        engine.finishStall(core, end: end, paused: time.paused, to: reporter) { _ in time.used(until: end) }
    }
}
#endif  // STALLMON_LINUX
