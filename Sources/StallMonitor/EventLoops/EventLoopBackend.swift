#if STALLMON_LINUX
import CStallCapture
import Foundation
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The ``WatchdogBackend`` of a group of epoll event loops (SwiftNIO's): the same stall reports as
/// the run-loop backend's, for every loop of the group, from one watchdog thread.
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
final class EventLoopBackend: WatchdogBackend {
    typealias Loop = WatchedEventLoop

    let engine: StallEngine
    private let loops: [LoopState]
    private let reporters: [Reporter]
    private let slot: Int32
    /// Polls of idle loops' epoll descriptors, and of `stopFD`; `nil` where io_uring is unavailable
    /// (then idle loops are looked at once per threshold).
    private let watch: OpaquePointer?
    private let stopFD: Int32
    /// The stop signal where there is no io_uring.
    private let stopWaiter = DispatchSemaphore(value: 0)
    /// The loops' tick-duration histograms, handed to the metrics backend while the watchdog is awake anyway.
    private let latency: [LoopLatencyExporter]

    /// The watchdog thread's name, in the kernel (at most 15 bytes).
    static let threadName = "stallmon-nio"
    var threadName: String { Self.threadName }

    /// - Parameters:
    ///   - loops: The loops to watch, with their tick state (from ``TickState/make()``), bound on
    ///     their threads.
    ///   - reporters: One per loop, in the same order.
    ///   - latency: The exporters of the loops that count their tick durations.
    init(
        engine: StallEngine, loops: [(Loop, TickState)], reporters: [Reporter], slot: Int32,
        latency: [LoopLatencyExporter] = []
    ) throws(StallMonitorError) {
        self.engine = engine
        self.latency = latency
        self.loops = loops.map { LoopState(loop: $0.0, ticks: $0.1.pointer) }
        self.reporters = reporters
        self.slot = slot
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

    deinit {
        stallmon_watch_free(watch)
        if stopFD >= 0 { close(stopFD) }
    }

    /// Why idle loops are polled once per threshold instead of waking the watchdog, or `nil`.
    let unavailableReason: String?

    func wakeForStop() {
        if stopFD >= 0 { stallmon_eventfd_signal(stopFD) }
        stopWaiter.signal()
    }

    func didStop() { ServiceHealth.shared.vote(self, wedgedSince: nil) }

    private var threshold: UInt64 { engine.threshold }

    // MARK: - Per-loop state

    final class LoopState {
        let loop: Loop
        /// The loop's tick state.
        let ticks: OpaquePointer
        let inspector: ThreadInspector
        /// `unknown` until it is looked at, or when its epoll descriptor could not be armed (then
        /// it is looked at every threshold); `idle` in `epoll_wait` with a poll of its epoll
        /// descriptor pending; `timing` a cycle with no tick since its `sequence`.
        var phase: WatchPhase = .unknown(since: 0)
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

        init(loop: Loop, ticks: OpaquePointer) {
            self.loop = loop
            self.ticks = ticks
            self.inspector = ThreadInspector(threadID: loop.threadID)
        }

        var sequence: UInt64 { stallmon_ticks_sequence(ticks) }

        /// Whether the loop is told heartbeats: it has a way to run them and counts no ticks of a
        /// delegate (which tell the watchdog more, and for nothing).
        var beats: Bool { loop.beat != nil && stallmon_ticks_delegated(ticks) == 0 }
    }

    // MARK: - Watching

    /// The keys of the polls that completed in the latest wait.
    private var completions = [UInt64](repeating: 0, count: 64)
    private var completed = 0
    /// Whether the loops have been looked at once.
    private var examined = false

    func visit(now: UInt64) -> UInt64? {
        guard examined else {
            examined = true
            for index in loops.indices { examine(index, now: now) }
            return nextLook()
        }
        // A cycle started when the loop's descriptor woke the watchdog's poll, which is when
        // the watchdog became runnable: time it then spent waiting for a CPU is the loop's.
        let awake = engine.lastWake.woke
        let queued = engine.stops.lastWaitQueued
        let woke = queued < awake ? awake - queued : awake
        for key in completions.prefix(completed) where key != UInt64.max {
            let index = Int(key)
            guard loops.indices.contains(index) else { continue }
            loops[index].pollPending = false
            guard case .idle = loops[index].phase else { continue }
            startCycle(index, at: woke, beatNow: false)
        }
        completed = 0
        for index in loops.indices { visit(index, now: now) }
        for exporter in latency { exporter.exportIfDue(now: now) }
        return nextLook()
    }

    func wait(until deadline: UInt64?) {
        let now = MonotonicClock.now()
        let timeout = deadline.map { $0 > now ? $0 - now : 0 } ?? UInt64.max
        if let watch {
            let count = completions.withUnsafeMutableBufferPointer {
                stallmon_watch_wait(watch, timeout, $0.baseAddress, Int32($0.count))
            }
            completed = Int(max(0, count))
        } else {
            _ = stopWaiter.wait(timeout: timeout == UInt64.max ? .distantFuture : .now() + .nanoseconds(Int(timeout)))
        }
    }

    /// A stall in progress ends with its cycle's tick, when that came before the stop.
    func finishStalls(end: UInt64) {
        for index in loops.indices {
            guard let stall = loops[index].phase.stall else { continue }
            finish(index, stall, end: tickEnd(of: stall, in: loops[index], now: end) ?? end)
        }
    }

    /// When the stalled cycle's tick ended, once it has: exactly, when the loop saw the watch;
    /// otherwise the latest tick's end bounds it.
    private func tickEnd(of stall: StallInProgress, in state: LoopState, now: UInt64) -> UInt64? {
        var end: UInt64 = 0
        if stallmon_ticks_watched_end(state.ticks, stall.sequence, &end) == 1 { return end }
        guard state.sequence != stall.sequence else { return nil }
        return min(stallmon_ticks_latest_end(state.ticks), now)
    }

    /// The process was stopped while the watchdog waited: the cycles it was timing count from now,
    /// with a fresh heartbeat, as any work item does (``WatchPhase/resumed(at:)``).
    func restartAfterStop(now: UInt64) {
        for index in loops.indices {
            if case .timing = loops[index].phase {
                startCycle(index, at: now)
            } else {
                loops[index].phase = loops[index].phase.resumed(at: now)
            }
        }
    }

    /// When the earliest deadline or sample is due (`nil`: none; the group is idle).
    private func nextLook() -> UInt64? {
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
            case .stalled(let stall): next = engine.nextLook(at: stall)
            }
            earliest = min(earliest ?? next, next)
        }
        return earliest
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
            if let end = tickEnd(of: stall, in: state, now: now) {
                finish(index, stall, end: end)
            } else {
                engine.reportBeforeKillIfDue(stall, now: now, to: reporters[index], cpu: state.cpu)
                engine.sampleIfDue(stall, of: state.loop, inspector: state.inspector, now: now)
            }
        }
    }

    // MARK: - The service manager's watchdog

    /// Tells the process's pinger (``ServiceHealth``) which of the group's loops is wedged: the
    /// oldest stalled one.
    private func voteOnHealth() {
        var since: UInt64?
        for state in loops {
            if let stall = state.phase.stall { since = min(since ?? stall.start, stall.start) }
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
        let stall = engine.beginStall(start: bounds.start, sequence: sequence, now: now, activity: .eventLoopCycle)
        stall.samples.noStackReason =
            "the stall ended \((now - end) / 1_000_000) ms before the watchdog could look (it waited for a CPU)"
        finish(index, stall, end: end)
        return true
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
        let stall = engine.beginStall(
            start: stallBounds(state, cycleStart: start).start, sequence: sequence, now: now,
            activity: .eventLoopCycle)
        state.phase = .stalled(stall)
        voteOnHealth()
        // The sample never shows the loop idle: the watchdog saw it outside `epoll_wait` before it
        // sampled. Its threads get no signal in a system call, whatever the configuration says.
        engine.sample(stall, of: state.loop, inspector: state.inspector)
        engine.reportDetected(stall, to: reporters[index], cpu: state.cpu)
    }

    private func finish(_ index: Int, _ stall: StallInProgress, end: UInt64) {
        let state = loops[index]
        state.phase = .unknown(since: end)
        voteOnHealth()
        stallmon_ticks_watch(state.ticks, 0)
        engine.finishStall(stall, end: end, to: reporters[index], cpu: state.cpu)
        // Stopping: nothing more to watch, and no heartbeat for a group that may be shutting down.
        if engine.isStopping { return }
        examine(index, now: MonotonicClock.now())
    }
}

extension EventLoopBackend.LoopState {
    /// The CPU time of a stall of the current cycle: the share of CPU the thread used since the
    /// watchdog first saw the cycle, applied to the whole cycle (which may have begun before, at
    /// the end of the previous tick).
    func cpu(_ duration: UInt64) -> UInt64 { StallEngine.cpuShare(of: loop.threadID, since: cpuBase)(duration) }
}
#endif  // STALLMON_LINUX
