#if STALLMON_LINUX
import CStallCapture
import CoreFoundation
import CoreMetrics
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

extension StallMonitor {
    /// The loop state (`loop.c`) of a running session, as ``allowingStall(_:)`` holds it.
    struct LoopPointer: @unchecked Sendable {
        let pointer: OpaquePointer

        /// The same pointer, with a reference of its own, released with `stallmon_loop_release`.
        func retained() -> LoopPointer {
            _ = stallmon_loop_retain(UnsafeRawPointer(pointer))
            return self
        }
    }

    /// The watch of a run loop or an async main's main queue in one start…stop span of a monitor:
    /// the loop state its observers (or the main queue's drain) publish into, and the shared
    /// ``WatchdogSession`` around the ``RunLoopBackend``.
    final class RunLoopSession: @unchecked Sendable {
        let session: WatchdogSession
        let backend: RunLoopBackend
        let observers: [CFRunLoopObserver]
        let target: RunLoopBackend.Target
        let loop: LoopPointer
        let logger: Logger
        /// The light drain of ``Target/asyncMain`` feeds the loop state, not run-loop observers.
        let lightDrain: Bool
        var watchdog: Watchdog { session.watchdog }
        var reporter: Reporter { session.reporters[0] }
        /// The loop's latency histogram, when `loop_latency` is on.
        var latency: LoopLatencyExporter? { backend.latency }

        init(target kind: Target, monitor: StallMonitor) throws(StallMonitorError) {
            let configuration = monitor.configuration
            logger = monitor.logger
            target = try Self.resolve(kind)
            let signal = try SamplingSignal.choose(configuration, for: .loop(target.threadID), logger: logger)
            lightDrain = kind == .asyncMain
            let target = target
            let loopName = target.loopName
            let metricsFactory = monitor.metricsFactory ?? MetricsSystem.factory
            let logger = logger
            var loop: LoopPointer?
            (session, backend) = try WatchdogSession.make(
                loops: [
                    .init(
                        name: loopName, threadID: Int(target.threadID),
                        callouts: StallReport.Callout.recognizeRunLoopCallout, seenTurning: false)
                ],
                configuration: configuration, signal: signal, sinks: monitor.sinks, metricsFactory: metricsFactory,
                logger: logger, interruptBlockedThreads: configuration.interruptBlockedThreads, engineLogger: logger
            ) { (engine, slot, reporters) throws(StallMonitorError) in
                try Self.installMainQueueDrain(for: kind)
                let semaphore = DispatchSemaphore(value: 0)
                let state = try Self.makeLoopState(waking: semaphore)
                loop = state
                let latency = Self.enableLatency(of: state, named: loopName, configuration, factory: metricsFactory)
                let backend = RunLoopBackend(
                    engine: engine, target: target, loop: state.pointer, semaphore: semaphore, slot: slot,
                    reporter: reporters[0],
                    notice: Self.noticeHandler(
                        reporter: reporters[0], target: kind, loopName: loopName, logger: logger),
                    latency: latency)
                return (backend, latency.map { [$0] } ?? [])
            }
            self.loop = loop!
            let reporter = session.reporters[0]
            observers = Self.attach(backend, to: target, lightDrain: lightDrain, configuration: configuration)
            Self.lookUpIdleWait(of: backend.source, with: reporter, logger: logger)
            session.start()
            logger.debug(
                "stallmon started",
                metadata: [
                    "stallmon.loop": "\(loopName)", "stallmon.tid": "\(target.threadID)",
                    "stallmon.configuration": "\(configuration.summary)",
                ]
            )
        }

        // MARK: - Setting up

        /// The thread and run loop that `kind` watches.
        private static func resolve(_ kind: Target) throws(StallMonitorError) -> RunLoopBackend.Target {
            switch kind {
            case .mainThread:
                return RunLoopBackend.Target(threadID: getpid(), loopName: "main", runLoop: CFRunLoopGetMain())
            case .asyncMain, .asyncMainRunLoop:
                guard stallmon_gettid() == getpid() else { throw StallMonitorError.asyncMainOffMainThread() }
                return RunLoopBackend.Target(threadID: getpid(), loopName: "main", runLoop: CFRunLoopGetMain())
            case .currentThread:
                let threadID = stallmon_gettid()
                let loopName =
                    threadID == getpid() ? "main" : (ThreadInspector(threadID: threadID).name() ?? "tid-\(threadID)")
                return RunLoopBackend.Target(threadID: threadID, loopName: loopName, runLoop: CFRunLoopGetCurrent())
            }
        }

        /// For the async-main targets: has the main thread drain the main queue once `main()` first
        /// suspends, by the light drain or by the main run loop.
        private static func installMainQueueDrain(for kind: Target) throws(StallMonitorError) {
            guard kind == .asyncMain || kind == .asyncMainRunLoop else { return }
            let rc =
                kind == .asyncMain
                ? stallmon_async_main_run_loop_install(stallmon_async_main_light_drain)
                : stallmon_async_main_run_loop_install { CFRunLoopRun() }
            guard rc != 0 else { return }
            let reason =
                switch -rc {
                case EBUSY: "another library has set swift_task_asyncMainDrainQueue_hook"
                case EALREADY:
                    "an earlier start chose the other drain of the main queue (.asyncMain is the light "
                        + "drain, .asyncMainRunLoop the run loop); a process has one"
                default: "this Swift runtime has no swift_task_asyncMainDrainQueue_hook"
                }
            throw StallMonitorError.asyncMainHookUnavailable(reason: reason)
        }

        /// The loop state the observers or the drain publish into; a new transition signals
        /// `semaphore`, which a parked watchdog waits on.
        private static func makeLoopState(waking semaphore: DispatchSemaphore) throws(StallMonitorError) -> LoopPointer
        {
            let wakeContext = Unmanaged.passRetained(semaphore).toOpaque()
            guard
                let pointer = stallmon_loop_create(
                    { context in Unmanaged<DispatchSemaphore>.fromOpaque(context!).takeUnretainedValue().signal() },
                    wakeContext,
                    { context in Unmanaged<DispatchSemaphore>.fromOpaque(context!).release() }
                )
            else {
                Unmanaged<DispatchSemaphore>.fromOpaque(wakeContext).release()
                throw StallMonitorError.outOfMemory()
            }
            return LoopPointer(pointer: pointer)
        }

        /// The loop's latency histogram, when the configuration wants it. Before the observers or the
        /// drain can publish: the loop's thread reads it unsynchronized.
        private static func enableLatency(
            of loop: LoopPointer, named loopName: String, _ configuration: Configuration,
            factory: any MetricsFactory
        ) -> LoopLatencyExporter? {
            guard configuration.loopLatency, stallmon_loop_enable_latency(loop.pointer) == 0,
                let histogram = stallmon_loop_latency(loop.pointer)
            else { return nil }
            return LoopLatencyExporter(loop: loopName, histogram: histogram, factory: factory)
        }

        /// What the watchdog's notices about the loop do: the first turn updates the status the
        /// service manager shows, and each notice goes to the monitor's logger.
        private static func noticeHandler(reporter: Reporter, target kind: Target, loopName: String, logger: Logger)
            -> @Sendable (RunLoopBackend.LoopNotice) -> Void
        {
            { notice in
                if case .notTurning = notice {
                } else if reporter.status.noteFirstTurn() {
                    // A status that went out before the first turn said the loop was not seen running.
                    ServiceNotifier.notify("STATUS=\(reporter.status.line())")
                }
                Self.log(notice, target: kind, loopName: loopName, logger: logger)
            }
        }

        /// Feeds the loop state: the light drain publishes its windows itself (no run loop turns to
        /// observe); a run loop gets the observers. Returns the observers.
        private static func attach(
            _ backend: RunLoopBackend, to target: RunLoopBackend.Target, lightDrain: Bool, configuration: Configuration
        ) -> [CFRunLoopObserver] {
            if lightDrain {
                stallmon_async_main_drain_attach(backend.loop)
                return []
            }
            probeCalloutSites(of: target.runLoop, threadID: target.threadID)
            let observers = addObservers(
                to: target.runLoop, loop: backend.loop, additionalModes: configuration.additionalModes)
            backend.setObserver(observers[0])
            return observers
        }

        /// Where the run loop waits for events: samples inside it show the loop idle.
        private static func lookUpIdleWait(of source: RunLoopSource, with reporter: Reporter, logger: Logger) {
            reporter.lookUp(function: "__CFRunLoopServiceFileDescriptors", besides: "CFRunLoopRunSpecific") {
                range in
                source.setIdleWaitRange(range)
                if range == nil { Self.warnOfMissingSymbols(logger) }
            }
        }

        /// Tells the monitor's logger that the loop does not turn (once), and when it turns after all.
        private static func log(_ notice: RunLoopBackend.LoopNotice, target: Target, loopName: String, logger: Logger) {
            switch notice {
            case .notTurning(let waited):
                let remedy: String
                switch target {
                case .mainThread:
                    // dispatch_main() leaves the main thread waiting in sigsuspend for the rest of the process.
                    let parked = ThreadInspector(threadID: getpid()).view().syscall == "rt_sigsuspend"
                    remedy =
                        parked
                        ? "the main thread waits in dispatch_main(), as an async @main's does on Linux, and runs no "
                            + "run loop: call start(.asyncMain) in main() before its first await (a dispatchMain() "
                            + "service runs RunLoop.main.run() instead)"
                        : "an async @main never runs the main run loop on Linux: call start(.asyncMain) in main() "
                            + "before its first await; a synchronous main must run RunLoop.main.run() (or CFRunLoopRun())"
                case .currentThread:
                    remedy =
                        "run the thread's run loop (RunLoop.current.run()) on the thread that called start(.currentThread)"
                case .asyncMain, .asyncMainRunLoop:
                    // Once main() suspends, the drain turns at once: the main queue is never empty
                    // then (the runtime enqueues main()'s continuation or wakes the drain).
                    remedy =
                        "main() has not suspended yet (the main thread drains the main queue from its first await "
                        + "on); a synchronous main must run RunLoop.main.run() instead"
                }
                let message =
                    "stallmon cannot see the \(loopName) loop: it has not turned once in \(waited / 1_000_000) ms "
                    + "since the monitor started, so its stalls go unreported and the service watchdog gets no "
                    + "WATCHDOG=1; \(remedy)"
                logger.warning(
                    "\(message)",
                    metadata: ["stallmon.loop": "\(loopName)", "stallmon.waited_ms": "\(waited / 1_000_000)"]
                )
            case .turned:
                break
            case .turnedLate(let waited):
                logger.info(
                    "stallmon sees the \(loopName) loop turn, \(waited / 1_000_000) ms after the monitor started",
                    metadata: ["stallmon.loop": "\(loopName)", "stallmon.waited_ms": "\(waited / 1_000_000)"]
                )
            }
        }

        // MARK: - Running

        var statistics: Statistics { session.statistics }

        /// Drops the session's reference to the loop state. CFRunLoopObserverInvalidate does not wait
        /// for a callout that is already running on the monitored thread, so unless this is that
        /// thread, the last release runs there, between callouts.
        private func releaseLoopState() {
            let loop = self.loop
            if stallmon_gettid() == target.threadID {
                stallmon_loop_release(UnsafeRawPointer(loop.pointer))
                return
            }
            if lightDrain {
                // The drain reads the loop afresh at each transition and keeps it through no
                // callout: a main-queue block runs between two of them.
                DispatchQueue.main.async { stallmon_loop_release(UnsafeRawPointer(loop.pointer)) }
                return
            }
            CFRunLoopPerformBlock(target.runLoop, kCFRunLoopCommonModes) {
                stallmon_loop_release(UnsafeRawPointer(loop.pointer))
            }
            CFRunLoopWakeUp(target.runLoop)
        }

        var loopIfCurrentThread: LoopPointer? {
            stallmon_gettid() == target.threadID ? loop : nil
        }

        func stop() {
            if lightDrain { stallmon_async_main_drain_attach(nil) }
            for observer in observers {
                CFRunLoopObserverInvalidate(observer)
            }
            session.stop()
            releaseLoopState()
            logger.debug("stallmon stopped", metadata: ["stallmon.stalls": "\(statistics.stalls)"])
        }

        // MARK: - The run loop

        /// Two observers with disjoint activities: window starts (entry, before-timers, after-waiting)
        /// at the lowest order, so that a slow observer of someone else's on any activity counts as
        /// part of a window, and window ends (before-waiting, exit) at the highest. Each observed
        /// activity costs a whole CF observer dispatch: before-timers opens the pass's window in
        /// place of before-sources (only observers run between the two), and the entry, which
        /// `RunLoop.run()` goes through on every pass, also counts the nesting of runs.
        private static func addObservers(to runLoop: CFRunLoop, loop: OpaquePointer, additionalModes: [String])
            -> [CFRunLoopObserver]
        {
            typealias Callout = @convention(c) (UnsafeMutableRawPointer?, UInt, UnsafeMutableRawPointer?) -> Void
            let start: Callout = stallmon_observer_window_start
            let end: Callout = stallmon_observer_window_end
            let specs: [(CFOptionFlags, CFIndex, Callout)] = [
                (
                    CFRunLoopActivity.entry.rawValue | CFRunLoopActivity.beforeTimers.rawValue
                        | CFRunLoopActivity.afterWaiting.rawValue, CFIndex.min, start
                ),
                (CFRunLoopActivity.beforeWaiting.rawValue | CFRunLoopActivity.exit.rawValue, CFIndex.max, end),
            ]
            return specs.map { activities, order, callout in
                var context = CFRunLoopObserverContext(
                    version: 0, info: UnsafeMutableRawPointer(loop),
                    retain: { stallmon_loop_retain($0) }, release: { stallmon_loop_release($0) }, copyDescription: nil
                )
                let observer = CFRunLoopObserverCreate(
                    kCFAllocatorDefault, activities, true, order,
                    unsafeBitCast(callout, to: CFRunLoopObserverCallBack.self),
                    &context
                )!
                CFRunLoopAddObserver(runLoop, observer, kCFRunLoopCommonModes)
                for mode in additionalModes {
                    CFRunLoopAddObserver(runLoop, observer, RunLoopModes.cfString(mode))
                }
                return observer
            }
        }

        /// Learns where CoreFoundation calls out (``CalloutSites``) on the monitored thread: at
        /// once when this is that thread, otherwise in the loop's next pass.
        private static func probeCalloutSites(of runLoop: CFRunLoop, threadID: pid_t) {
            if stallmon_gettid() == threadID {
                CalloutSites.probe()
            } else {
                CFRunLoopPerformBlock(runLoop, kCFRunLoopCommonModes) { CalloutSites.probe() }
                CFRunLoopWakeUp(runLoop)
            }
        }

        private static let warnedOfMissingSymbols = Atomic<Bool>(false)

        /// Once per process: the loop's wait function was not found among CoreFoundation's symbols.
        private static func warnOfMissingSymbols(_ logger: Logger) {
            guard !warnedOfMissingSymbols.exchange(true, ordering: .relaxed) else { return }
            let missing = CalloutSites.missing.map(\.rawValue).joined(separator: ",")
            logger.warning(
                """
                CoreFoundation's local symbols are missing (a stripped libFoundation?): idle nested runs are told \
                by the thread's wait call and the loop's mode, callout kinds by the call sites of a probe run
                """,
                metadata: [
                    "stallmon.missing_symbol": "__CFRunLoopServiceFileDescriptors",
                    "stallmon.unrecognized_callouts": "\(missing.isEmpty ? "none" : missing)",
                ]
            )
        }
    }
}
#endif  // STALLMON_LINUX
