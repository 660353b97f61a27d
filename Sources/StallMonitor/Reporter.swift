#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// Turns captured stalls into reports off the monitored thread: symbolicates them, applies the
/// rate limit and hands them to the sinks, in order, on the process's reporting thread. Submitting
/// never blocks: past the queue's capacity, reports are dropped and counted.
final class Reporter: @unchecked Sendable {
    private let queue = ReportingThread.shared
    private let sinks: [any ReportSink]
    private let configuration: StallMonitor.Configuration
    private let loopName: String
    private let threadID: Int
    private let pending = AtomicCounter()
    let droppedReports = AtomicCounter()
    /// Deliveries a sink failed (it threw).
    let lostReports = AtomicCounter()
    let suppressedReports = AtomicCounter()
    /// The same counts, and every stall, in the application's metrics backend.
    private let metrics: StallMetrics?

    // Confined to the reporting thread.
    private var limiter: RateLimiter
    private var decisions: [String: Decision] = [:]
    private var flushScheduled = false
    /// The health summary behind `STATUS=`; read from any thread without waiting for the queue.
    let status: StatusBoard

    private enum Decision {
        case admitted
        case suppressed(fingerprint: String)
    }

    /// - Parameter seenTurning: Whether the loop is known to run already (an event loop of a
    ///   running group); otherwise the status says it was not seen running until the watchdog
    ///   sees its first transition.
    init(
        configuration: StallMonitor.Configuration, loopName: String, threadID: Int, sinks: [any ReportSink],
        seenTurning: Bool = false, metrics: StallMetrics? = nil
    ) {
        self.configuration = configuration
        self.metrics = metrics
        self.loopName = loopName
        self.threadID = threadID
        self.sinks = sinks
        self.status = StatusBoard(loopName: loopName, seenTurning: seenTurning)
        self.limiter = RateLimiter(
            burst: configuration.rateLimit.burst, interval: UInt64(configuration.rateLimit.interval.nanoseconds)
        )
    }

    /// Looks `function` up on the reporting thread, where symbols are loaded, and hands its address
    /// range to `found` (`nil` when it is not among the symbols), in the background.
    func lookUp(
        function: String, besides neighbour: String, found: @escaping @Sendable (Range<UInt>?) -> Void
    ) {
        queue.async {
            found(SharedSymbolicator.shared.withSymbolicator { $0.functionRange(named: function, besides: neighbour) })
        }
    }

    func submit(_ stall: CapturedStall) {
        // An ended report is never dropped: its detected report may be out, and the status and
        // the rate limiter pair the two.
        guard pending.add(1) <= configuration.reportQueueCapacity || stall.event == .ended else {
            pending.add(-1)
            droppedReports.add(1)
            metrics?.recordDropped()
            return
        }
        queue.async {
            defer { self.pending.add(-1) }
            self.process(stall)
        }
    }

    /// Reports a stall that outlasted the service watchdog and returns once the sinks have it
    /// (systemd kills the service moments later), or at `deadline` while the reporting thread is
    /// still busy with earlier work; the report goes out when its turn comes.
    func submitNow(_ stall: CapturedStall, waitingUntil deadline: UInt64) {
        queue.sync(waitingUntil: deadline) {
            let report = SharedSymbolicator.shared.withSymbolicator { self.makeReport(stall, symbolicator: $0) }
            self.send(.watchdogStall(report))
        }
    }

    func emit(_ event: StallMonitorEvent) {
        queue.async { self.send(event) }
    }

    /// Emits the `stopped` event and waits for every report, at most ``StallMonitor/stopTimeout``;
    /// `logger` hears when some are still queued then. The event counts this reporter's
    /// suppressed, dropped and lost reports as they stand once the reports queued before it are
    /// out: one still queued when the monitor stopped may yet be lost.
    func finish(_ description: MonitorDescription, _ statistics: StallMonitor.Statistics, logger: Logger) {
        queue.async {
            var statistics = statistics
            statistics.suppressedReports = self.suppressedReports.load()
            statistics.droppedReports = self.droppedReports.load()
            statistics.lostReports = self.lostReports.load()
            self.send(.stopped(description, statistics))
        }
        if !drain(timeout: StallMonitor.stopTimeout) {
            logger.warning(
                "stallmon stopped with reports still queued",
                metadata: ["stallmon.timeout": "\(StallMonitor.stopTimeout)"])
        }
    }

    /// Emits pending suppression summaries, then waits until everything submitted so far is out or
    /// `timeout` passes; returns whether it is all out.
    func drain(timeout: Duration) -> Bool {
        let done = DispatchSemaphore(value: 0)
        queue.async {
            self.flushSuppressions(all: true)
            done.signal()
        }
        return done.wait(timeout: .now() + .nanoseconds(Int(timeout.nanoseconds))) == .success
    }

    private func send(_ event: StallMonitorEvent) {
        for sink in sinks {
            do {
                try sink.emit(event)
            } catch {
                lostReports.add(1)
                metrics?.recordLost()
            }
        }
    }

    private func process(_ stall: CapturedStall) {
        status.record(stall)
        if configuration.notifyStatus {
            status.noteSent()
            ServiceNotifier.notify("STATUS=\(status.line())")
        }
        let report = SharedSymbolicator.shared.withSymbolicator { makeReport(stall, symbolicator: $0) }
        // Every stall ends once (an ended report is never dropped), whether it is reported or suppressed.
        if stall.event == .ended { metrics?.recordStall(callout: report.callout, duration: report.duration) }
        switch stall.event {
        case .detected:
            if limiter.admit(report.fingerprint, frame: report.culprit?.summary ?? "?", now: MonotonicClock.now()) {
                decisions[stall.stallID] = .admitted
                send(.stallDetected(report))
            } else {
                decisions[stall.stallID] = .suppressed(fingerprint: report.fingerprint)
                suppressedReports.add(1)
                metrics?.recordSuppressed()
                scheduleFlush()
            }
        case .watchdog:
            send(.watchdogStall(report))
        case .ended:
            switch decisions.removeValue(forKey: stall.stallID) {
            case .suppressed(let fingerprint):
                limiter.recordSuppressed(fingerprint, duration: stall.duration)
                scheduleFlush()
            case .admitted:
                send(.stallEnded(report))
            case nil:
                // Its detected report was dropped or it was never detected by this reporter.
                if limiter.admit(report.fingerprint, frame: report.culprit?.summary ?? "?", now: MonotonicClock.now()) {
                    send(.stallEnded(report))
                } else {
                    suppressedReports.add(1)
                    metrics?.recordSuppressed()
                    limiter.recordSuppressed(report.fingerprint, duration: stall.duration)
                    scheduleFlush()
                }
            }
        }
    }

    private func scheduleFlush() {
        guard !flushScheduled, let next = limiter.nextExpiry else { return }
        flushScheduled = true
        let delay = next > MonotonicClock.now() ? next - MonotonicClock.now() : 0
        queue.after(nanoseconds: delay + 1_000_000) {
            self.flushScheduled = false
            self.flushSuppressions(all: false)
            self.scheduleFlush()
        }
    }

    private func flushSuppressions(all: Bool) {
        for summary in limiter.takeSummaries(now: MonotonicClock.now(), all: all) {
            send(
                .suppressed(
                    SuppressionReport(
                        loop: loopName, threadID: threadID, fingerprint: summary.fingerprint, frame: summary.frame,
                        count: summary.suppressed, totalDuration: .nanoseconds(summary.totalDuration),
                        worstDuration: .nanoseconds(summary.worstDuration), burst: configuration.rateLimit.burst,
                        interval: configuration.rateLimit.interval
                    )
                )
            )
        }
    }

    private func makeReport(_ stall: CapturedStall, symbolicator: Symbolicator) -> StallReport {
        let (frames, stackSamples, index) = Self.heaviestStack(stall.stacks, symbolicator: symbolicator)
        var report = StallReport(
            event: stall.event,
            stallID: stall.stallID,
            loop: loopName,
            threadID: stall.threadID ?? threadID,
            duration: .nanoseconds(stall.duration),
            threshold: configuration.threshold,
            activity: stall.activity,
            runLoopMode: stall.runLoopMode,
            callout: StallReport.Callout.recognize(frames),
            threadState: String(stall.threadState),
            syscall: stall.kernelView.syscall,
            waitChannel: stall.kernelView.waitChannel,
            cpuTime: .nanoseconds(stall.cpu),
            samples: stall.samples,
            unansweredSamples: stall.unansweredSamples,
            stackSamples: stackSamples,
            stack: frames,
            fingerprint: StallReport.fingerprint(of: frames),
            noStackReason: stall.noStackReason,
            startNanoseconds: stall.startNanoseconds,
            pausedTime: .nanoseconds(stall.paused),
            watchdogInterval: stall.watchdogInterval.map { .nanoseconds($0) },
            stackSource: index.flatMap { stall.stackSources.indices.contains($0) ? stall.stackSources[$0] : nil }
        )
        report.sampledStacks = SampledStack.symbolicate(stall.stacks, symbolicator: symbolicator)
        return report
    }
}

extension Reporter {
    /// The stack seen most often, counting stacks that share their frames from the culprit on
    /// (the fingerprint) as one: a thread busy inside one function of the program is one stack,
    /// whatever library code it happened to be in at each sample.
    static func heaviestStack(
        _ stacks: [(stack: [UInt], count: Int)], symbolicator: Symbolicator
    ) -> (frames: [StallFrame], samples: Int, index: Int?) {
        var groups: [String: (total: Int, best: [StallFrame], bestCount: Int, order: Int, bestIndex: Int)] = [:]
        for (order, entry) in stacks.enumerated() {
            let frames = symbolicator.symbolicate(entry.stack)
            let key = StallReport.fingerprint(of: frames)
            if var group = groups[key] {
                group.total += entry.count
                if entry.count > group.bestCount {
                    (group.best, group.bestCount, group.bestIndex) = (frames, entry.count, order)
                }
                groups[key] = group
            } else {
                groups[key] = (entry.count, frames, entry.count, order, order)
            }
        }
        guard
            let heaviest = groups.values.max(by: {
                $0.total < $1.total || ($0.total == $1.total && $0.order > $1.order)
            })
        else {
            return ([], 0, nil)
        }
        return (heaviest.best, heaviest.total, heaviest.bestIndex)
    }
}

/// The monitor's health, kept for `STATUS=`: stalls that ended in the last hour and the one in
/// progress. Updated on the reporting thread, read from anywhere without waiting for it.
final class StatusBoard: Sendable {
    private struct Stalls {
        var recent: [(end: UInt64, duration: UInt64)] = []
        var inProgress: UInt64?
        /// Until the loop is seen to turn, it is not called healthy.
        var seenTurning: Bool
        /// Whether a status went to the service manager (then the first turn sends a fresh one).
        var sent = false
    }

    private let stalls: Mutex<Stalls>
    private let loopName: String

    init(loopName: String, seenTurning: Bool) {
        self.loopName = loopName
        self.stalls = Mutex(Stalls(seenTurning: seenTurning))
    }

    /// Records the loop's first transition; returns whether a status already went out, which
    /// said the loop was not seen running and is out of date now.
    func noteFirstTurn() -> Bool {
        stalls.withLock { stalls in
            stalls.seenTurning = true
            return stalls.sent
        }
    }

    func noteSent() {
        stalls.withLock { $0.sent = true }
    }

    func record(_ stall: CapturedStall) {
        stalls.withLock { stalls in
            switch stall.event {
            case .detected: stalls.inProgress = stall.startNanoseconds
            case .ended:
                stalls.inProgress = nil
                let end = stall.startNanoseconds + stall.duration
                stalls.recent.append((end, stall.duration))
                stalls.recent.removeAll { end > $0.end && end - $0.end > 3_600_000_000_000 }
                if stalls.recent.count > 1_000 { stalls.recent.removeFirst(stalls.recent.count - 1_000) }
            case .watchdog: break
            }
        }
    }

    /// `main loop healthy; 3 stalls in 1h, worst 540 ms`, `main loop stalled for 1200 ms`
    /// (counting the last 1000 stalls at most), or `main loop not seen running yet` before its
    /// first transition.
    func line() -> String {
        stalls.withLock { stalls in
            let now = MonotonicClock.now()
            stalls.recent.removeAll { now - $0.end > 3_600_000_000_000 }
            let loop = loopName == "main" ? "main loop" : "loop of \(loopName)"
            guard stalls.seenTurning else { return "\(loop) not seen running yet" }
            if let start = stalls.inProgress {
                return "\(loop) stalled for \((now - start) / 1_000_000) ms"
            }
            guard let worst = stalls.recent.map(\.duration).max() else { return "\(loop) healthy; no stalls in 1h" }
            let count = stalls.recent.count
            return "\(loop) healthy; \(count) stall\(count == 1 ? "" : "s") in 1h, worst \(worst / 1_000_000) ms"
        }
    }
}

/// The thread that runs every reporter's work, in the order it was queued, and their timers (the
/// rate limiter's flushes, the symbolicator's trim). One long-lived thread of its own rather than
/// libdispatch workers: reports are built on one thread, so their allocations come from one malloc
/// arena instead of one per worker that a burst happens to wake. With nothing queued and no timer
/// set, it waits without a timeout: no wakeups while idle.
final class ReportingThread: Sendable {
    static let shared = ReportingThread()

    /// The thread's name, in the kernel (at most 15 bytes).
    static let threadName = "stallmon-report"

    private struct ScheduledJob {
        var deadline: UInt64
        var job: @Sendable () -> Void
    }

    private struct State {
        var jobs: [@Sendable () -> Void] = []
        /// Ordered by deadline, the earliest first; equal deadlines in the order they were set.
        var timers: [ScheduledJob] = []
        /// Whether the thread waits (or is about to) for `wake`.
        var waiting = false
    }

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)

    private init() {
        let thread = Thread { [self] in
            stallmon_set_thread_name(Self.threadName)
            run()
        }
        thread.name = Self.threadName
        thread.stackSize = 1024 * 1024
        thread.start()
    }

    /// Runs `job` on the thread after the jobs queued before it.
    func async(_ job: @escaping @Sendable () -> Void) {
        let signal = state.withLock { state in
            state.jobs.append(job)
            return Self.takeWaiter(&state)
        }
        if signal { wake.signal() }
    }

    /// Runs `job` on the thread and returns once it ran, or once the monotonic clock reaches
    /// `deadline` (the job still runs in its turn); returns whether it ran. Never call it from the
    /// thread itself.
    @discardableResult
    func sync(waitingUntil deadline: UInt64, _ job: @escaping @Sendable () -> Void) -> Bool {
        let done = DispatchSemaphore(value: 0)
        async {
            job()
            done.signal()
        }
        let now = MonotonicClock.now()
        let left = deadline > now ? deadline - now : 0
        return done.wait(timeout: .now() + .nanoseconds(Int(clamping: left))) == .success
    }

    /// Runs `job` on the thread once `nanoseconds` have passed.
    func after(nanoseconds: UInt64, _ job: @escaping @Sendable () -> Void) {
        let deadline = MonotonicClock.now() + nanoseconds
        let signal = state.withLock { state in
            let index = state.timers.firstIndex { $0.deadline > deadline } ?? state.timers.endIndex
            state.timers.insert(ScheduledJob(deadline: deadline, job: job), at: index)
            // A new earliest deadline shortens the thread's wait.
            return index == 0 && Self.takeWaiter(&state)
        }
        if signal { wake.signal() }
    }

    /// Whether the caller must signal `wake` (once: it clears `waiting`).
    private static func takeWaiter(_ state: inout State) -> Bool {
        guard state.waiting else { return false }
        state.waiting = false
        return true
    }

    private func run() {
        while true {
            let now = MonotonicClock.now()
            let (jobs, wait) = state.withLock { state -> ([@Sendable () -> Void], UInt64?) in
                var jobs = state.jobs
                state.jobs = []
                let due = state.timers.prefix { $0.deadline <= now }.count
                jobs += state.timers.prefix(due).map(\.job)
                state.timers.removeFirst(due)
                state.waiting = jobs.isEmpty
                return (jobs, state.timers.first?.deadline)
            }
            guard jobs.isEmpty else {
                for job in jobs { job() }
                continue
            }
            if let wait {
                _ = wake.wait(timeout: .now() + .nanoseconds(Int(clamping: wait - min(wait, now))))
            } else {
                wake.wait()
            }
        }
    }
}

/// The process's one symbolicator: libdw is not thread-safe, and its caches are worth sharing
/// between monitors. A second after its last use, the pages of the image files it read (symbol
/// tables, DWARF: several megabytes) leave the resident set until the next report.
final class SharedSymbolicator: Sendable {
    static let shared = SharedSymbolicator()

    private struct State: @unchecked Sendable {
        var symbolicator: Symbolicator?
        var lastUse: UInt64 = 0
        var trimScheduled = false
    }

    private let state = Mutex(State())
    private static let idleBeforeTrim: UInt64 = 1_000_000_000

    func withSymbolicator<Result: Sendable>(_ body: (Symbolicator) -> Result) -> Result {
        state.withLock { state in
            let symbolicator = state.symbolicator ?? Symbolicator()
            state.symbolicator = symbolicator
            defer {
                state.lastUse = MonotonicClock.now()
                scheduleTrim(&state, after: Self.idleBeforeTrim)
            }
            return body(symbolicator)
        }
    }

    /// Called with the lock held.
    private func scheduleTrim(_ state: inout State, after delay: UInt64) {
        guard !state.trimScheduled else { return }
        state.trimScheduled = true
        ReportingThread.shared.after(nanoseconds: delay) {
            self.state.withLock { state in
                state.trimScheduled = false
                let idle = MonotonicClock.now() - state.lastUse
                if idle >= Self.idleBeforeTrim {
                    state.symbolicator?.trim()
                } else {
                    self.scheduleTrim(&state, after: Self.idleBeforeTrim - idle)
                }
            }
        }
    }
}

/// At most `burst` reports per fingerprint in each window of `interval`; the rest are counted.
struct RateLimiter {
    struct Window {
        var start: UInt64
        var admitted: Int
        var suppressed: Int
        var totalDuration: UInt64
        var worstDuration: UInt64
        var frame: String
    }

    struct Summary {
        var fingerprint: String
        var frame: String
        var suppressed: Int
        var totalDuration: UInt64
        var worstDuration: UInt64
    }

    let burst: Int
    let interval: UInt64
    private var windows: [String: Window] = [:]
    private static let maximumFingerprints = 1024

    init(burst: Int, interval: UInt64) {
        self.burst = burst
        self.interval = interval
    }

    mutating func admit(_ fingerprint: String, frame: String, now: UInt64) -> Bool {
        if var window = windows[fingerprint], now < window.start + interval {
            guard window.admitted < burst else { return false }
            window.admitted += 1
            windows[fingerprint] = window
            return true
        }
        if windows.count >= Self.maximumFingerprints {
            // Forget the quiet fingerprints first; their summaries are already out.
            windows = windows.filter { $0.value.suppressed > 0 && now < $0.value.start + interval }
        }
        windows[fingerprint] = Window(
            start: now, admitted: 1, suppressed: 0, totalDuration: 0, worstDuration: 0, frame: frame)
        return true
    }

    mutating func recordSuppressed(_ fingerprint: String, duration: UInt64) {
        guard var window = windows[fingerprint] else { return }
        window.suppressed += 1
        window.totalDuration += duration
        window.worstDuration = max(window.worstDuration, duration)
        windows[fingerprint] = window
    }

    /// When the earliest window with suppressed reports ends.
    var nextExpiry: UInt64? {
        windows.values.filter { $0.suppressed > 0 }.map { $0.start + interval }.min()
    }

    /// Summaries of windows that ended (or of all windows), which then start counting afresh.
    mutating func takeSummaries(now: UInt64, all: Bool) -> [Summary] {
        var summaries = [Summary]()
        for (fingerprint, window) in windows where window.suppressed > 0 && (all || now >= window.start + interval) {
            summaries.append(
                Summary(
                    fingerprint: fingerprint, frame: window.frame, suppressed: window.suppressed,
                    totalDuration: window.totalDuration, worstDuration: window.worstDuration
                )
            )
            var reset = window
            reset.suppressed = 0
            reset.totalDuration = 0
            reset.worstDuration = 0
            windows[fingerprint] = reset
        }
        return summaries.sorted { $0.fingerprint < $1.fingerprint }
    }
}
#endif  // STALLMON_LINUX
