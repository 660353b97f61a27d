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
    /// When the process last resumed from a stop: no window counts from before it, whichever
    /// window the loop is in by the time the watchdog looks.
    private var resumedAt: UInt64 = 0
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

    func run() {
        while !engine.isStopping {
            var event = stallmon_event()
            guard stallmon_loop_latest(loop, &event) == 1 else {
                awaitFirstTurn()
                continue
            }
            if firstTurn != .seen {
                notice(firstTurn == .warned ? .turnedLate(waited: MonotonicClock.now() - engine.startedAt) : .turned)
                firstTurn = .seen
            }
            pingServiceWatchdog(event)
            latency?.exportIfDue()
            switch event.phase {
            case UInt32(STALLMON_LOOP_ACTIVE.rawValue):
                watchWindow(event)
            default:
                noteCPUWhileIdle(event)
                if !parkNext {
                    // A window that starts from now on cannot cross the threshold before now +
                    // threshold, so this wait delays no detection. A loop that stayed quiet
                    // throughout gets the watchdog parked next time.
                    waitNoticingStops(until: cappedByPing(MonotonicClock.now() + threshold))
                    var latest = stallmon_event()
                    parkNext = stallmon_loop_latest(loop, &latest) == 1 && latest.sequence == event.sequence
                    continue
                }
                // Asleep or outside the loop: nothing can stall until the observer wakes us (or
                // the service manager's watchdog wants its next ping).
                switch stallmon_loop_park(loop, event.sequence) {
                case 1:
                    wait(until: serviceWatchdog?.nextPing)
                    noteLateWakeFromPark(after: event.sequence)
                    parkNext = false
                case -1:
                    // Parking is unsafe here: poll once per threshold instead.
                    waitNoticingStops(until: cappedByPing(MonotonicClock.now() + threshold))
                default:
                    break
                }
                _ = stallmon_loop_unpark(loop)
            }
        }
    }

    // MARK: - Before the loop turns

    /// No transition yet: the loop does not run (an async main that never runs the main run loop, a
    /// thread that never runs its own), or the monitor started inside a callout. A loop never seen
    /// turning is not healthy, so the service watchdog gets no ping; nothing can stall either, so
    /// the watchdog parks until the first transition wakes it, once waking at the deadline to warn.
    private func awaitFirstTurn() {
        var deadline: UInt64?
        if firstTurn == .awaited {
            let grace = UInt64(configuration.startupGracePeriod.nanoseconds)
            let timeout = UInt64(configuration.loopStartTimeout.nanoseconds)
            // Under a service watchdog, the warning lands before systemd kills the service for the missing pings.
            deadline = min(engine.startedAt + grace + timeout, serviceWatchdog?.finalReportTime ?? .max)
            if let due = deadline, MonotonicClock.now() >= due {
                firstTurn = .warned
                notice(.notTurning(waited: MonotonicClock.now() - engine.startedAt))
                return
            }
        }
        switch stallmon_loop_park(loop, 0) {
        case 1:
            wait(until: deadline)
        case -1:
            // Parking is unsafe here: poll once per threshold instead.
            wait(until: min(deadline ?? .max, MonotonicClock.now() + threshold))
        default:
            break
        }
        _ = stallmon_loop_unpark(loop)
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

    private func watchWindow(_ event: stallmon_event) {
        if event.sequence != armedSequence {
            armedSequence = event.sequence
            armedBefore = lastCPUReading.map { ($0.reading, $0.asleep && $0.sequence + 1 == event.sequence) }
            armedReading = clocks.read()
            if let armedReading { lastCPUReading = (armedReading, event.sequence, false) }
            if !configuration.interruptBlockedThreads { stallmon_sampler_note_running(slot, source.threadID) }
        }
        let windowStart = windowStart(of: event)
        let deadline = windowStart + threshold
        let now = MonotonicClock.now()
        if now < deadline {
            waitNoticingStops(until: cappedByPing(deadline))
            return
        }
        if stops.wasStoppedSinceWake() {
            // The process was stopped and continued since the watchdog woke: the time it spent
            // stopped is no stall, so the window counts from now.
            resumedAt = now
            return
        }
        if stallmon_loop_allowed(loop) > 0 {
            // Work inside allowingStall: look again later; its end starts a fresh window.
            floor = (event.sequence, now)
            return
        }
        handleStall(event, windowStart: windowStart)
    }

    /// Where a window counts from: its first transition, unless the process resumed from a stop
    /// since, or the watchdog restarted the window (allowed work, an idle sample).
    private func windowStart(of event: stallmon_event) -> UInt64 {
        var start = max(event.timestamp_ns, resumedAt)
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
            resumedAt = now
        }
    }

    /// Waits on the semaphore until `deadline` (CLOCK_MONOTONIC; `nil` waits for a signal only),
    /// and notes how long of it the thread spent waiting for a CPU; returns the time it woke.
    @discardableResult
    private func wait(until deadline: UInt64?) -> UInt64 {
        stops.measuringWait {
            if let deadline {
                let now = MonotonicClock.now()
                if deadline > now {
                    _ = semaphore.wait(timeout: .now() + .nanoseconds(Int(deadline - now)))
                }
            } else {
                semaphore.wait()
            }
        }
        return MonotonicClock.now()
    }

    /// Waits until `deadline`; when the process was stopped meanwhile, the current window counts
    /// from now.
    private func waitNoticingStops(until deadline: UInt64) {
        let woke = wait(until: deadline)
        if stops.wasStopped(wokeAt: woke, deadline: deadline) {
            resumedAt = MonotonicClock.now()
        }
    }

    // MARK: - Stalls

    /// A window past the threshold while the watchdog samples it.
    private struct Stall {
        /// The engine's part: counts from the window's start, numbered by its transition.
        let core: StallInProgress
        /// When the watchdog began to watch for the window's end.
        let watchedAt: UInt64
        var time: StallTimeAccount

        /// The CPU time the thread used in the stall, for a report that ends at `start + paused + duration`.
        func cpu(_ duration: UInt64) -> UInt64 { time.used(until: core.start + time.paused + duration) }
    }

    private func handleStall(_ event: stallmon_event, windowStart: UInt64) {
        stallmon_loop_watch(loop, event.sequence)
        defer { stallmon_loop_watch(loop, 0) }
        let watchedAt = MonotonicClock.now()
        var latest = stallmon_event()
        guard stallmon_loop_latest(loop, &latest) == 1, latest.sequence == event.sequence else {
            return  // the window closed just as it crossed the threshold
        }
        guard var stall = beginStall(event, windowStart: windowStart, watchedAt: watchedAt) else { return }
        engine.reportDetected(stall.core, paused: stall.time.paused, to: reporter, cpu: stall.cpu)
        let end = sampleUntilEnd(&stall)
        finishStall(&stall, end: end)
    }

    /// Takes the first sample of a window that crossed the threshold, and starts its time account.
    /// - Returns: The stall, or `nil` when the sample shows the loop idle in its own wait (a nested
    ///   run in a mode the observers do not see): then there is no stall.
    private func beginStall(_ event: stallmon_event, windowStart: UInt64, watchedAt: UInt64) -> Stall? {
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
        var stall = Stall(core: core, watchedAt: watchedAt, time: time)
        stall.time.record(clocks, stopped: stops.sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)
        return stall
    }

    /// Samples until the window closes, and returns its end. With a service watchdog, no pings go
    /// out meanwhile, and a stall that outlasts most of its interval gets a final report before
    /// systemd kills us.
    private func sampleUntilEnd(_ stall: inout Stall) -> UInt64 {
        let core = stall.core
        core.nextSample = MonotonicClock.now() + engine.sampleInterval
        while true {
            var target = core.nextSample
            if let schedule = serviceWatchdog, !core.finalReportWritten {
                target = min(target, schedule.finalReportTime)
            }
            let woke = wait(until: target)
            // Late by a stop, less any time spent waiting for a CPU (no stop); the thread's
            // runnable time tells when the stop began.
            let stopped = stops.wasStopped(wokeAt: woke, deadline: target)
            stall.time.record(clocks, stopped: stopped, late: stops.lateness(wokeAt: woke, deadline: target))
            if let schedule = serviceWatchdog, !core.finalReportWritten,
                MonotonicClock.now() >= schedule.finalReportTime
            {
                // Not past systemd's deadline: should the stall end before it (and the reports
                // queued before this one not), the pings must resume.
                engine.reportBeforeKill(
                    core, interval: schedule.interval, deadline: schedule.deadline, paused: stall.time.paused,
                    to: reporter, cpu: stall.cpu)
            }
            if let end = windowEnd(of: stall) { return end }
            if engine.isStopping { return MonotonicClock.now() }
            if MonotonicClock.now() >= core.nextSample {
                var sampleBegan = stops.sampleStarts()
                guard engine.sample(core, of: source, inspector: inspector) else {
                    let end = MonotonicClock.now()
                    floor = (core.sequence, end)
                    return end
                }
                stall.time.record(clocks, stopped: stops.sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)
                engine.scheduleNextSample(core)
            }
        }
    }

    /// The end of the stall's window, once the loop has left it.
    private func windowEnd(of stall: Stall) -> UInt64? {
        let sequence = stall.core.sequence
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
        return stall.watchedAt
    }

    /// Takes a reading after the end, and hands over the ended report.
    private func finishStall(_ stall: inout Stall, end: UInt64) {
        let sequence = stall.core.sequence
        // The loop slept from the end through the reading if no transition followed its sleep.
        let reading = stall.time.recordAfterEnd(clocks)
        var afterEnd = stallmon_event()
        stall.time.sleptSinceEnd =
            stallmon_loop_latest(loop, &afterEnd) == 1 && afterEnd.sequence == sequence + 1
            && afterEnd.phase == UInt32(STALLMON_LOOP_ASLEEP.rawValue)
        if let reading { lastCPUReading = (reading, sequence, false) }
        let time = stall.time
        engine.finishStall(stall.core, end: end, paused: time.paused, to: reporter) { _ in time.used(until: end) }
    }
}
#endif  // STALLMON_LINUX
