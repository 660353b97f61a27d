#if STALLMON_LINUX
import CStallCapture
import Foundation
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One watchdog thread for a group of epoll event loops (SwiftNIO's): the same stall reports as the
/// run-loop watchdog, for every loop of the group, from one thread.
///
/// A loop tells the watchdog that it made progress in one of two ways. A group made with a tick
/// delegate (SwiftNIO's metrics delegate) counts the end of every tick exactly. Any other group,
/// `MultiThreadedEventLoopGroup.singleton` among them, is handed heartbeats: while a loop is awake,
/// the watchdog gives it one task at a time (``Loop/beat``) every ``beatPeriod`` (an eighth of the
/// threshold), and the task stamps the moment it ran. A loop that leaves a heartbeat unrun for the
/// threshold has stalled: it never got past the work item it was running when the heartbeat came.
/// Such a stall began between the latest heartbeat that ran and the one left unrun, so its start is
/// taken as the middle of the two, within half a period (16 ms at a 250 ms threshold) of the truth;
/// it ends when the unrun heartbeat runs, right after the work item that held the loop returns.
/// An idle loop gets no heartbeat: the watchdog learns from the kernel when it wakes (below), and
/// hands it the first one only if it is still awake a quarter period later, so that a stall that
/// began with the wakeup (a request's handler) is timed within an eighth of a period.
///
/// A loop's cycle is `epoll_wait`, its I/O handlers, its tasks, then the tick the loop publishes.
/// Nothing is called when a cycle starts, so the watchdog finds out from the kernel:
/// - A loop blocked in `epoll_wait` (`/proc/self/task/<tid>/syscall`) is idle. The watchdog submits
///   a one-shot io_uring poll of that loop's epoll descriptor (the call's first argument). The
///   loop's wakeup completes the poll, and the poll takes its result from the wakeup itself, so the
///   watchdog learns of it even when the loop has consumed its events by the time the watchdog
///   runs. (A nested epoll instance does not: it polls the loop's descriptor again when the
///   watchdog runs and, finding nothing ready, sleeps on; on this kernel it missed 1094 of 2000
///   wakeups.) Polling the descriptor consumes none of the loop's events, and an idle group costs
///   the watchdog no wakeup at all.
/// - From a cycle's start the watchdog sleeps until start + threshold. A loop that has ticked
///   since has made progress: it is idle again (armed again) or busy in a later cycle, which counts
///   from the end of the latest tick. A loop that has not ticked and is not in `epoll_wait` has
///   stalled: it is sampled like a stalled run loop until its next tick, whose end closes the stall.
///
/// A loop is re-armed only at a deadline, so a loop that goes idle and wakes on every request
/// costs the watchdog at most two wakeups per threshold, and a loop that ticked is looked at up to
/// a quarter threshold early, so that nearby deadlines share a wakeup. Without io_uring (disabled
/// by `kernel.io_uring_disabled` or a seccomp filter), idle loops are looked at once per threshold.
///
/// The same watchdog watches the threads of Swift's cooperative pool (``init(cooperativePool:reporter:signal:slot:)``),
/// whose jobs stamp their start and end on their thread (`stallcapture_pool.h`): see ``runPool()``.
package final class EventLoopWatchdog: @unchecked Sendable {
    /// One loop of the group, as its thread registered it.
    package struct Loop: Sendable {
        package var threadID: pid_t
        package var name: String
        /// Hands the loop a heartbeat: a task, run on the loop between its work items, that calls
        /// `stallmon_ticks_beat` on the loop's tick state (SwiftNIO: `EventLoop.execute`). `nil` for
        /// a loop that only counts ticks through a delegate.
        package var beat: (@Sendable () -> Void)?

        package init(threadID: pid_t, name: String, beat: (@Sendable () -> Void)? = nil) {
            self.threadID = threadID
            self.name = name
            self.beat = beat
        }
    }

    package struct TickState: @unchecked Sendable {
        package let pointer: OpaquePointer
    }

    let configuration: StallMonitor.Configuration
    private let loops: [LoopState]
    private let reporters: [Reporter]
    private let signal: Int32?
    private let slot: Int32
    private let startedAt = MonotonicClock.now()
    /// Polls of idle loops' epoll descriptors, and of `stopFD`; `nil` where io_uring is unavailable
    /// (then idle loops are looked at once per threshold).
    private let watch: OpaquePointer?
    private let stopFD: Int32
    private let finished = DispatchSemaphore(value: 0)
    /// The stop signal where there is no io_uring.
    private let stopWaiter = DispatchSemaphore(value: 0)
    private let stopping = Atomic<Bool>(false)
    private let wakeupCount = Atomic<Int>(0)
    private let stallCount = Atomic<Int>(0)
    private let watchdogThreadID = Atomic<Int32>(0)
    /// Tells a stop of the process (SIGSTOP and SIGCONT, a debugger) from a late wakeup: time the
    /// process spent stopped is no loop's stall.
    private lazy var stops = StopDetector(
        threshold: threshold, sampleTimeout: UInt64(configuration.sampleTimeout.nanoseconds))
    /// The loops' tick-duration histograms, handed to the metrics backend while the watchdog is awake anyway.
    private let latency: [LoopLatencyExporter]
    /// Whether the watched threads are the cooperative pool's rather than `loops`.
    private let watchesPool: Bool
    /// The pool thread in each slot of `stallcapture_pool.h`, once seen.
    private var poolThreads: [LoopState?] = []
    /// Each slot's job count at the previous look, and whether any had changed at the latest.
    private var poolSequences: [UInt64] = []
    private var poolRanJobs = false
    /// When the watchdog woke after the latest stop of the process: jobs count from then at the earliest.
    private var poolResumed: UInt64 = 0
    /// The untimed job priority the latest queue probe was sent for.
    private var probedPriority: UInt32 = 0
    private lazy var sampler = StallSampler(
        configuration: configuration, signal: signal, slot: slot, interruptBlockedThreads: false, logger: nil)

    /// The watchdog thread's name, in the kernel (at most 15 bytes).
    package static let threadName = "stallmon-nio"
    /// The pool watchdog thread's name.
    package static let poolThreadName = "stallmon-pool"
    /// `STALL_LOOP` of the cooperative pool's stalls.
    package static let poolLoopName = MonitorDescription.cooperativePoolLoop

    /// - Parameters:
    ///   - loops: The loops to watch, with their tick state (from ``makeTickState()``), bound on
    ///     their threads.
    ///   - reporters: One per loop, in the same order.
    ///   - latency: The exporters of the loops that count their tick durations.
    init(
        configuration: StallMonitor.Configuration, loops: [(Loop, TickState)], reporters: [Reporter], signal: Int32?,
        slot: Int32, latency: [LoopLatencyExporter] = []
    ) throws(StallMonitorError) {
        self.configuration = configuration
        self.latency = latency
        self.loops = loops.map { LoopState(loop: $0.0, ticks: $0.1.pointer) }
        self.reporters = reporters
        self.signal = signal
        self.slot = slot
        watchesPool = false
        stopFD = stallmon_eventfd_create()
        guard stopFD >= 0 else { throw StallMonitorError.outOfMemory() }
        var error: Int32 = 0
        var created = stallmon_watch_create(UInt32(min(4096, max(64, 2 * loops.count + 2))), &error)
        if let ring = created {
            error = -stallmon_watch_poll(ring, stopFD, UInt64.max)
            if error != 0 {
                stallmon_watch_free(ring)
                created = nil
            }
        }
        watch = created
        unavailableReason = created == nil ? "io_uring is unavailable (errno \(error))" : nil
    }

    /// Watches the threads of Swift's cooperative pool, whose jobs are timed by the trampoline of
    /// `stallmon_pool_install`; every stall goes to `reporter`, with the pool thread's id.
    init(cooperativePool configuration: StallMonitor.Configuration, reporter: Reporter, signal: Int32?, slot: Int32) {
        self.configuration = configuration
        self.loops = []
        self.reporters = [reporter]
        self.signal = signal
        self.slot = slot
        watchesPool = true
        latency = []
        stopFD = -1
        watch = nil
        unavailableReason = nil
    }

    deinit {
        stallmon_watch_free(watch)
        if stopFD >= 0 { close(stopFD) }
    }

    /// Why idle loops are polled once per threshold instead of waking the watchdog, or `nil`.
    package let unavailableReason: String?

    /// Tick state for one loop thread; bind it there with `stallmon_ticks_bind`.
    package static func makeTickState() -> TickState? {
        stallmon_ticks_create().map(TickState.init)
    }

    package static func freeTickState(_ state: TickState) {
        stallmon_ticks_free(state.pointer)
    }

    /// Times the watchdog thread woke up, for measurements.
    package var wakeups: Int { wakeupCount.load(ordering: .relaxed) }
    package var stalls: Int { stallCount.load(ordering: .relaxed) }
    package var threadID: pid_t { watchdogThreadID.load(ordering: .acquiring) }

    func start() {
        Watchdog.startThread(named: watchesPool ? Self.poolThreadName : Self.threadName) { [self] in
            watchdogThreadID.store(stallmon_gettid(), ordering: .releasing)
        } body: { [self] in
            stops.runQueue.open()
            run()
            stops.runQueue.close()
            finished.signal()
        }
    }

    /// Stops the thread and waits for it; stalls in progress get their ended reports.
    func stop() {
        stopping.store(true, ordering: .releasing)
        if watchesPool { stallmon_pool_wake() }
        if stopFD >= 0 { stallmon_eventfd_signal(stopFD) }
        stopWaiter.signal()
        finished.wait()
        ServiceHealth.shared.vote(self, wedgedSince: nil)
    }

    private var threshold: UInt64 { UInt64(configuration.threshold.nanoseconds) }
    private var sampleInterval: UInt64 { UInt64(configuration.sampleInterval.nanoseconds) }

    // MARK: - Per-loop state

    final class LoopState {
        enum Phase {
            /// Not yet looked at, or its epoll descriptor could not be armed: looked at every threshold.
            case unknown(since: UInt64)
            /// In `epoll_wait`, with a poll of its epoll descriptor pending.
            case idle
            /// In a cycle that began at `start` (no tick since `sequence`).
            case timing(start: UInt64, sequence: UInt64)
            case stalled(StallInProgress)
        }

        let loop: Loop
        /// The loop's tick state; `nil` for a pool thread, whose jobs are read from its slot.
        let ticks: OpaquePointer?
        let inspector: ThreadInspector
        var phase: Phase = .unknown(since: 0)
        /// The loop's epoll descriptor the latest poll was submitted for (-1: none).
        var registeredFD: Int32 = -1
        /// Whether that poll is still pending: it completes at the loop's next wakeup.
        var pollPending = false
        /// CPU time of the thread when its current cycle was first seen, and when it was read.
        var cpuBase: (cpu: Int64, time: UInt64) = (-1, 0)
        /// When the heartbeat of the current cycle was handed to the loop (`nil`: none yet). It has
        /// run once ``sequence`` moved past the cycle's.
        var beatSent: UInt64?
        /// When the watchdog looks at a heartbeat loop in a cycle next: a period after the cycle's
        /// start or its heartbeat.
        var nextLook: UInt64 = 0
        /// When the loop last woke from `epoll_wait` and got the quick first look.
        var quickLookAt: UInt64 = 0

        init(loop: Loop, ticks: OpaquePointer?) {
            self.loop = loop
            self.ticks = ticks
            self.inspector = ThreadInspector(threadID: loop.threadID)
        }

        var sequence: UInt64 { stallmon_ticks_sequence(ticks) }

        /// Whether the loop is told heartbeats: it has a way to run them and counts no ticks of a
        /// delegate (which tell the watchdog more, and for nothing).
        var beats: Bool { loop.beat != nil && stallmon_ticks_delegated(ticks) == 0 }
    }

    final class StallInProgress {
        let stallID = CapturedStall.newStallID()
        let start: UInt64
        let sequence: UInt64
        let suppressed: Bool
        var nextSample: UInt64
        /// Whether the report before the service manager's watchdog kill went out.
        var finalReportWritten = false
        /// What the samples saw (sampled like a stalled run loop).
        var sampled: StallSamples
        var stacks: StackAggregator { sampled.stacks }
        var firstStack: [UInt] { sampled.firstStack }
        var firstSource: StallReport.StackSource { sampled.firstSource }
        var noStackReason: String? {
            get { sampled.noStackReason }
            set { sampled.noStackReason = newValue }
        }

        init(start: UInt64, sequence: UInt64, suppressed: Bool, nextSample: UInt64, capacity: Int) {
            self.start = start
            self.sequence = sequence
            self.suppressed = suppressed
            self.nextSample = nextSample
            self.sampled = StallSamples(capacity: capacity)
        }
    }

    // MARK: - Watching

    private func run() {
        if watchesPool {
            runPool()
            return
        }
        let now = MonotonicClock.now()
        for index in loops.indices { examine(index, now: now) }
        var keys = [UInt64](repeating: 0, count: 64)
        while !stopping.load(ordering: .acquiring) {
            let timeout = nextTimeout()
            let deadline = timeout == UInt64.max ? nil : MonotonicClock.now() &+ timeout
            var count: Int32 = 0
            stops.measuringWait {
                if let watch {
                    count = keys.withUnsafeMutableBufferPointer {
                        stallmon_watch_wait(watch, timeout, $0.baseAddress, Int32($0.count))
                    }
                } else {
                    _ = stopWaiter.wait(
                        timeout: timeout == UInt64.max ? .distantFuture : .now() + .nanoseconds(Int(timeout)))
                }
            }
            wakeupCount.add(1, ordering: .relaxed)
            let awake = MonotonicClock.now()
            if stops.wasStopped(wokeAt: awake, deadline: deadline ?? UInt64.max) {
                restartCyclesAfterStop(now: awake)
            }
            // A cycle started when the loop's descriptor woke the watchdog's poll, which is when
            // the watchdog became runnable: time it then spent waiting for a CPU is the loop's.
            let queued = stops.lastWaitQueued
            let woke = queued < awake ? awake - queued : awake
            for key in keys.prefix(Int(max(0, count))) where key != UInt64.max {
                let index = Int(key)
                guard loops.indices.contains(index) else { continue }
                loops[index].pollPending = false
                guard case .idle = loops[index].phase else { continue }
                startCycle(index, at: woke, beatNow: false)
            }
            let now = MonotonicClock.now()
            for index in loops.indices { visit(index, now: now) }
            for exporter in latency { exporter.exportIfDue(now: now) }
        }
        let end = MonotonicClock.now()
        for index in loops.indices {
            if case .stalled(let stall) = loops[index].phase { finish(index, stall, end: end) }
        }
    }

    /// The process was stopped while the watchdog waited: the cycles it was timing count from now,
    /// as a run loop's window does, or their loops would be reported stalled for the time nothing
    /// ran. (A stall already being sampled keeps its start: its report includes the stop.)
    private func restartCyclesAfterStop(now: UInt64) {
        for index in loops.indices {
            switch loops[index].phase {
            case .timing: startCycle(index, at: now)
            case .unknown: loops[index].phase = .unknown(since: now)
            case .idle, .stalled: break
            }
        }
    }

    /// Nanoseconds until the earliest deadline or sample (UInt64.max: none; the group is idle).
    private func nextTimeout() -> UInt64 {
        var earliest: UInt64?
        for state in loops {
            let next: UInt64
            switch state.phase {
            case .idle: continue
            case .unknown(let since): next = since + threshold
            case .timing(let start, _):
                if state.beats {
                    next = state.beatSent.map { min($0 + threshold, state.nextLook) } ?? state.nextLook
                } else {
                    next = start + threshold
                }
            case .stalled(let stall): next = min(stall.nextSample, finalReportDue(stall)?.due ?? .max)
            }
            earliest = min(earliest ?? next, next)
        }
        guard let earliest else { return UInt64.max }
        let now = MonotonicClock.now()
        return earliest > now ? earliest - now : 0
    }

    /// What the loop does now: idle in `epoll_wait` (then armed), or in a cycle since its latest tick.
    /// - Parameter timedSince: The start of the cycle the watchdog was timing, when it has ticked since.
    private func examine(_ index: Int, now: UInt64, timedSince: UInt64? = nil) {
        let state = loops[index]
        var view = stallmon_syscall_view()
        stallmon_read_syscall(state.loop.threadID, &view)
        if view.state == 0, stallmon_syscall_is_epoll_wait(view.number) == 1 {
            let sequence = state.sequence
            if arm(state, descriptor: Int32(truncatingIfNeeded: view.args.0)) {
                state.phase = .idle
                // The loop may have woken between the read and the arming, and its events may
                // be consumed already: then it began its cycle after `now`.
                var again = stallmon_syscall_view()
                stallmon_read_syscall(state.loop.threadID, &again)
                if state.sequence != sequence
                    || !(again.state == 0 && stallmon_syscall_is_epoll_wait(again.number) == 1)
                {
                    startCycle(index, at: now)
                }
                return
            }
            state.phase = .unknown(since: now)
            return
        }
        if view.state < 0 {
            // The thread is gone, or /proc cannot be read: look again in a threshold.
            state.phase = .unknown(since: now)
            return
        }
        // Busy: the cycle counts from the end of the latest tick. That tick ended the cycle the
        // watchdog was timing, or a later one, however late the watchdog looks. Otherwise a tick
        // that lies a threshold or more back is too old to go by (the loop may have slept since,
        // unseen): the cycle counts from now.
        let end = stallmon_ticks_latest_end(state.ticks)
        let recent = end != 0 && end <= now && (now - end < threshold || timedSince.map { end >= $0 } == true)
        let start = recent ? end : now
        startCycle(index, at: start)
    }

    /// - Parameter beatNow: Whether a heartbeat loop gets its heartbeat at once (it was seen busy)
    ///   or only when it is still awake a quarter period later (it has just woken from
    ///   `epoll_wait`: most wakeups are over by then, and a stall that began with the wakeup is
    ///   timed within an eighth of a period).
    private func startCycle(_ index: Int, at start: UInt64, beatNow: Bool = true) {
        let state = loops[index]
        let sequence = state.sequence
        // A tick that ended after `start` is counted in `sequence` already: the cycle being timed
        // began after it.
        let start = max(start, stallmon_ticks_latest_end(state.ticks))
        state.phase = .timing(start: start, sequence: sequence)
        // The end of this cycle's tick, however late the watchdog looks: a cycle that outlasted
        // the threshold is a stall even when the watchdog only gets a CPU after it ended.
        stallmon_ticks_watch(state.ticks, sequence)
        state.cpuBase = (stallmon_thread_cpu_ns(state.loop.threadID), MonotonicClock.now())
        // Seen out of blocking calls now, a loop that has not blocked since by the threshold may
        // be signalled at once, without the 200 µs watch of its first sample (most of the time
        // from the deadline to the detected report).
        stallmon_sampler_note_running(slot, state.loop.threadID)
        state.beatSent = nil
        if state.beats {
            let now = MonotonicClock.now()
            if beatNow {
                beat(state, now: now)
            } else if now >= state.quickLookAt + beatPeriod {
                // At most one quick look a period: a loop that wakes more often than that would
                // otherwise cost two wakeups (its poll and the look) each time.
                state.quickLookAt = now
                state.nextLook = now + beatPeriod / 4
            } else {
                state.nextLook = state.quickLookAt + beatPeriod
            }
        }
    }

    /// How often an awake heartbeat loop gets a heartbeat, and the watchdog looks at it: an eighth
    /// of the threshold. Half of it bounds the error of a stall's start.
    private var beatPeriod: UInt64 { threshold / 8 }

    private func beat(_ state: LoopState, now: UInt64) {
        state.beatSent = now
        state.nextLook = now + beatPeriod
        state.loop.beat?()
    }

    /// Handles what is due for one loop at `now`; a loop that ticked is re-examined up to a quarter
    /// threshold before its deadline, so that nearby deadlines share a wakeup.
    private func visit(_ index: Int, now: UInt64) {
        let state = loops[index]
        switch state.phase {
        case .idle:
            return
        case .unknown(let since):
            if now >= since + threshold { examine(index, now: now) }
        case .timing(let start, let sequence) where state.beats:
            visitBeating(index, start: start, sequence: sequence, now: now)
        case .timing(let start, let sequence):
            let deadline = start + threshold
            if state.sequence != sequence {
                if reportIfLate(index, start: start, sequence: sequence, now: now) { return }
                if now + threshold / 4 >= deadline { examine(index, now: now, timedSince: start) }
                return
            }
            guard now >= deadline, isAwake(index, now: now) else { return }
            beginStall(index, start: start, sequence: sequence, now: now)
        case .stalled(let stall):
            var end: UInt64 = 0
            if stallmon_ticks_watched_end(state.ticks, stall.sequence, &end) == 1 {
                finish(index, stall, end: end)
            } else if state.sequence != stall.sequence {
                // The tick ended before the loop saw the watch: the latest tick end bounds it.
                finish(index, stall, end: min(stallmon_ticks_latest_end(state.ticks), now))
            } else {
                writeFinalReportIfDue(state, stall, now: now, to: reporters[index])
                if now >= stall.nextSample {
                    takeSample(state, stall)
                    stall.nextSample += sampleInterval
                    let after = MonotonicClock.now()
                    if stall.nextSample < after { stall.nextSample = after + sampleInterval }
                }
            }
        }
    }

    // MARK: - The service manager's watchdog

    /// When the final report of `stall` is due: under `WatchdogSec=`, for a stall that will have
    /// held its loop past half the interval by then (the pings have stopped for it), early enough
    /// to land before systemd's kill; `nil` otherwise.
    private func finalReportDue(_ stall: StallInProgress) -> (due: UInt64, deadline: UInt64, interval: UInt64)? {
        guard !stall.finalReportWritten, !stall.suppressed, let schedule = ServiceHealth.shared.finalReport,
            schedule.due >= stall.start + schedule.interval / 2
        else { return nil }
        return schedule
    }

    /// Writes the final report of `stall` once it is due, and waits until the sinks have it or
    /// systemd's deadline passes.
    private func writeFinalReportIfDue(_ state: LoopState, _ stall: StallInProgress, now: UInt64, to reporter: Reporter)
    {
        guard let schedule = finalReportDue(stall), now >= schedule.due else { return }
        stall.finalReportWritten = true
        var report = captured(
            state, stall, event: .watchdog, end: MonotonicClock.now(), stacks: stall.stacks.all,
            sources: stall.stacks.sources)
        if watchesPool { report = poolStall(report, state) }
        report.watchdogInterval = schedule.interval
        reporter.submitNow(report, waitingUntil: schedule.deadline)
    }

    /// The cooperative pool's width: the runtime's global queues are as wide as the machine has CPUs.
    private static let poolWidth = max(1, ProcessInfo.processInfo.activeProcessorCount)

    /// Tells the process's pinger (``ServiceHealth``) which of this watchdog's loops are wedged:
    /// the oldest stalled event loop, or the pool once as many of its threads are held as it is wide.
    private func voteOnHealth() {
        var since: UInt64?
        if watchesPool {
            // Wedged once as many threads are held as the pool is wide (one per CPU): fewer held
            // threads leave others to run the queued jobs, however few workers live just now.
            let held = poolThreads.compactMap { state -> UInt64? in
                guard let state, case .stalled(let stall) = state.phase else { return nil }
                return stall.start
            }.sorted()
            let width = Self.poolWidth
            // It became wedged when the last of the first `width` held threads was taken.
            since = held.count >= width ? held[width - 1] : nil
        } else {
            for state in loops {
                if case .stalled(let stall) = state.phase { since = min(since ?? stall.start, stall.start) }
            }
        }
        ServiceHealth.shared.vote(self, wedgedSince: since)
    }

    /// Handles what is due for a heartbeat loop in a cycle that began at `start`: a heartbeat that
    /// ran ends the cycle (the loop is idle again or in a later one); one left unrun for the
    /// threshold is a stall; a loop awake a period after it woke gets its first heartbeat.
    private func visitBeating(_ index: Int, start: UInt64, sequence: UInt64, now: UInt64) {
        let state = loops[index]
        if state.sequence != sequence {
            if reportIfLate(index, start: start, sequence: sequence, now: now) { return }
            examine(index, now: now, timedSince: start)
            return
        }
        // Looks due within half a period share this wakeup; the first look after a wakeup from
        // `epoll_wait` is never early.
        let due = now >= state.nextLook || (state.beatSent != nil && now + beatPeriod / 2 >= state.nextLook)
        if let sent = state.beatSent {
            guard now >= sent + threshold else {
                if due { state.nextLook = now + beatPeriod }
                return
            }
        } else if !due {
            return
        }
        // Asleep again before it needed a heartbeat (or just as one was handed to it: its wakeup
        // for it completes the poll).
        guard isAwake(index, now: now) else { return }
        guard state.beatSent != nil else {
            beat(state, now: now)
            return
        }
        beginStall(index, start: start, sequence: sequence, now: now)
    }

    /// Whether the loop is out of `epoll_wait` now. One that sleeps is examined (and so polled
    /// again); one whose thread cannot be read is looked at again in a threshold.
    private func isAwake(_ index: Int, now: UInt64) -> Bool {
        let state = loops[index]
        var view = stallmon_syscall_view()
        stallmon_read_syscall(state.loop.threadID, &view)
        if view.state == 0, stallmon_syscall_is_epoll_wait(view.number) == 1 {
            examine(index, now: now)
            return false
        }
        if view.state < 0 {
            state.phase = .unknown(since: now)
            return false
        }
        return true
    }

    /// Where a stall of the cycle that began at `start` starts, and the moment from which it must
    /// have lasted the threshold. With ticks, both are the cycle's start. With heartbeats, the
    /// loop was last seen making progress at `start` and was handed the heartbeat it left unrun at
    /// `sent`: the work item that held it began in between (the middle is within half a period of
    /// it), and the loop has been held at least since `sent`.
    private func stallBounds(_ state: LoopState, cycleStart start: UInt64) -> (start: UInt64, unanswered: UInt64) {
        guard state.beats, let sent = state.beatSent, sent > start else { return (start, start) }
        return (start + (sent - start) / 2, sent)
    }

    // MARK: - Arming

    /// Makes sure a poll of the loop's epoll descriptor is pending. A poll submitted earlier, while
    /// the loop was busy, still completes at its next wakeup.
    private func arm(_ state: LoopState, descriptor: Int32) -> Bool {
        guard let watch, let index = loops.firstIndex(where: { $0 === state }) else { return false }
        if state.pollPending, state.registeredFD == descriptor { return true }
        guard stallmon_watch_poll(watch, descriptor, UInt64(index)) == 0 else { return false }
        state.registeredFD = descriptor
        state.pollPending = true
        return true
    }

    // MARK: - Stalls

    /// A cycle that outlasted the threshold but ended before the watchdog got to look (it waited
    /// for a CPU past the deadline) is still a stall: it gets an ended report, without a stack.
    /// Returns whether there was one.
    private func reportIfLate(_ index: Int, start: UInt64, sequence: UInt64, now: UInt64) -> Bool {
        let state = loops[index]
        let bounds = stallBounds(state, cycleStart: start)
        var end: UInt64 = 0
        guard stallmon_ticks_watched_end(state.ticks, sequence, &end) == 1, end > bounds.unanswered,
            end - bounds.unanswered >= threshold
        else { return false }
        let stall = StallInProgress(
            start: bounds.start, sequence: sequence, suppressed: isSuppressed(now), nextSample: now,
            capacity: configuration.maximumStacks)
        stall.noStackReason =
            "the stall ended \((now - end) / 1_000_000) ms before the watchdog could look (it waited for a CPU)"
        finish(index, stall, end: end)
        return true
    }

    private func isSuppressed(_ now: UInt64) -> Bool {
        now < startedAt + UInt64(configuration.startupGracePeriod.nanoseconds)
            || (!configuration.reportWhileDebuggerAttached && ThreadInspector.tracerPID() != 0)
    }

    private func beginStall(_ index: Int, start: UInt64, sequence: UInt64, now: UInt64) {
        let state = loops[index]
        // The loop records the end of the cycle's tick since the cycle began (see startCycle).
        guard state.sequence == sequence else {
            // It ticked just as it crossed the threshold.
            if !reportIfLate(index, start: start, sequence: sequence, now: now) {
                examine(index, now: now, timedSince: start)
            }
            return
        }
        let stall = StallInProgress(
            start: stallBounds(state, cycleStart: start).start, sequence: sequence, suppressed: isSuppressed(now),
            nextSample: now + sampleInterval, capacity: configuration.maximumStacks
        )
        state.phase = .stalled(stall)
        voteOnHealth()
        takeSample(state, stall)
        if !stall.suppressed {
            reporters[index].submit(
                captured(
                    state, stall, event: .detected, end: MonotonicClock.now(),
                    stacks: stall.firstStack.isEmpty ? [] : [(stall.firstStack, 1)],
                    sources: stall.firstStack.isEmpty ? [] : [stall.firstSource]))
        }
    }

    private func finish(_ index: Int, _ stall: StallInProgress, end: UInt64) {
        let state = loops[index]
        state.phase = .unknown(since: end)
        voteOnHealth()
        stallmon_ticks_watch(state.ticks, 0)
        stallCount.add(1, ordering: .relaxed)
        if !stall.suppressed {
            reporters[index].submit(
                captured(state, stall, event: .ended, end: end, stacks: stall.stacks.all, sources: stall.stacks.sources)
            )
        }
        // Stopping: nothing more to watch, and no heartbeat for a group that may be shutting down.
        if stopping.load(ordering: .acquiring) { return }
        examine(index, now: MonotonicClock.now())
    }

    private func captured(
        _ state: LoopState, _ stall: StallInProgress, event: StallReport.Event, end: UInt64,
        stacks: [(stack: [UInt], count: Int)], sources: [StallReport.StackSource]
    ) -> CapturedStall {
        CapturedStall(
            event, of: stall.sampled, stallID: stall.stallID, start: stall.start, end: end,
            activity: .eventLoopCycle, runLoopMode: "none", stacks: (stacks, sources)
        ) { duration in
            // The share of CPU the thread used since the watchdog first saw this cycle, applied to
            // the whole cycle (which may have begun before, at the end of the previous tick).
            let used = stallmon_thread_cpu_ns(state.loop.threadID)
            let readAt = MonotonicClock.now()
            guard state.cpuBase.cpu >= 0, used >= state.cpuBase.cpu, readAt > state.cpuBase.time else { return 0 }
            let share = min(1, Double(used - state.cpuBase.cpu) / Double(readAt - state.cpuBase.time))
            return UInt64(share * Double(duration))
        }
    }

    /// One sample of a stalled loop. It never shows the loop idle: the watchdog saw it outside
    /// `epoll_wait` before it sampled. Its threads get no signal in a system call, whatever the
    /// configuration says.
    private func takeSample(_ state: LoopState, _ stall: StallInProgress) {
        _ = sampler.sample(&stall.sampled, of: state.loop, inspector: state.inspector)
    }
}

// MARK: - The cooperative pool

extension EventLoopWatchdog {
    /// Watches the pool threads' slots. A job stamps its start into its thread's slot and clears it
    /// at its end, so the watchdog knows, for every thread, whether a job runs and since when:
    /// - It sleeps until the earliest deadline (a running job's start + threshold), or parks, without
    ///   a timeout, while no job runs; the first job to start wakes it (a job start checks one flag
    ///   and, only while the watchdog is parked, makes one system call). A pool whose jobs ran since
    ///   the previous look but none runs now is busy with short jobs: the watchdog looks again in
    ///   half a threshold rather than park, so that the next job start does not pay for a wakeup
    ///   (a job that starts meanwhile has its deadline after that look).
    /// - A job still running at its deadline is a stall: sampled like a stalled loop (a thread in a
    ///   system call is unwound from the kernel's view, never signalled) until the job ends; its
    ///   thread records the exact end of that one job.
    /// A pool busy with short jobs costs one or two wakeups per threshold; an idle pool none.
    private func runPool() {
        while !stopping.load(ordering: .acquiring) {
            var earliest = visitPool(now: MonotonicClock.now())
            if earliest == nil, poolRanJobs {
                earliest = MonotonicClock.now() + threshold / 2
            }
            if earliest == nil {
                let parked = stallmon_pool_park()
                // Read every slot again after announcing the park: a job that started before it
                // is seen here, one that starts after it wakes the watchdog.
                earliest = visitPool(now: MonotonicClock.now())
                if earliest == nil, !stopping.load(ordering: .acquiring) {
                    waitForPool(timeout: parked < 0 ? threshold : UInt64.max)
                    continue
                }
                stallmon_pool_unpark()
            }
            guard let earliest, !stopping.load(ordering: .acquiring) else { continue }
            let now = MonotonicClock.now()
            if earliest > now { waitForPool(timeout: earliest - now) }
        }
        let end = MonotonicClock.now()
        for (index, state) in poolThreads.enumerated() {
            if let state, case .stalled(let stall) = state.phase { finishPoolStall(index, state, stall, end: end) }
        }
    }

    /// Waits for the pool's next job or for `timeout` (`UInt64.max`: none), then notes whether the
    /// process was stopped meanwhile: a job it was timing, or one that started before the stop, is
    /// timed from now, as a loop's cycle is (a stall already being sampled keeps its start).
    private func waitForPool(timeout: UInt64) {
        let deadline = timeout == UInt64.max ? UInt64.max : MonotonicClock.now() &+ timeout
        stops.measuringWait { _ = stallmon_pool_wait(timeout) }
        wakeupCount.add(1, ordering: .relaxed)
        let awake = MonotonicClock.now()
        if stops.wasStopped(wokeAt: awake, deadline: deadline) { poolResumed = awake }
    }

    /// Handles what is due for every pool thread at `now`; returns the earliest time something is
    /// due next (`nil`: no job runs).
    private func visitPool(now: UInt64) -> UInt64? {
        learnUnknownPriority()
        let count = Int(stallmon_pool_slot_count())
        if poolThreads.count < count { poolThreads += Array(repeating: nil, count: count - poolThreads.count) }
        if poolSequences.count < count { poolSequences += Array(repeating: 0, count: count - poolSequences.count) }
        poolRanJobs = false
        var earliest: UInt64?
        func due(_ time: UInt64) { earliest = min(earliest ?? time, time) }
        for index in 0..<count {
            var job = stallmon_pool_job()
            guard stallmon_pool_read(Int32(index), &job) == 1 else {
                // The thread is starting a job just now: look again shortly.
                due(now + 1_000_000)
                continue
            }
            if job.sequence != poolSequences[index] {
                poolSequences[index] = job.sequence
                poolRanJobs = true
            }
            if let state = poolThreads[index], state.loop.threadID != job.tid {
                // The thread has exited (libdispatch ends idle workers) and the slot may be another's.
                if case .stalled(let stall) = state.phase { finishPoolStall(index, state, stall, end: now) }
                poolThreads[index] = nil
            }
            if poolThreads[index] == nil, job.tid != 0 {
                poolThreads[index] = LoopState(
                    loop: Loop(threadID: job.tid, name: Self.poolLoopName), ticks: nil)
                poolThreads[index]?.phase = .idle
            }
            guard let state = poolThreads[index] else { continue }
            if case .stalled(let stall) = state.phase {
                var end: UInt64 = 0
                if stallmon_pool_watched_end(Int32(index), stall.sequence, &end) == 1 {
                    finishPoolStall(index, state, stall, end: end)
                } else if job.sequence != stall.sequence || job.start_ns == 0 {
                    // It ended before it saw the watch, which was set just after it was detected.
                    finishPoolStall(index, state, stall, end: now)
                } else {
                    writeFinalReportIfDue(state, stall, now: now, to: reporters[0])
                    if let final = finalReportDue(stall) { due(final.due) }
                    if now >= stall.nextSample {
                        takeSample(state, stall)
                        stall.nextSample += sampleInterval
                        let after = MonotonicClock.now()
                        if stall.nextSample < after { stall.nextSample = after + sampleInterval }
                    }
                    due(stall.nextSample)
                    continue
                }
            }
            guard job.start_ns != 0 else {
                state.phase = .idle
                continue
            }
            if case .timing(_, let sequence) = state.phase, sequence == job.sequence {
                // The same job as at the previous look.
            } else {
                state.phase = .timing(start: job.start_ns, sequence: job.sequence)
                state.cpuBase = (stallmon_thread_cpu_ns(job.tid), MonotonicClock.now())
            }
            let start = max(job.start_ns, poolResumed)
            let deadline = start + threshold
            if now >= deadline {
                beginPoolStall(index, state, job: job, start: start, now: now)
                if case .stalled(let stall) = state.phase { due(stall.nextSample) }
            } else {
                due(deadline)
            }
        }
        // Threads come, go and finish their jobs between stalls: the pool's vote follows them.
        voteOnHealth()
        return earliest
    }

    private func beginPoolStall(
        _ index: Int, _ state: LoopState, job: stallmon_pool_job, start: UInt64, now: UInt64
    ) {
        stallmon_pool_watch(Int32(index), job.sequence)
        let stall = StallInProgress(
            start: start, sequence: job.sequence, suppressed: isSuppressed(now),
            nextSample: now + sampleInterval, capacity: configuration.maximumStacks)
        state.phase = .stalled(stall)
        voteOnHealth()
        takeSample(state, stall)
        if !stall.suppressed {
            reporters[0].submit(
                poolStall(
                    captured(
                        state, stall, event: .detected, end: MonotonicClock.now(),
                        stacks: stall.firstStack.isEmpty ? [] : [(stall.firstStack, 1)],
                        sources: stall.firstStack.isEmpty ? [] : [stall.firstSource]),
                    state))
        }
    }

    private func finishPoolStall(_ index: Int, _ state: LoopState, _ stall: StallInProgress, end: UInt64) {
        stallmon_pool_watch(Int32(index), 0)
        stallCount.add(1, ordering: .relaxed)
        if !stall.suppressed {
            reporters[0].submit(
                poolStall(
                    captured(
                        state, stall, event: .ended, end: end, stacks: stall.stacks.all, sources: stall.stacks.sources),
                    state))
        }
        state.phase = .idle
        voteOnHealth()
    }

    /// A pool job's stall: its activity, and the thread it held.
    private func poolStall(_ stall: CapturedStall, _ state: LoopState) -> CapturedStall {
        var stall = stall
        stall.activity = .poolJob
        stall.threadID = Int(state.loop.threadID)
        return stall
    }

    /// A job whose priority's queue was not learned at start ran untimed: a probe task of that
    /// priority learns the queue from inside it (`stallmon_pool_learn_queue`), so that the next
    /// such jobs are timed. One probe per priority that shows up.
    private func learnUnknownPriority() {
        let latest = stallmon_pool_latest_unknown_priority()
        guard latest != 0, latest != probedPriority else { return }
        probedPriority = latest
        let priority = UInt8(truncatingIfNeeded: latest)
        guard stallmon_pool_knows_priority(UInt32(priority)) == 0 else { return }
        Task.detached(priority: TaskPriority(rawValue: priority)) { _ = stallmon_pool_learn_queue() }
    }
}

extension EventLoopWatchdog.Loop {
    /// The calling thread, named as the kernel shows it (`NIO-ELT-0-#1` for SwiftNIO's loops).
    package static func current() -> Self {
        let threadID = stallmon_gettid()
        return Self(threadID: threadID, name: ThreadInspector(threadID: threadID).name() ?? "tid-\(threadID)")
    }
}

extension EventLoopWatchdog.Loop: LoopSource {
    var loopName: String { name }
    func idleTest() -> IdleTest { .never }
}
#endif  // STALLMON_LINUX
