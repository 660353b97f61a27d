#if STALLMON_LINUX
import CStallCapture
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One watchdog thread for a group of epoll event loops that count their ticks (SwiftNIO's, through
/// its metrics delegate): the same stall reports as the run-loop watchdog, for every loop of the
/// group, from one thread.
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
package final class EventLoopWatchdog: @unchecked Sendable {
    /// One loop of the group, as its thread registered it.
    package struct Loop: Sendable {
        package var threadID: pid_t
        package var name: String

        package init(threadID: pid_t, name: String) {
            self.threadID = threadID
            self.name = name
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
    private let startedAt = stallmon_now_ns()
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
    private let runQueue = RunQueueClock()
    private var sample = stallmon_sample()

    /// The watchdog thread's name, in the kernel (at most 15 bytes).
    package static let threadName = "stallmon-nio"

    /// - Parameters:
    ///   - loops: The loops to watch, with their tick state (from ``makeTickState()``), bound on
    ///     their threads.
    ///   - reporters: One per loop, in the same order.
    init(
        configuration: StallMonitor.Configuration, loops: [(Loop, TickState)], reporters: [Reporter], signal: Int32?,
        slot: Int32
    ) throws(StallMonitorError) {
        self.configuration = configuration
        self.loops = loops.map { LoopState(loop: $0.0, ticks: $0.1.pointer) }
        self.reporters = reporters
        self.signal = signal
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
        close(stopFD)
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
        Watchdog.startThread(named: Self.threadName) { [self] in
            watchdogThreadID.store(stallmon_gettid(), ordering: .releasing)
        } body: { [self] in
            runQueue.open()
            run()
            runQueue.close()
            finished.signal()
        }
    }

    /// Stops the thread and waits for it; stalls in progress get their ended reports.
    func stop() {
        stopping.store(true, ordering: .releasing)
        stallmon_eventfd_signal(stopFD)
        stopWaiter.signal()
        finished.wait()
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
        let ticks: OpaquePointer
        let inspector: ThreadInspector
        var phase: Phase = .unknown(since: 0)
        /// The loop's epoll descriptor the latest poll was submitted for (-1: none).
        var registeredFD: Int32 = -1
        /// Whether that poll is still pending: it completes at the loop's next wakeup.
        var pollPending = false
        /// CPU time of the thread when its current cycle was first seen, and when it was read.
        var cpuBase: (cpu: Int64, time: UInt64) = (-1, 0)

        init(loop: Loop, ticks: OpaquePointer) {
            self.loop = loop
            self.ticks = ticks
            self.inspector = ThreadInspector(threadID: loop.threadID)
        }

        var sequence: UInt64 { stallmon_ticks_sequence(ticks) }
    }

    final class StallInProgress {
        let stallID = Watchdog.newStallID()
        let start: UInt64
        let sequence: UInt64
        let suppressed: Bool
        var nextSample: UInt64
        var samples = 0
        var unanswered = 0
        var stacks: StackAggregator
        var firstStack: [UInt] = []
        var firstSource = StallReport.StackSource.signal
        /// The latest stack sampled, reused when a blocked thread cannot be unwound again.
        var latestStack: [UInt]?
        var states: [Character: Int] = [:]
        var waits: [KernelWait: Int] = [:]
        var latestView = KernelThreadView()
        var viewedAt: UInt64 = 0
        var noStackReason: String?

        init(start: UInt64, sequence: UInt64, suppressed: Bool, nextSample: UInt64, capacity: Int) {
            self.start = start
            self.sequence = sequence
            self.suppressed = suppressed
            self.nextSample = nextSample
            self.stacks = StackAggregator(capacity: capacity)
        }
    }

    // MARK: - Watching

    private func run() {
        let now = stallmon_now_ns()
        for index in loops.indices { examine(index, now: now) }
        var keys = [UInt64](repeating: 0, count: 64)
        while !stopping.load(ordering: .acquiring) {
            let queuedBefore = runQueue.waited()
            let timeout = nextTimeout()
            let count: Int32
            if let watch {
                count = keys.withUnsafeMutableBufferPointer {
                    stallmon_watch_wait(watch, timeout, $0.baseAddress, Int32($0.count))
                }
            } else {
                _ = stopWaiter.wait(
                    timeout: timeout == UInt64.max ? .distantFuture : .now() + .nanoseconds(Int(timeout)))
                count = 0
            }
            wakeupCount.add(1, ordering: .relaxed)
            // A cycle started when the loop's descriptor woke the watchdog's poll, which is when
            // the watchdog became runnable: time it then spent waiting for a CPU is the loop's.
            var woke = stallmon_now_ns()
            if let before = queuedBefore, let after = runQueue.waited(), after > before, after - before < woke {
                woke -= after - before
            }
            for key in keys.prefix(Int(max(0, count))) where key != UInt64.max {
                let index = Int(key)
                guard loops.indices.contains(index) else { continue }
                loops[index].pollPending = false
                guard case .idle = loops[index].phase else { continue }
                startCycle(index, at: woke)
            }
            let now = stallmon_now_ns()
            for index in loops.indices { visit(index, now: now) }
        }
        let end = stallmon_now_ns()
        for index in loops.indices {
            if case .stalled(let stall) = loops[index].phase { finish(index, stall, end: end) }
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
            case .timing(let start, _): next = start + threshold
            case .stalled(let stall): next = stall.nextSample
            }
            earliest = min(earliest ?? next, next)
        }
        guard let earliest else { return UInt64.max }
        let now = stallmon_now_ns()
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

    private func startCycle(_ index: Int, at start: UInt64) {
        let state = loops[index]
        let sequence = state.sequence
        // A tick that ended after `start` is counted in `sequence` already: the cycle being timed
        // began after it.
        let start = max(start, stallmon_ticks_latest_end(state.ticks))
        state.phase = .timing(start: start, sequence: sequence)
        // The end of this cycle's tick, however late the watchdog looks: a cycle that outlasted
        // the threshold is a stall even when the watchdog only gets a CPU after it ended.
        stallmon_ticks_watch(state.ticks, sequence)
        state.cpuBase = (stallmon_thread_cpu_ns(state.loop.threadID), stallmon_now_ns())
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
        case .timing(let start, let sequence):
            let deadline = start + threshold
            if state.sequence != sequence {
                if reportIfLate(index, start: start, sequence: sequence, now: now) { return }
                if now + threshold / 4 >= deadline { examine(index, now: now, timedSince: start) }
                return
            }
            guard now >= deadline else { return }
            var view = stallmon_syscall_view()
            stallmon_read_syscall(state.loop.threadID, &view)
            if view.state == 0, stallmon_syscall_is_epoll_wait(view.number) == 1 {
                examine(index, now: now)
                return
            }
            if view.state < 0 {
                state.phase = .unknown(since: now)
                return
            }
            beginStall(index, start: start, sequence: sequence, now: now)
        case .stalled(let stall):
            var end: UInt64 = 0
            if stallmon_ticks_watched_end(state.ticks, stall.sequence, &end) == 1 {
                finish(index, stall, end: end)
            } else if state.sequence != stall.sequence {
                // The tick ended before the loop saw the watch: the latest tick end bounds it.
                finish(index, stall, end: min(stallmon_ticks_latest_end(state.ticks), now))
            } else if now >= stall.nextSample {
                takeSample(state, stall)
                stall.nextSample += sampleInterval
                let after = stallmon_now_ns()
                if stall.nextSample < after { stall.nextSample = after + sampleInterval }
            }
        }
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
        var end: UInt64 = 0
        guard stallmon_ticks_watched_end(state.ticks, sequence, &end) == 1, end > start, end - start >= threshold
        else { return false }
        let stall = StallInProgress(
            start: start, sequence: sequence, suppressed: isSuppressed(now), nextSample: now,
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
            start: start, sequence: sequence, suppressed: isSuppressed(now), nextSample: now + sampleInterval,
            capacity: configuration.maximumStacks
        )
        state.phase = .stalled(stall)
        takeSample(state, stall)
        if !stall.suppressed {
            reporters[index].submit(
                captured(
                    state, stall, event: .detected, end: stallmon_now_ns(),
                    stacks: stall.firstStack.isEmpty ? [] : [(stall.firstStack, 1)],
                    sources: stall.firstStack.isEmpty ? [] : [stall.firstSource]))
        }
    }

    private func finish(_ index: Int, _ stall: StallInProgress, end: UInt64) {
        let state = loops[index]
        stallmon_ticks_watch(state.ticks, 0)
        stallCount.add(1, ordering: .relaxed)
        if !stall.suppressed {
            reporters[index].submit(
                captured(state, stall, event: .ended, end: end, stacks: stall.stacks.all, sources: stall.stacks.sources)
            )
        }
        examine(index, now: stallmon_now_ns())
    }

    private func captured(
        _ state: LoopState, _ stall: StallInProgress, event: StallReport.Event, end: UInt64,
        stacks: [(stack: [UInt], count: Int)], sources: [StallReport.StackSource]
    ) -> CapturedStall {
        let duration = end > stall.start ? end - stall.start : 0
        // The share of CPU the thread used since the watchdog first saw this cycle, applied to the
        // whole cycle (which may have begun before, at the end of the previous tick).
        var cpu: UInt64 = 0
        let used = stallmon_thread_cpu_ns(state.loop.threadID)
        let readAt = stallmon_now_ns()
        if state.cpuBase.cpu >= 0, used >= state.cpuBase.cpu, readAt > state.cpuBase.time {
            let share = min(1, Double(used - state.cpuBase.cpu) / Double(readAt - state.cpuBase.time))
            cpu = min(UInt64(share * Double(duration)), duration)
        }
        return CapturedStall(
            event: event, stallID: stall.stallID, startNanoseconds: stall.start, duration: duration, paused: 0,
            activity: .eventLoopCycle, runLoopMode: "none", cpu: cpu, samples: stall.samples,
            unansweredSamples: stall.unanswered, stacks: stacks, stackSources: sources,
            threadState: Watchdog.dominantState(stall.states),
            kernelView: Watchdog.dominantWait(stall.waits, fallback: stall.latestView),
            noStackReason: stall.firstStack.isEmpty ? stall.noStackReason : nil,
            capturedNanoseconds: stallmon_now_ns()
        )
    }

    /// One sample of a stalled loop: the kernel's view (every 100 ms at most) and its stack. A
    /// thread inside a system call is never signalled (a handler would end calls such as
    /// `nanosleep` or `epoll_wait` with EINTR): its stack is unwound from the kernel's view.
    private func takeSample(_ state: LoopState, _ stall: StallInProgress) {
        stall.samples += 1
        let now = stallmon_now_ns()
        if stall.viewedAt == 0 || now - stall.viewedAt >= 100_000_000 {
            let view = state.inspector.view()
            stall.viewedAt = now
            stall.latestView = view
            stall.states[view.state, default: 0] += 1
            stall.waits[KernelWait(syscall: view.syscall, waitChannel: view.waitChannel), default: 0] += 1
        }
        guard let (addresses, source) = capture(state, stall) else {
            stall.unanswered += 1
            return
        }
        stall.stacks.add(addresses, source: source)
        if stall.firstStack.isEmpty { (stall.firstStack, stall.firstSource) = (addresses, source) }
    }

    private func capture(_ state: LoopState, _ stall: StallInProgress) -> (
        stack: [UInt], source: StallReport.StackSource
    )? {
        // A loop in a system call is unwound in place from the kernel's view; only a running loop
        // is signalled, and none at all without a signal.
        var flags = Int32(STALLMON_SAMPLE_SPARE_SYSCALLS)
        if signal == nil { flags |= Int32(STALLMON_SAMPLE_NO_SIGNAL) }
        stallmon_sample_stack(
            slot, state.loop.threadID, signal ?? 0, Int32(configuration.maximumFrames),
            UInt64(configuration.sampleTimeout.nanoseconds), flags, &sample
        )
        switch sample.status {
        case Int32(STALLMON_SAMPLE_OK.rawValue):
            let count = Int(sample.frame_count)
            let stack = withUnsafeBytes(of: sample.frames) { raw in
                Array(raw.bindMemory(to: UInt.self).prefix(count))
            }
            stall.latestStack = stack
            return (stack, sample.source == Int32(STALLMON_STACK_KERNEL.rawValue) ? .kernel : .signal)
        case Int32(STALLMON_SAMPLE_SIGNAL_TAKEN.rawValue):
            stall.noStackReason =
                signal == nil ? "no free signal for sampling" : "the program took over the sampling signal"
        case Int32(STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED.rawValue):
            if let latest = stall.latestStack { return (latest, .previous) }
            let why = sample.error == EAGAIN ? "it kept waking up" : "libunwind error \(sample.error)"
            stall.noStackReason =
                "blocked in \(SyscallNames.name(Int(sample.syscall))) and not unwound from the kernel's view (\(why))"
        case Int32(STALLMON_SAMPLE_SYSCALL_BUSY.rawValue):
            if let latest = stall.latestStack { return (latest, .previous) }
            stall.noStackReason = "thread kept blocking in short system calls, which a signal would end with EINTR"
        case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue):
            stall.noStackReason = "thread did not answer within \(configuration.sampleTimeout.milliseconds) ms"
        default:
            stall.noStackReason = "sampling failed (status \(sample.status), error \(sample.error))"
        }
        return nil
    }
}

extension EventLoopWatchdog.Loop {
    /// The calling thread, named as the kernel shows it (`NIO-ELT-0-#1` for SwiftNIO's loops).
    package static func current() -> Self {
        let threadID = stallmon_gettid()
        return Self(threadID: threadID, name: ThreadInspector(threadID: threadID).name() ?? "tid-\(threadID)")
    }
}
#endif  // STALLMON_LINUX
