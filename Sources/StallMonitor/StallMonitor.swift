import CStallCapture
import CoreFoundation
import CoreMetrics
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// Watches a thread's run loop and reports every stall: a callout that keeps the loop inside one
/// before-sources or after-waiting window for longer than the threshold.
///
/// ```swift
/// let monitor = try StallMonitor()
/// try monitor.start()
/// RunLoop.main.run()
/// ```
///
/// An async `@main` has no run loop on Linux; it starts the monitor with ``Target/asyncMain``
/// before its first `await`:
///
/// ```swift
/// let monitor = try StallMonitor()
/// try monitor.start(.asyncMain)
/// try await app.run()
/// ```
///
/// Reports go to the systemd journal when it runs, to standard error otherwise, and to any
/// ``ReportSink`` you pass.
public final class StallMonitor: Sendable {
    public let configuration: Configuration
    package let logger: Logger
    package let sinks: [any ReportSink]
    package let metricsFactory: (any MetricsFactory)?
    private let state = StateBox()

    /// Which thread's run loop to monitor.
    ///
    /// Later versions may add targets: a `switch` over it keeps a `default`.
    public enum Target: Sendable {
        /// The main thread's run loop (`RunLoop.main`), which also drains `DispatchQueue.main` and
        /// `@MainActor` work while it runs. An async `@main` never runs it on Linux: use
        /// ``asyncMain`` there (a monitor whose loop never turns logs a warning).
        case mainThread
        /// The calling thread's run loop; call ``start(_:)`` on the thread that will run it.
        case currentThread
        /// The main actor and main queue of an async `@main`. On Linux the runtime parks the main
        /// thread of an async main in `dispatch_main()` and lets worker threads drain the main
        /// queue; nothing can be watched there. With this target the main thread drains the main
        /// queue itself once `main()` first suspends: `@MainActor` jobs and `DispatchQueue.main`
        /// blocks then run on the main thread, and the monitor sees each drain. It is the light
        /// drain: the main thread waits on libdispatch's main-queue port and drains the queue, with
        /// no run loop around it, so timers and sources on `RunLoop.main` do not fire, as under
        /// `dispatch_main()`. Use ``asyncMainRunLoop`` where they should.
        ///
        /// The corresponding runtime hook is `swift_task_asyncMainDrainQueue_hook`.
        /// - Important: Call ``start(_:)`` in `main()` before its first suspension (its first
        ///   `await` that waits): the runtime reads the hook then. Elsewhere than on the main thread
        ///   it throws. The change outlives ``stop()``: the main thread drains the main queue until
        ///   the process exits. The first start in a process chooses the drain; a later start for
        ///   the other async-main target throws.
        case asyncMain
        /// As ``asyncMain``, but the main thread runs the main run loop (`CFRunLoopRun()`), as on
        /// Darwin: timers and sources on `RunLoop.main` fire too, and a main-actor hop costs more
        /// (the run loop's pass around each main-queue callout).
        case asyncMainRunLoop
    }

    /// Counts since the monitor was created.
    public struct Statistics: Sendable, Hashable {
        /// Stalls detected (reported or not).
        public var stalls: Int
        /// Stall reports held back by the rate limit.
        public var suppressedReports: Int
        /// Reports dropped because a queue was full: the report queue (no sink had them), or a
        /// sink's own queue (every sink but the journal's has one; counted once per sink).
        public var droppedReports: Int
        /// Deliveries that failed: a sink threw (journald down and no fallback, standard error
        /// closed). Counted per sink; the default journal sink falls back to standard error and
        /// loses a report only when both fail.
        public var lostReports: Int = 0
    }

    /// Creates a monitor; nothing runs until ``start(_:)``.
    /// - Parameters:
    ///   - configuration: Thresholds and limits; validated here. `nil` reads them from the
    ///     environment (``Configuration/fromEnvironment(_:)``: the file in `$STALLMON_CONFIG`,
    ///     then `STALLMON_<KEY>` variables, as the systemd drop-in sets them) over the defaults.
    ///   - logger: Receives the monitor's own diagnostics, not the stall reports (add a ``LoggerSink``
    ///     for those): its start and stop at `debug`; at `warning`, once each, what keeps it from
    ///     seeing the loop or its stacks (a loop that does not turn, no free sampling signal, a
    ///     thread that blocks it), which an operator must fix. The default is `Logger.current`: the
    ///     logger bound with swift-log's `withLogger`, else the process's default one (standard
    ///     error unless the program bootstrapped `LoggingSystem`). The monitor makes no logger of
    ///     its own.
    ///   - sinks: Where reports go. `nil` means ``defaultSinks(_:logger:)``: what the `sink` key
    ///     says; by default the journal while journald takes entries, standard error (JSON lines,
    ///     or text on a terminal) while it does not.
    ///   - metricsFactory: Where the stall and loop-latency metrics go. `nil` means the backend the
    ///     application bootstrapped (`MetricsSystem.factory`, read at each ``start(_:)``); the monitor
    ///     never bootstraps one.
    /// - Throws: ``ConfigurationError`` for an invalid configuration.
    public init(
        configuration: Configuration? = nil, logger: Logger = .current,
        sinks: [any ReportSink]? = nil, metricsFactory: (any MetricsFactory)? = nil
    ) throws(ConfigurationError) {
        let resolved: Configuration
        if let configuration {
            resolved = configuration
        } else {
            resolved = try Configuration.fromEnvironment()
        }
        try resolved.validate()
        self.configuration = resolved
        self.logger = logger
        self.sinks = sinks ?? Self.defaultSinks(resolved, logger: logger)
        self.metricsFactory = metricsFactory
    }

    /// The longest ``stop()`` waits for queued reports to reach the sinks.
    public static let stopTimeout: Duration = .seconds(2)

    /// Whether the monitor works on this platform: on Linux. Elsewhere (a developer's Mac) the API
    /// is all there and does nothing: ``start(_:)`` logs one `.debug` line and returns, the monitor
    /// never runs, ``stop()`` has nothing to stop, ``statistics`` stay zero, ``allowingStall(_:)``
    /// just runs its body and ``status`` says that monitoring is unsupported.
    public static var isSupported: Bool {
        #if STALLMON_LINUX
        true
        #else
        false
        #endif
    }

    /// Starts monitoring a run loop or the main actor, and Swift's cooperative pool too: for the
    /// async-main targets unless ``Configuration/cooperativePool`` is `false`, for the others when it
    /// is `true`. Where ``isSupported`` is false it logs one `.debug` line and returns: nothing runs.
    ///
    /// For an async target the pool's hook is set when `main()` first suspends, after its
    /// synchronous setup: a service that makes SwiftNIO's event loops the global executor there
    /// keeps them, and the monitor warns that the pool goes unwatched (its jobs run on the event
    /// loops, which `startService()` of StallMonitorNIO watches).
    /// - Important: With ``Target/currentThread``, call this on the thread that runs the loop.
    /// - Throws: ``StallMonitorError`` when the monitor already runs, its signal is taken, the pool's
    ///   hook cannot be set while `cooperative_pool` is `true`, or ``Target/mainThread`` is started
    ///   in an async `main()`, whose main thread never runs the main run loop on Linux
    ///   (`.runLoopTargetInAsyncMain`).
    public func start(_ target: Target = .mainThread) throws(StallMonitorError) {
        try start(target, eventLoopsWatched: false)
    }

    /// ``start(_:)``, told whether the monitor also watches the event loops that SwiftNIO's takeover
    /// of the global executor would run async jobs on (for what the pool's warning says).
    package func start(_ target: Target, eventLoopsWatched: Bool) throws(StallMonitorError) {
        #if STALLMON_LINUX
        if target == .mainThread, Self.isAsyncMainBeforeItsDrain { throw StallMonitorError.runLoopTargetInAsyncMain() }
        try state.withLock { (session: inout Session?) throws(StallMonitorError) in
            guard session == nil else { throw StallMonitorError.alreadyRunning() }
            let runLoop = try RunLoopSession(target: target, monitor: self)
            do throws(StallMonitorError) {
                let pool = try startPool(for: target, eventLoopsWatched: eventLoopsWatched)
                session = Session(runLoop: runLoop, pool: pool)
            } catch {
                runLoop.stop()
                throw error
            }
        }
        #else
        logger.debug("stall monitoring is unsupported on this platform (Linux only): the monitor does nothing")
        #endif
    }

    #if STALLMON_LINUX
    /// The cooperative pool's session for `target`, or `nil` where the pool goes unwatched.
    private func startPool(for target: Target, eventLoopsWatched: Bool) throws(StallMonitorError)
        -> CooperativePoolSession?
    {
        let asyncTarget = target == .asyncMain || target == .asyncMainRunLoop
        guard configuration.cooperativePool ?? asyncTarget else { return nil }
        let coverage =
            eventLoopsWatched
            ? "with SwiftNIO's event loops as the global executor, async jobs run inside the ticks of "
                + "MultiThreadedEventLoopGroup.singleton, whose stalls stallmon reports"
            : "stalls of async jobs on that executor go unreported; with SwiftNIO's event loops as the global "
                + "executor, startService() of StallMonitorNIO watches the loops they run on"
        if let (reason, hookTaken) = CooperativePoolSession.unavailableReason {
            // Asked for, it is an error at once; automatic, it is said so, and the rest still starts.
            guard configuration.cooperativePool == nil else {
                throw StallMonitorError.cooperativePoolHookUnavailable(reason: reason)
            }
            logger.warning(
                "stallmon does not watch the cooperative pool: \(reason)\(hookTaken ? "; \(coverage)" : "")",
                metadata: ["stallmon.loop": "\(MonitorDescription.cooperativePoolLoop)"])
            return nil
        }
        return try CooperativePoolSession(
            configuration: configuration, sinks: sinks, logger: logger,
            metricsFactory: metricsFactory ?? MetricsSystem.factory, atFirstSuspension: asyncTarget,
            coverage: coverage)
    }

    /// Whether the caller runs on the main thread inside a task while the main run loop does not
    /// run: an async `main()` (or top-level code with `await`) before its first suspension, or a
    /// main-actor job of the light drain. A run-loop service that starts the monitor from a
    /// main-actor task does so inside a run-loop callout.
    private static var isAsyncMainBeforeItsDrain: Bool {
        guard stallmon_gettid() == getpid(), withUnsafeCurrentTask(body: { $0 != nil }) else { return false }
        return CFRunLoopCopyCurrentMode(CFRunLoopGetMain()) == nil
    }
    #endif

    /// Stops monitoring: removes the observers, ends a stall in progress with its report, and
    /// waits until every report is out, for at most ``stopTimeout`` (2 s). Starting again
    /// afterwards is allowed.
    ///
    /// The wait is short unless a sink is slow: a journald that takes no entries costs the journal
    /// sink at most its send timeout (100 ms) once, then entries go to standard error. Other sinks
    /// have queues of their own: the journal has the `stopped` entry whatever they do, and a sink
    /// still behind after ``stopTimeout`` gets its events later if the process lives on (a warning
    /// names it).
    public func stop() {
        let session = state.withLock { (session: inout Session?) in
            defer { session = nil }
            return session
        }
        guard let session else { return }
        session.stop()
        state.recordFinished(session.statistics)
    }

    public var isRunning: Bool { state.withLock { $0 != nil } }

    /// Runs `body`, which may block the monitored loop, without reporting a stall for it. The
    /// time inside never counts; the window starts afresh when `body` returns.
    /// - Important: Call it on the monitored thread; elsewhere it just runs `body`.
    public func allowingStall<Result>(_ body: () throws -> Result) rethrows -> Result {
        #if STALLMON_LINUX
        // A reference of its own: stop() on another thread may end the session while body blocks.
        guard let loop = state.withLock({ session in session?.loopIfCurrentThread.map { $0.retained() } }) else {
            return try body()
        }
        stallmon_loop_allow_begin(loop.pointer)
        defer {
            stallmon_loop_allow_end(loop.pointer)
            stallmon_loop_release(UnsafeRawPointer(loop.pointer))
        }
        return try body()
        #else
        return try body()
        #endif
    }

    /// A one-line health summary, e.g. `main loop healthy; 3 stalls in 1h, worst 540 ms`, with a
    /// part per event loop that ``startService()`` watches.
    public var status: String {
        #if STALLMON_LINUX
        state.withLock { session in
            session.map { session in
                ([session.reporter.status.line()] + (session.eventLoops.map { [$0.status] } ?? [])).joined(
                    separator: "; ")
            }
        } ?? "stall monitor not running"
        #else
        "stall monitor not running: unsupported on this platform"
        #endif
    }

    /// Tells the service manager that the service is ready (`READY=1`), with the monitor's
    /// ``status`` as `STATUS=`. Without `$NOTIFY_SOCKET` it does nothing and returns false.
    /// The corresponding C function is `sd_notify`.
    @discardableResult
    public func notifyReady() -> Bool {
        notifyStatus(prefix: "READY=1\n")
    }

    /// Sends `KEY=value` assignments (newline-separated) to the service manager, e.g. `RELOADING=1`.
    /// Without `$NOTIFY_SOCKET` it does nothing and returns false. The corresponding C function is `sd_notify`.
    @discardableResult
    package static func notifyServiceManager(_ state: String) -> Bool {
        ServiceNotifier.notify(state)
    }

    /// Sends the monitor's ``status`` as `STATUS=`, shown by `systemctl status`.
    @discardableResult
    public func notifyStatus() -> Bool {
        notifyStatus(prefix: "")
    }

    private func notifyStatus(prefix: String) -> Bool {
        #if STALLMON_LINUX
        let board = state.withLock { $0?.reporter.status }
        guard let board else { return ServiceNotifier.notify("\(prefix)STATUS=stall monitor not running") }
        board.noteSent()
        return ServiceNotifier.notify("\(prefix)STATUS=\(board.line())")
        #else
        false
        #endif
    }

    public var statistics: Statistics {
        state.statistics
    }

    /// How long the loop's windows have lasted since ``start(_:)``; `nil` when the monitor does not
    /// run or ``Configuration/loopLatency`` is off. Reads the loop's histogram without a lock.
    public var loopLatency: LoopLatency? {
        #if STALLMON_LINUX
        state.withLock { $0?.latency?.snapshot() }
        #else
        nil
        #endif
    }

    /// Kernel id of the watchdog thread, for measurements (0 when not running).
    package var watchdogThreadID: Int32 {
        #if STALLMON_LINUX
        state.withLock { $0?.watchdog.threadID ?? 0 }
        #else
        0
        #endif
    }

    /// Has the running monitor own `eventLoops`: they stop with it, and count in its statistics and
    /// status. Returns false (and leaves them alone) when the monitor does not run.
    package func attach(_ eventLoops: EventLoopGroupSession) -> Bool {
        #if STALLMON_LINUX
        state.withLock { session in
            guard let session, session.eventLoops == nil else { return false }
            session.eventLoops = eventLoops
            return true
        }
        #else
        false
        #endif
    }

    /// Kernel id of the cooperative pool's watchdog thread, for measurements (0 when it does not run).
    package var poolWatchdogThreadID: Int32 {
        #if STALLMON_LINUX
        state.withLock { $0?.pool?.watchdogThreadID ?? 0 }
        #else
        0
        #endif
    }

    // MARK: - Session

    #if STALLMON_LINUX
    /// One start…stop span of a monitor: a watch per kind of loop it has, each a ``WatchdogSession``
    /// with its own watchdog thread, made by the one set-up path
    /// (``WatchdogSession/make(loops:configuration:signal:sinks:metricsFactory:logger:interruptBlockedThreads:engineLogger:backend:)``)
    /// and stopped together: the run loop or main queue it was started for, the cooperative pool
    /// when it is watched, and the event loops `startService()` hands it.
    fileprivate final class Session: @unchecked Sendable {
        let runLoop: RunLoopSession
        let pool: CooperativePoolSession?
        /// Set once, under the monitor's lock.
        var eventLoops: EventLoopGroupSession?

        init(runLoop: RunLoopSession, pool: CooperativePoolSession?) {
            self.runLoop = runLoop
            self.pool = pool
        }

        var reporter: Reporter { runLoop.reporter }
        var watchdog: Watchdog { runLoop.watchdog }
        var latency: LoopLatencyExporter? { runLoop.latency }
        var loopIfCurrentThread: LoopPointer? { runLoop.loopIfCurrentThread }

        /// Every watch's together.
        var statistics: Statistics {
            runLoop.statistics + (pool?.statistics ?? .zero) + (eventLoops?.statistics ?? .zero)
        }

        func stop() {
            eventLoops?.stop()
            pool?.stop()
            runLoop.stop()
        }
    }
    #else

    /// Monitoring is unsupported here: no session is ever made.
    fileprivate final class Session: Sendable {
        private init() {}
        var statistics: Statistics { Statistics(stalls: 0, suppressedReports: 0, droppedReports: 0) }
        func stop() {}
    }
    #endif

    fileprivate final class StateBox: Sendable {
        private struct State {
            var session: Session?
            /// Totals of the sessions that have stopped.
            var finished = Statistics(stalls: 0, suppressedReports: 0, droppedReports: 0, lostReports: 0)
        }

        private let state = Mutex(State())

        func withLock<Result, Failure: Error>(
            _ body: (inout Session?) throws(Failure) -> sending Result
        ) throws(Failure) -> sending Result {
            try state.withLock { (state: inout State) throws(Failure) -> sending Result in try body(&state.session) }
        }

        func recordFinished(_ statistics: Statistics) {
            state.withLock { $0.finished = $0.finished + statistics }
        }

        /// The totals of the stopped sessions and of the running one.
        var statistics: Statistics {
            state.withLock { state in state.session.map { state.finished + $0.statistics } ?? state.finished }
        }
    }
}

extension StallMonitor.Statistics {
    static func + (lhs: Self, rhs: Self) -> Self {
        Self(
            stalls: lhs.stalls + rhs.stalls, suppressedReports: lhs.suppressedReports + rhs.suppressedReports,
            droppedReports: lhs.droppedReports + rhs.droppedReports, lostReports: lhs.lostReports + rhs.lostReports
        )
    }
}
