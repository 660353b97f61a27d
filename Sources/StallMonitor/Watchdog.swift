#if STALLMON_LINUX
import CStallCapture
import CoreFoundation
import Dispatch
import Foundation
import Logging
import Synchronization

/// A stall as the watchdog saw it: raw addresses and kernel views, before symbolication.
struct CapturedStall: Sendable {
    var event: StallReport.Event
    var stallID: String
    var startNanoseconds: UInt64
    var duration: UInt64
    var paused: UInt64
    var activity: StallReport.Activity
    var runLoopMode: String
    var cpu: UInt64
    var samples: Int
    var unansweredSamples: Int
    /// Distinct stacks (innermost first) with the samples they were seen in: the first one for a
    /// detected report, all of them for an ended report.
    var stacks: [(stack: [UInt], count: Int)]
    /// How each of `stacks` was taken (same order).
    var stackSources: [StallReport.StackSource] = []
    var threadState: Character
    /// The system call and wait channel seen most often.
    var kernelView: KernelThreadView
    var noStackReason: String?
    /// CLOCK_MONOTONIC when the watchdog handed it over.
    var capturedNanoseconds: UInt64
    /// The service's `WatchdogSec=` in nanoseconds, for a watchdog report.
    var watchdogInterval: UInt64?
}

/// The watchdog thread of one monitor: sleeps until the current window could become a stall,
/// parks while the loop is idle, and samples the stalled thread while a stall lasts.
final class Watchdog: @unchecked Sendable {
    struct Target: @unchecked Sendable {
        var threadID: pid_t
        var loopName: String
        var runLoop: CFRunLoop
    }

    let configuration: StallMonitor.Configuration
    let target: Target
    /// The observer's state; the watchdog holds one reference.
    let loop: OpaquePointer
    let semaphore: DispatchSemaphore
    private let signal: Int32?
    private let slot: Int32
    private let inspector: ThreadInspector
    private let clocks: ThreadClocks
    private let deliver: @Sendable (CapturedStall) -> Void
    /// Hands a report over and returns once it is written (for the report before a watchdog kill).
    private let deliverNow: @Sendable (CapturedStall) -> Void
    private let logger: Logger
    private let startedAt: UInt64
    private let stopping = Atomic<Bool>(false)
    private let idleWaitRange = Mutex<Range<UInt>?>(nil)
    /// One of the monitor's observers: the modes it is in are the modes the monitor sees.
    private let observer = Mutex<ObserverReference?>(nil)
    private let finished = DispatchSemaphore(value: 0)
    private let watchdogThreadID = Atomic<Int32>(0)
    private let stallCount = Atomic<Int>(0)

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
    private var continueCount: UInt64 = 0
    /// Time the watchdog thread waited for a CPU during its latest `wait(until:)`: lateness that is
    /// no stop of the process.
    private var lastWaitQueued: UInt64 = 0
    private let runQueue = RunQueueClock()
    private var sample = stallmon_sample()
    /// Whether the next idle phase parks the watchdog. After the observer woke it, it first waits
    /// out one quiet threshold: a loop that sleeps briefly on every pass would otherwise wake it
    /// on every pass.
    private var parkNext = true
    /// `TracerPid` and the thread's signal mask, read at most once a second.
    private var tracerChecked: (time: UInt64, attached: Bool) = (0, false)
    private var signalChecked: (time: UInt64, problem: String?) = (0, nil)
    /// Said once on the logger: the program took the sampling signal over; a signal ended one of
    /// its system calls.
    private var signalTakenLogged = false
    private var interruptionLogged = false
    /// Pings of the service manager's watchdog, when the service runs with `WatchdogSec=`.
    private var serviceWatchdog: ServiceWatchdogSchedule?
    /// Whether the loop has turned since the start, and whether the monitor warned that it did not.
    private var firstTurn = FirstTurn.awaited
    private let notice: @Sendable (LoopNotice) -> Void

    /// What the monitor tells its logger about the loop itself (not about a stall).
    enum LoopNotice: Sendable {
        /// The loop has not turned once in `waited` nanoseconds since the monitor started.
        case notTurning(waited: UInt64)
        /// The loop turned for the first time `waited` nanoseconds after the start, after a warning.
        case turnedLate(waited: UInt64)
    }

    private enum FirstTurn {
        case awaited
        case warned
        case seen
    }

    init(
        configuration: StallMonitor.Configuration, target: Target, loop: OpaquePointer, semaphore: DispatchSemaphore,
        signal: Int32?, slot: Int32, logger: Logger, deliver: @escaping @Sendable (CapturedStall) -> Void,
        deliverNow: @escaping @Sendable (CapturedStall) -> Void, notice: @escaping @Sendable (LoopNotice) -> Void
    ) {
        self.configuration = configuration
        self.target = target
        self.loop = loop
        self.semaphore = semaphore
        self.signal = signal
        self.slot = slot
        self.inspector = ThreadInspector(threadID: target.threadID)
        self.clocks = ThreadClocks(threadID: target.threadID)
        self.deliver = deliver
        self.deliverNow = deliverNow
        self.notice = notice
        self.logger = logger
        self.startedAt = stallmon_now_ns()
        self.serviceWatchdog = ServiceNotifier.watchdogInterval().map {
            ServiceWatchdogSchedule(interval: $0, now: stallmon_now_ns())
        }
        self.continueCount = stallmon_continue_count()
    }

    /// The watchdog thread's kernel id (0 until it runs).
    var threadID: pid_t { watchdogThreadID.load(ordering: .acquiring) }
    var stalls: Int { stallCount.load(ordering: .relaxed) }

    /// The address range of the run loop's own wait for events; samples inside it are idle.
    func setIdleWaitRange(_ range: Range<UInt>?) {
        idleWaitRange.withLock { $0 = range }
    }

    struct ObserverReference: @unchecked Sendable {
        let observer: CFRunLoopObserver
    }

    /// One of the monitor's observers, for telling the modes it sees from those it does not.
    func setObserver(_ observer: CFRunLoopObserver) {
        self.observer.withLock { $0 = ObserverReference(observer: observer) }
    }

    /// The watchdog thread's name, in Foundation and in the kernel (at most 15 bytes).
    static let threadName = "stallmon-watch"

    /// Starts the thread and returns once it runs, so that ``threadID`` is known.
    func start() {
        Self.startThread(named: Self.threadName) { [self] in
            watchdogThreadID.store(stallmon_gettid(), ordering: .releasing)
        } body: { [self] in
            runQueue.open()
            run()
            runQueue.close()
            finished.signal()
        }
    }

    /// Starts a watchdog thread (of either kind of loop) and returns once it runs: `started` has
    /// run on it, and the kernel knows its name.
    static func startThread(
        named name: String, started: @escaping @Sendable () -> Void, body: @escaping @Sendable () -> Void
    ) {
        let running = DispatchSemaphore(value: 0)
        let thread = Thread {
            started()
            // Thread.name set before the start does not reach the kernel on Linux.
            stallmon_set_thread_name(name)
            running.signal()
            stallmon_set_timer_slack(1)
            body()
        }
        thread.name = name
        thread.stackSize = 512 * 1024
        thread.start()
        running.wait()
    }

    /// Stops the thread and waits for it; a stall in progress gets its ended report.
    func stop() {
        stopping.store(true, ordering: .releasing)
        semaphore.signal()
        finished.wait()
    }

    private var threshold: UInt64 { UInt64(configuration.threshold.nanoseconds) }
    private var isStopping: Bool { stopping.load(ordering: .acquiring) }

    // MARK: - Watching

    private func run() {
        while !isStopping {
            var event = stallmon_event()
            guard stallmon_loop_latest(loop, &event) == 1 else {
                awaitFirstTurn()
                continue
            }
            if firstTurn != .seen {
                if firstTurn == .warned { notice(.turnedLate(waited: stallmon_now_ns() - startedAt)) }
                firstTurn = .seen
            }
            pingServiceWatchdog(event)
            switch event.phase {
            case UInt32(STALLMON_LOOP_ACTIVE.rawValue):
                watchWindow(event)
            default:
                noteCPUWhileIdle(event)
                if !parkNext {
                    // A window that starts from now on cannot cross the threshold before now +
                    // threshold, so this wait delays no detection. A loop that stayed quiet
                    // throughout gets the watchdog parked next time.
                    waitNoticingStops(until: cappedByPing(stallmon_now_ns() + threshold))
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
                    waitNoticingStops(until: cappedByPing(stallmon_now_ns() + threshold))
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
            deadline = min(startedAt + grace + timeout, serviceWatchdog?.finalReportTime ?? .max)
            if let due = deadline, stallmon_now_ns() >= due {
                firstTurn = .warned
                notice(.notTurning(waited: stallmon_now_ns() - startedAt))
                return
            }
        }
        switch stallmon_loop_park(loop, 0) {
        case 1:
            wait(until: deadline)
        case -1:
            // Parking is unsafe here: poll once per threshold instead.
            wait(until: min(deadline ?? .max, stallmon_now_ns() + threshold))
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
        let now = stallmon_now_ns()
        var healthy = true
        if event.phase == UInt32(STALLMON_LOOP_ACTIVE.rawValue), stallmon_loop_allowed(loop) == 0 {
            healthy = now < windowStart(of: event) + threshold
        }
        serviceWatchdog?.pingIfDue(now: now, healthy: healthy)
    }

    /// `deadline`, or the next ping of the service watchdog when that comes first.
    private func cappedByPing(_ deadline: UInt64) -> UInt64 {
        guard let nextPing = serviceWatchdog?.nextPing, nextPing > stallmon_now_ns() else { return deadline }
        return min(deadline, nextPing)
    }

    private func watchWindow(_ event: stallmon_event) {
        if event.sequence != armedSequence {
            armedSequence = event.sequence
            armedBefore = lastCPUReading.map { ($0.reading, $0.asleep && $0.sequence + 1 == event.sequence) }
            armedReading = clocks.read()
            if let armedReading { lastCPUReading = (armedReading, event.sequence, false) }
            if !configuration.interruptBlockedThreads { stallmon_sampler_note_running(slot, target.threadID) }
        }
        let windowStart = windowStart(of: event)
        let deadline = windowStart + threshold
        let now = stallmon_now_ns()
        if now < deadline {
            waitNoticingStops(until: cappedByPing(deadline))
            return
        }
        if wasContinued() {
            // The process was stopped and continued since the last look: the time it spent
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

    /// Whether a SIGCONT arrived since the last call.
    private func wasContinued() -> Bool {
        let count = stallmon_continue_count()
        defer { continueCount = count }
        return count != continueCount
    }

    /// Whether the process was stopped while the watchdog slept: a SIGCONT arrived, or the wakeup
    /// came far later than asked for (a stop the handler could not see, such as a debugger's).
    /// Lateness spent waiting for a CPU is no stop: a stopped thread is not on a run queue.
    private func processWasStopped(wokeAt woke: UInt64, deadline: UInt64) -> Bool {
        if wasContinued() { return true }
        return woke > deadline && woke - deadline > pauseTolerance &+ lastWaitQueued
    }

    /// When a sample began, to tell afterwards whether the process was stopped during it.
    private struct SampleStart {
        let time = stallmon_now_ns()
        let queued: UInt64?
        /// How much longer than allowed the sample took (set by ``sampleWasStopped(_:)``).
        var lateness: UInt64 = 0

        init(_ runQueue: RunQueueClock) {
            queued = runQueue.waited()
        }
    }

    /// Whether the process was stopped during a sample: a SIGCONT arrived, or the sample took
    /// longer than its timeout by more than the pause tolerance and the watchdog's wait for a CPU
    /// (a SIGCONT handler cannot run where every thread blocks SIGCONT).
    private func sampleWasStopped(_ start: inout SampleStart) -> Bool {
        let elapsed = stallmon_now_ns() - start.time
        let expected = UInt64(configuration.sampleTimeout.nanoseconds) &+ queued(since: start.queued)
        start.lateness = elapsed > expected ? elapsed - expected : 0
        return wasContinued() || start.lateness > pauseTolerance
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
        let now = stallmon_now_ns()
        if now > event.timestamp_ns, now - event.timestamp_ns > pauseTolerance &+ lastWaitQueued {
            resumedAt = now
        }
    }

    private var pauseTolerance: UInt64 {
        let half = threshold / 2
        return max(5_000_000, min(half, 25_000_000))
    }

    /// Waits on the semaphore until `deadline` (CLOCK_MONOTONIC; `nil` waits for a signal only),
    /// and notes how long of it the thread spent waiting for a CPU; returns the time it woke.
    @discardableResult
    private func wait(until deadline: UInt64?) -> UInt64 {
        let queuedBefore = runQueue.waited()
        if let deadline {
            let now = stallmon_now_ns()
            if deadline > now {
                _ = semaphore.wait(timeout: .now() + .nanoseconds(Int(deadline - now)))
            }
        } else {
            semaphore.wait()
        }
        lastWaitQueued = queued(since: queuedBefore)
        return stallmon_now_ns()
    }

    /// Waits until `deadline`; when the process was stopped meanwhile, the current window counts
    /// from now.
    private func waitNoticingStops(until deadline: UInt64) {
        let woke = wait(until: deadline)
        if processWasStopped(wokeAt: woke, deadline: deadline) {
            resumedAt = stallmon_now_ns()
        }
    }

    /// Run-queue time of the watchdog thread since `start` (0 when either reading is missing).
    private func queued(since start: UInt64?) -> UInt64 {
        guard let start, let now = runQueue.waited(), now >= start else { return 0 }
        return now - start
    }

    // MARK: - Stalls

    private func handleStall(_ event: stallmon_event, windowStart: UInt64) {
        let sequence = event.sequence
        stallmon_loop_watch(loop, sequence)
        defer { stallmon_loop_watch(loop, 0) }
        let watchedAt = stallmon_now_ns()
        var latest = stallmon_event()
        guard stallmon_loop_latest(loop, &latest) == 1, latest.sequence == sequence else {
            return  // the window closed just as it crossed the threshold
        }

        let suppressed =
            isInGracePeriod(watchedAt)
            || (!configuration.reportWhileDebuggerAttached && ThreadInspector.tracerPID() != 0)
        let activity: StallReport.Activity =
            event.window == UInt32(STALLMON_WINDOW_AFTER_WAITING.rawValue) ? .afterWaiting : .beforeSources
        let mode = currentMode()
        let blockedReason = signalProblem()

        var stacks = StackAggregator(capacity: configuration.maximumStacks)
        var samples = 0
        var unanswered = 0
        var states: [Character: Int] = [:]
        var waits: [KernelWait: Int] = [:]
        var latestView = KernelThreadView()
        var noStackReason: String?
        var paused: UInt64 = 0
        var firstStack: [UInt] = []
        var firstSource = StallReport.StackSource.signal
        var latestStack: [UInt]?

        // Returns false when the sample shows the loop idle in its own wait (a nested run in a
        // mode the observers do not see): then there is no stall.
        // The kernel's view costs three /proc reads, more than the stack itself: it is read with
        // the first sample and then every 100 ms.
        var viewedAt: UInt64 = 0
        func takeSample() -> Bool {
            samples += 1
            var viewed: KernelThreadView?
            let now = stallmon_now_ns()
            if viewedAt == 0 || now - viewedAt >= 100_000_000 {
                let view = inspector.view()
                viewedAt = now
                viewed = view
                latestView = view
                states[view.state, default: 0] += 1
                waits[KernelWait(syscall: view.syscall, waitChannel: view.waitChannel), default: 0] += 1
            }
            func idle() -> Bool {
                samples -= 1
                if let view = viewed {
                    states[view.state, default: 1] -= 1
                    waits[KernelWait(syscall: view.syscall, waitChannel: view.waitChannel), default: 1] -= 1
                }
                return false
            }
            let waitFunction = idleWaitRange.withLock { $0 }
            if waitFunction == nil, isIdleInUnobservedMode(syscall: viewed?.syscall ?? inspector.syscall()) {
                return idle()
            }
            guard let (addresses, source) = capture(blockedReason: blockedReason) else {
                unanswered += 1
                return true
            }
            if let waitFunction, isIdleWait(addresses, in: waitFunction) {
                return idle()
            }
            // A sample that got no stack of its own counts as unanswered; the latest stack of the
            // stall stands in for it.
            if source == .previous { unanswered += 1 }
            stacks.add(addresses, source: source)
            if firstStack.isEmpty { (firstStack, firstSource) = (addresses, source) }
            return true
        }

        // By default a thread in a system call is never signalled (a handler would end nanosleep,
        // poll, epoll_wait… with EINTR): it is unwound in place from the kernel's view of it.
        func capture(blockedReason: String?) -> (stack: [UInt], source: StallReport.StackSource)? {
            var flags = configuration.interruptBlockedThreads ? 0 : Int32(STALLMON_SAMPLE_SPARE_SYSCALLS)
            if blockedReason != nil {
                flags = Int32(STALLMON_SAMPLE_SPARE_SYSCALLS | STALLMON_SAMPLE_NO_SIGNAL)
            }
            stallmon_sample_stack(
                slot, target.threadID, signal ?? 0, Int32(configuration.maximumFrames),
                UInt64(configuration.sampleTimeout.nanoseconds), flags, &sample
            )
            if sample.interrupted_syscall != 0 { noteInterruptedSyscall() }
            switch sample.status {
            case Int32(STALLMON_SAMPLE_OK.rawValue):
                let count = Int(sample.frame_count)
                let stack = withUnsafeBytes(of: sample.frames) { raw in
                    Array(raw.bindMemory(to: UInt.self).prefix(count))
                }
                latestStack = stack
                return (stack, sample.source == Int32(STALLMON_STACK_KERNEL.rawValue) ? .kernel : .signal)
            case Int32(STALLMON_SAMPLE_SIGNAL_TAKEN.rawValue) where blockedReason != nil:
                noStackReason = blockedReason
            case Int32(STALLMON_SAMPLE_SIGNAL_TAKEN.rawValue):
                noStackReason = signalTaken(sample.disposition)
            case Int32(STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED.rawValue):
                if let latestStack { return (latestStack, .previous) }
                let why = sample.error == EAGAIN ? "it kept waking up" : "libunwind error \(sample.error)"
                noStackReason =
                    "blocked in \(SyscallNames.name(Int(sample.syscall))) and not unwound from the kernel's view (\(why))"
            case Int32(STALLMON_SAMPLE_SYSCALL_BUSY.rawValue):
                if let latestStack { return (latestStack, .previous) }
                noStackReason = "thread kept blocking in short system calls, which a signal would end with EINTR"
            case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue) where sample.error == EAGAIN:
                noStackReason =
                    "thread has not run since the last sample request (blocked in the kernel or descheduled)"
            case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue) where sample.error == EDEADLK:
                noStackReason = "the sampler is stuck in an earlier unwind"
            case Int32(STALLMON_SAMPLE_TIMEOUT.rawValue):
                noStackReason = "thread did not answer within \(configuration.sampleTimeout.milliseconds) ms"
            case Int32(STALLMON_SAMPLE_SEND_FAILED.rawValue):
                noStackReason = "signal could not be sent (errno \(sample.error))"
            default:
                noStackReason = "unwinding failed (\(sample.error))"
            }
            return nil
        }

        let startReading = clocks.read()
        var sampleBegan = SampleStart(runQueue)
        if !takeSample() {
            floor = (sequence, stallmon_now_ns())
            return
        }
        let stallID = Self.newStallID()
        let armed = armedSequence == sequence
        let insideReadings = [armed ? armedReading : nil, startReading].compactMap { $0 }
        var cpuAccount =
            insideReadings.isEmpty
            ? nil
            : StallCPUAccount(
                windowStart: windowStart, before: armed ? armedBefore?.reading : nil,
                sleptUntilStart: armed && armedBefore?.sleptUntilStart == true, after: insideReadings)
        var sleptSinceEnd = false
        var pausedOutsideAccount: UInt64 = 0

        /// Reads the thread's clocks; when the process was stopped since the previous reading,
        /// adds the stop to `paused`. Called after every wait and every sample, so that each stop
        /// falls between two readings: right after a sample, the thread has just run, and its
        /// runnable time is up to date.
        func readClocks(stopped: Bool, late: UInt64 = 0) {
            if var account = cpuAccount, let reading = clocks.read() {
                account.record(reading, stopped: stopped, late: late)
                cpuAccount = account
                paused = pausedOutsideAccount + account.paused
            } else if stopped {
                pausedOutsideAccount += late
                paused = pausedOutsideAccount + (cpuAccount?.paused ?? 0)
            }
        }
        readClocks(stopped: sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)

        func captured(
            _ kind: StallReport.Event, end: UInt64, stacks: [(stack: [UInt], count: Int)],
            sources: [StallReport.StackSource]
        ) -> CapturedStall {
            let duration = end > windowStart + paused ? end - windowStart - paused : 0
            let cpu = cpuAccount?.used(until: end, sleptSinceEnd: sleptSinceEnd) ?? 0
            return CapturedStall(
                event: kind, stallID: stallID, startNanoseconds: windowStart, duration: duration, paused: paused,
                activity: activity, runLoopMode: mode, cpu: min(cpu, duration),
                samples: samples, unansweredSamples: unanswered, stacks: stacks, stackSources: sources,
                threadState: Self.dominantState(states),
                kernelView: Self.dominantWait(waits, fallback: latestView),
                noStackReason: firstStack.isEmpty ? noStackReason : nil,
                capturedNanoseconds: stallmon_now_ns()
            )
        }

        if !suppressed {
            let first = firstStack.isEmpty ? [] : [(stack: firstStack, count: 1)]
            deliver(captured(.detected, end: stallmon_now_ns(), stacks: first, sources: first.map { _ in firstSource }))
        }

        // Sample until the window closes. With a service watchdog, no pings go out meanwhile, and a
        // stall that outlasts most of its interval gets a final report before systemd kills us.
        var end: UInt64 = 0
        var nextSample = stallmon_now_ns() + UInt64(configuration.sampleInterval.nanoseconds)
        var finalReportWritten = false
        while true {
            var target = nextSample
            if let schedule = serviceWatchdog, !finalReportWritten { target = min(target, schedule.finalReportTime) }
            let woke = wait(until: target)
            // Late by a stop, less any time spent waiting for a CPU (no stop); the thread's
            // runnable time tells when the stop began.
            let stopped = processWasStopped(wokeAt: woke, deadline: target)
            readClocks(stopped: stopped, late: woke > target ? (woke - target) - min(lastWaitQueued, woke - target) : 0)
            if let schedule = serviceWatchdog, !finalReportWritten, stallmon_now_ns() >= schedule.finalReportTime {
                finalReportWritten = true
                var report = captured(.watchdog, end: stallmon_now_ns(), stacks: stacks.all, sources: stacks.sources)
                report.watchdogInterval = schedule.interval
                deliverNow(report)
            }
            var endTime: UInt64 = 0
            if stallmon_loop_watched_end(loop, sequence, &endTime) == 1 {
                end = endTime
                break
            }
            var current = stallmon_event()
            if stallmon_loop_latest(loop, &current) == 1, current.sequence != sequence {
                // The loop moved on. The observer records the end before it publishes the next
                // transition, so look again; if it never saw the watch, the transition that ended
                // the window is the exact end while it is still in the ring, and watchedAt (which
                // it preceded) bounds it otherwise.
                var next = stallmon_event()
                if stallmon_loop_watched_end(loop, sequence, &endTime) == 1 {
                    end = endTime
                } else if stallmon_loop_event_after(loop, sequence, &next) == 1, next.timestamp_ns != 0 {
                    end = next.timestamp_ns
                } else {
                    end = watchedAt
                }
                break
            }
            if isStopping {
                end = stallmon_now_ns()
                break
            }
            if stallmon_now_ns() >= nextSample {
                sampleBegan = SampleStart(runQueue)
                if !takeSample() {
                    end = stallmon_now_ns()
                    floor = (sequence, end)
                    break
                }
                readClocks(stopped: sampleWasStopped(&sampleBegan), late: sampleBegan.lateness)
                nextSample += UInt64(configuration.sampleInterval.nanoseconds)
                let now = stallmon_now_ns()
                if nextSample < now { nextSample = now + UInt64(configuration.sampleInterval.nanoseconds) }
            }
        }

        // A reading after the end; the loop slept from the end through it if no transition followed
        // its sleep.
        if let reading = clocks.read() { cpuAccount?.record(reading) }
        var afterEnd = stallmon_event()
        sleptSinceEnd =
            stallmon_loop_latest(loop, &afterEnd) == 1 && afterEnd.sequence == sequence + 1
            && afterEnd.phase == UInt32(STALLMON_LOOP_ASLEEP.rawValue)
        if let cpuAccount { lastCPUReading = (cpuAccount.latest, sequence, false) }
        stallCount.add(1, ordering: .relaxed)
        if !suppressed {
            deliver(captured(.ended, end: end, stacks: stacks.all, sources: stacks.sources))
        }
    }

    /// The system call and wait channel seen in most samples (a thread that loops over short
    /// sleeps is "in poll" even if the last sample caught it between two).
    static func dominantWait(_ waits: [KernelWait: Int], fallback: KernelThreadView) -> KernelThreadView {
        guard
            let wait = waits.filter({ $0.value > 0 }).max(by: { lhs, rhs in
                lhs.value != rhs.value ? lhs.value < rhs.value : (lhs.key.syscall == nil && rhs.key.syscall != nil)
            })?.key
        else { return fallback }
        var view = fallback
        view.syscall = wait.syscall
        view.waitChannel = wait.waitChannel
        return view
    }

    /// The state seen in most samples; ties go to the more telling one (R before D before S).
    static func dominantState(_ states: [Character: Int]) -> Character {
        let preference: [Character] = ["R", "D", "S", "T", "t", "Z"]
        func rank(_ state: Character) -> Int { preference.firstIndex(of: state) ?? preference.count }
        return states.filter { $0.value > 0 }.max { lhs, rhs in
            lhs.value != rhs.value ? lhs.value < rhs.value : rank(lhs.key) > rank(rhs.key)
        }?.key ?? "?"
    }

    private func isInGracePeriod(_ now: UInt64) -> Bool {
        now < startedAt + UInt64(configuration.startupGracePeriod.nanoseconds)
    }

    /// Why the thread cannot be sampled at all, or `nil` when it can (`SigBlk`, read at most once a second).
    private func signalProblem() -> String? {
        guard let signal else { return "no free signal for sampling" }
        let now = stallmon_now_ns()
        if signalChecked.time == 0 || now - signalChecked.time >= 1_000_000_000 {
            signalChecked = (now, inspector.blocks(signal) ? "thread blocks \(SignalName.name(of: signal))" : nil)
        }
        return signalChecked.problem
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
        if !signalTakenLogged {
            signalTakenLogged = true
            logger.warning(
                "the program took over the sampling signal after the monitor started; stalls on the CPU get no stack",
                metadata: ["stallmon.signal": "\(name)", "stallmon.disposition": "\(how)"]
            )
        }
        return reason
    }

    /// The handler found it had ended a system call of the program with EINTR: the thread entered
    /// the call within microseconds of the last look, or blocked threads are interrupted by choice.
    private func noteInterruptedSyscall() {
        guard !interruptionLogged else { return }
        interruptionLogged = true
        logger.warning(
            "a sample interrupted a system call of the monitored thread, which returned EINTR",
            metadata: ["stallmon.interrupt_blocked_threads": "\(configuration.interruptBlockedThreads)"]
        )
    }

    /// Whether a debugger or tracer is attached (`TracerPid`, read at most once a second).
    private func tracerAttached(_ now: UInt64) -> Bool {
        if tracerChecked.time == 0 || now - tracerChecked.time >= 1_000_000_000 {
            tracerChecked = (now, ThreadInspector.tracerPID() != 0)
        }
        return tracerChecked.attached
    }

    /// Whether a stack shows the thread in the run loop's own wait for events.
    private func isIdleWait(_ addresses: [UInt], in waitFunction: Range<UInt>) -> Bool {
        addresses.prefix(4).contains { waitFunction.contains($0) || waitFunction.contains($0 &- 1) }
    }

    /// The system calls a run loop waits for events in (CoreFoundation's is ppoll on its epoll
    /// descriptor; others may wait in epoll directly).
    private static let loopWaitCalls: Set<String> = ["ppoll", "poll", "epoll_wait", "epoll_pwait", "epoll_pwait2"]

    /// Idle without CoreFoundation's symbols (before they are loaded, or where they are stripped),
    /// and without a signal: the thread waits in a run loop's wait call while its loop runs a mode
    /// the observers are not in. In a mode they are in, the loop waits only after before-waiting,
    /// outside any window, so a wait seen inside a window there is a callout's own.
    private func isIdleInUnobservedMode(syscall: String?) -> Bool {
        guard let syscall, Self.loopWaitCalls.contains(syscall),
            let observer = observer.withLock({ $0 }),
            let mode = CFRunLoopCopyCurrentMode(target.runLoop)
        else { return false }
        return !CFRunLoopContainsObserver(target.runLoop, observer.observer, mode)
    }

    private func currentMode() -> String {
        guard let mode = CFRunLoopCopyCurrentMode(target.runLoop) else { return "none" }
        return RunLoopModes.string(mode)
    }

    /// 128 random bits as 32 lowercase hex digits, like a journal MESSAGE_ID.
    static func newStallID() -> String {
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        return [high, low].map { value in
            let hex = String(value, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }.joined()
    }
}

/// Where the kernel had a thread waiting, as one sample saw it.
struct KernelWait: Hashable {
    var syscall: String?
    var waitChannel: String?
}

/// Counts the stacks seen during one stall. Stacks are keyed by their return addresses (frames
/// 1…), so a thread busy in one function counts as one stack wherever its program counter is; the
/// reporter merges further, by symbolicated frames.
struct StackAggregator {
    private var entries: [[UInt]: (stack: [UInt], count: Int, order: Int)] = [:]
    /// Samples per stack and per way it was taken.
    private var sourceCounts: [[UInt]: [StallReport.StackSource: Int]] = [:]
    private let capacity: Int
    private(set) var overflow = 0

    init(capacity: Int) {
        self.capacity = capacity
    }

    mutating func add(_ stack: [UInt], source: StallReport.StackSource = .signal) {
        let key = Array(stack.dropFirst())
        if let existing = entries[key] {
            entries[key] = (existing.stack, existing.count + 1, existing.order)
        } else if entries.count < capacity {
            entries[key] = (stack, 1, entries.count)
        } else {
            overflow += 1
            return
        }
        sourceCounts[key, default: [:]][source, default: 0] += 1
    }

    /// Every stack with its count, in the order first seen.
    var all: [(stack: [UInt], count: Int)] {
        entries.values.sorted { $0.order < $1.order }.map { ($0.stack, $0.count) }
    }

    /// How each stack of ``all`` was taken, in the same order: the way most of its samples were.
    var sources: [StallReport.StackSource] {
        entries.sorted { $0.value.order < $1.value.order }.map { key, _ in
            sourceCounts[key]?.max { $0.value < $1.value || ($0.value == $1.value && $0.key.rank > $1.key.rank) }?
                .key ?? .signal
        }
    }
}
#endif  // STALLMON_LINUX
