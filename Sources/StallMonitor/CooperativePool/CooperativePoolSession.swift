#if STALLMON_LINUX
import CStallCapture
import CoreMetrics
import Dispatch
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The monitor of Swift's cooperative pool, from start to stop: the runtime's
/// `swift_task_enqueueGlobal_hook` (set here, cleared at stop) around the shared ``WatchdogSession``
/// (one reporter, `STALL_LOOP=cooperative-pool`, each report with the pool thread it held) and the
/// pool's ``CooperativePoolBackend``.
///
/// Pool threads are libdispatch's workers: they block SIGUSR1, SIGUSR2 and the real-time signals,
/// so a running job is sampled with SIGPROF, and only while SIGPROF has no handler of the program's
/// (a profiler's): the sampler checks its disposition before every sample and sends nothing once it
/// is taken. A thread blocked in a system call is never signalled; its stack is unwound in place
/// from the kernel's view.
package final class CooperativePoolSession: @unchecked Sendable {
    private let session: WatchdogSession
    private let logger: Logger

    /// The job priorities whose queues are learned before the hook is set: background, utility,
    /// default, user-initiated and user-interactive. Others are learned when their first job shows.
    static let probedPriorities: [UInt8] = [9, 17, 21, 25, 33]

    /// Whether a monitor of this process watches the pool: the hook and the threads' slots are the
    /// process's, so one monitor at a time does.
    private static let watching = Atomic<Bool>(false)

    /// The session whose hook is set when the async main first suspends.
    private static let pending = Mutex<CooperativePoolSession?>(nil)

    /// What the warning says covers the pool's jobs when another global executor runs them.
    private let coverage: String

    /// Learns the runtime's queues and checks its layout, sets the hook (now, or when an async main
    /// first suspends) and starts the watchdog. `nil` when the runtime's layout is not the one the
    /// hook reads (`stallmon_pool_learn_queue` checks it against the runtime's own answers): then
    /// nothing is installed, and the pool goes unwatched with one warning that names the check.
    /// - Parameters:
    ///   - atFirstSuspension: Sets the hook when the async main first suspends, after its
    ///     synchronous setup, rather than now: a service that makes another executor global in that
    ///     setup (SwiftNIO's takeover), before or after the monitor starts, keeps it, and the pool
    ///     goes unwatched with a warning that says what covers it.
    ///   - coverage: What watches the async jobs when another global executor runs them (for the
    ///     warning), e.g. that the event loops they run on are watched.
    /// - Throws: ``StallMonitorError`` when the hook cannot be set now (someone else's is set, or
    ///   the runtime has none) or no sampler slot is free.
    package init?(
        configuration monitorConfiguration: StallMonitor.Configuration, sinks: [any ReportSink], logger: Logger,
        metricsFactory: any MetricsFactory, atFirstSuspension firstSuspension: Bool = false, coverage: String
    ) throws(StallMonitorError) {
        self.coverage = coverage
        // A start from a main-actor job of an async main that runs already: main() will not
        // suspend for the first time again, so the hook is set now.
        let atFirstSuspension = firstSuspension && stallmon_async_main_has_suspended() == 0
        var configuration = monitorConfiguration
        configuration.threshold = monitorConfiguration.cooperativePoolThreshold
        configuration.sampleInterval = min(monitorConfiguration.sampleInterval, configuration.threshold)
        self.logger = logger
        guard !Self.watching.exchange(true, ordering: .acquiringAndReleasing) else {
            throw StallMonitorError.cooperativePoolHookUnavailable(reason: Self.watchedElsewhere)
        }
        let missing = Self.learnQueues(timeout: .seconds(1))
        guard stallmon_pool_layout_verified() == 1 else {
            Self.watching.store(false, ordering: .releasing)
            logger.warning(
                "stallmon does not watch the cooperative pool: \(Self.layoutReason)",
                metadata: ["stallmon.loop": "\(CooperativePoolBackend.loopName)"])
            return nil
        }
        if !atFirstSuspension {
            let rc = stallmon_pool_install()
            guard rc == 0 else {
                Self.watching.store(false, ordering: .releasing)
                throw StallMonitorError.cooperativePoolHookUnavailable(reason: Self.reason(rc))
            }
        }
        if !missing.isEmpty {
            logger.warning(
                """
                the cooperative pool's queues of some priorities were not learned; their jobs are timed once a job \
                of theirs has run
                """,
                metadata: ["stallmon.priorities": "\(missing.map(String.init).joined(separator: ","))"])
        }
        // The pool's choice never throws: the configured signal does not apply to it.
        let signal = try? SamplingSignal.choose(configuration, for: .cooperativePool, logger: logger)
        do throws(StallMonitorError) {
            // Pool threads come and go; the pool counts as running (jobs ran to learn its queues).
            (session, _) = try WatchdogSession.make(
                loops: [
                    .init(
                        name: CooperativePoolBackend.loopName, threadID: Int(getpid()),
                        callouts: StallReport.Callout.recognizePoolCallout)
                ],
                configuration: configuration, signal: signal, sinks: sinks, metricsFactory: metricsFactory,
                logger: logger
            ) { engine, _, reporters in (CooperativePoolBackend(engine: engine, reporter: reporters[0]), []) }
        } catch {
            if !atFirstSuspension { stallmon_pool_uninstall() }
            Self.watching.store(false, ordering: .releasing)
            throw error
        }
        session.start()
        logger.debug(
            "stallmon watches the cooperative pool",
            metadata: ["stallmon.threshold_ms": "\(configuration.threshold.milliseconds)"])
        if atFirstSuspension {
            Self.pending.withLock { $0 = self }
            stallmon_async_main_on_first_suspension { CooperativePoolSession.installPending() }
        }
    }

    private static func reason(_ rc: Int32) -> String {
        switch rc {
        case -EBUSY: hookTakenElsewhere
        case -EPROTO: layoutReason
        default: "this Swift runtime has no swift_task_enqueueGlobal_hook"
        }
    }

    /// Why the runtime's layout was not taken: the check that failed, or that none could run.
    package static var layoutReason: String {
        guard let problem = stallmon_pool_layout_problem() else {
            return "the Swift runtime's job layout could not be checked (no probe task ran within 1 s)"
        }
        return "the Swift runtime's job layout is not the one its hook reads (\(String(cString: problem)))"
    }

    static let hookTakenElsewhere =
        "another library has set swift_task_enqueueGlobal_hook (a custom global executor, such as SwiftNIO's event loops)"
    static let watchedElsewhere = "another monitor in this process watches it already"

    /// On the main thread, when the async main first suspends: sets the hook of the session that
    /// waits for it, or says why the pool goes unwatched. Under the lock that ``stop()`` takes, so
    /// that a stop on another thread meanwhile clears the hook after it is set, not before.
    private static func installPending() {
        let (session, rc) = pending.withLock { pending -> (CooperativePoolSession?, Int32) in
            guard let session = pending.take() else { return (nil, 0) }
            return (session, stallmon_pool_install())
        }
        guard let session, rc != 0 else { return }
        session.logger.warning(
            "stallmon does not watch the cooperative pool: \(reason(rc)); \(session.coverage)",
            metadata: ["stallmon.loop": "\(CooperativePoolBackend.loopName)"])
    }

    /// Why the pool cannot be watched now, if it cannot: someone else's global-executor hook is set
    /// (SwiftNIO's takeover, made before the monitor started), or another monitor watches it.
    static var unavailableReason: (reason: String, hookTaken: Bool)? {
        if stallmon_pool_hook_taken() == 1 { return (hookTakenElsewhere, true) }
        if watching.load(ordering: .acquiring) { return (watchedElsewhere, false) }
        return nil
    }

    /// Clears the hook, stops the watchdog (a stall in progress gets its ended report) and waits
    /// until every report is out.
    package func stop() {
        Self.pending.withLock { pending in
            if pending === self { pending = nil }
            stallmon_pool_uninstall()
        }
        session.stop()
        Self.watching.store(false, ordering: .releasing)
    }

    /// Whether the calling thread runs a job the pool's hook timed (one enqueued after the hook was
    /// set); not a job that started before, nor one that runs elsewhere than on the pool.
    package static var callerRunsATimedJob: Bool { stallmon_pool_job_of_thread(stallmon_gettid()) != 0 }

    var statistics: StallMonitor.Statistics { session.statistics }

    var watchdogThreadID: Int32 { session.watchdog.threadID }
    var watchdogWakeups: Int { session.watchdog.wakeups }

    /// Runs one probe task per priority on the pool, each of which checks the runtime's layout on
    /// itself and learns its queue from inside (``stallmon_pool_learn_queue``), and waits for them at
    /// most `timeout` (the caller may be a pool thread itself). Returns the priorities not learned.
    private static func learnQueues(timeout: Duration) -> [UInt8] {
        let wanted = probedPriorities.filter { stallmon_pool_knows_priority(UInt32($0)) == 0 }
        let done = DispatchSemaphore(value: 0)
        for priority in wanted {
            Task.detached(priority: TaskPriority(rawValue: priority)) {
                _ = stallmon_pool_learn_queue(UInt32(priority))
                done.signal()
            }
        }
        let deadline = DispatchTime.now() + .nanoseconds(Int(timeout.nanoseconds))
        for _ in wanted where done.wait(timeout: deadline) == .timedOut { break }
        return wanted.filter { stallmon_pool_knows_priority(UInt32($0)) == 0 }
    }
}
#endif  // STALLMON_LINUX
