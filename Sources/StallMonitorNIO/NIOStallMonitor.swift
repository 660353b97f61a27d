import CStallCapture
import CoreMetrics
import Dispatch
import Logging
import NIOCore
import NIOPosix
// A server imports this module alone: `StallMonitor`, `startService()` and the sinks come with it.
@_exported import StallMonitor
import Synchronization

/// Watches every event loop of a SwiftNIO `MultiThreadedEventLoopGroup` and reports each stall: a
/// loop cycle (its I/O handlers and tasks, from `epoll_wait` to the end of its tick) that lasts
/// longer than the threshold. One watchdog thread serves the whole group.
///
/// ```swift
/// let monitor = try NIOStallMonitor()
/// try monitor.start(MultiThreadedEventLoopGroup.singleton)
/// ```
///
/// Any group is watched as it is, with heartbeats (see ``start(_:)``). A group made with
/// ``metricsDelegate`` (`try monitor.makeEventLoopGroup(numberOfThreads: 4)` in one call) has its
/// stalls timed exactly, for a cost on every tick. An async server watches its main actor, the
/// cooperative pool and its event loops in one call, `StallMonitor.startService()`.
///
/// Reports are the run-loop monitor's (journald fields, rate limits, symbolication), with
/// `STALL_LOOP` the loop thread's name (`NIO-ELT-0-#1`), `STALL_ACTIVITY=event-loop-cycle`, and
/// `STALL_CALLOUT` what the loop was running: `channel-read`, `channel-write`, `scheduled-task`,
/// `execute-task`, `future-callback` or `unknown`.
public final class NIOStallMonitor: Sendable {
    public let configuration: StallMonitor.Configuration
    private let logger: Logger
    private let sinks: [any ReportSink]
    private let metricsFactory: (any MetricsFactory)?
    private let state = Mutex<EventLoopGroupSession?>(nil)

    /// Creates a monitor; nothing is watched until ``start(_:)``.
    /// - Parameters:
    ///   - configuration: Thresholds and limits; `nil` reads them from the environment as
    ///     `StallMonitor` does (`$STALLMON_CONFIG`, `STALLMON_<KEY>`).
    ///   - logger: Receives the monitor's own diagnostics, as `StallMonitor`'s does: start and stop
    ///     at `debug`, what keeps it from seeing a loop or its stacks at `warning`. The default is
    ///     `Logger.current`, the logger bound with swift-log's `withLogger` or else the process's
    ///     default one; the monitor makes no logger of its own.
    ///   - sinks: Where reports go; `nil` means the journal when journald runs, standard error otherwise.
    ///   - metricsFactory: Where the stall and tick-latency metrics go. `nil` means the backend the
    ///     application bootstrapped (`MetricsSystem.factory`, read at each ``start(_:)``); the
    ///     monitor never bootstraps one.
    /// - Throws: `ConfigurationError` for an invalid configuration.
    public init(
        configuration: StallMonitor.Configuration? = nil, logger: Logger = .current,
        sinks: [any ReportSink]? = nil, metricsFactory: (any MetricsFactory)? = nil
    ) throws(ConfigurationError) {
        let resolved: StallMonitor.Configuration
        if let configuration {
            resolved = configuration
        } else {
            resolved = try StallMonitor.Configuration.fromEnvironment()
        }
        try resolved.validate()
        self.configuration = resolved
        self.logger = logger
        self.sinks = sinks ?? StallMonitor.defaultSinks(resolved, logger: logger)
        self.metricsFactory = metricsFactory
    }

    /// Pass this to `MultiThreadedEventLoopGroup(numberOfThreads:metricsDelegate:)` for stall
    /// durations timed exactly, from tick ends, rather than from heartbeats. The cost is SwiftNIO's:
    /// with any delegate it builds each tick's information and reads the clock twice a tick
    /// (400–900 instructions a request); the delegate itself makes two stores. No lock, no system
    /// call, no allocation.
    public var metricsDelegate: any NIOEventLoopMetricsDelegate { TickCounter() }

    /// Creates a group whose loops are watched from the start (the delegate and ``start(_:)`` in one call).
    /// - Throws: `StallMonitorError` as ``start(_:)`` does; the group is shut down then.
    public func makeEventLoopGroup(numberOfThreads: Int) throws(StallMonitorError) -> MultiThreadedEventLoopGroup {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: numberOfThreads, metricsDelegate: metricsDelegate)
        do {
            try start(group)
        } catch {
            try? group.syncShutdownGracefully()
            throw error
        }
        return group
    }

    /// Starts watching every loop of `group`: any `MultiThreadedEventLoopGroup`, the frameworks'
    /// default `MultiThreadedEventLoopGroup.singleton` among them. The watchdog hands each awake loop
    /// a heartbeat task every eighth of the threshold and knows a stall by a heartbeat left unrun
    /// (durations within half of that period); a group made with ``metricsDelegate`` counts its
    /// ticks instead, and its stalls are timed exactly. Runs one short task on each loop to learn
    /// its thread (and unblock the sampling signal there).
    /// - Important: Call it off the group's loops: it waits for those tasks. Stop the monitor
    ///   before you shut the group down: a loop that is shutting down refuses the watchdog's
    ///   heartbeat, which SwiftNIO reports with an error line (a crash under `SWIFTNIO_STRICT`).
    ///   `MultiThreadedEventLoopGroup.singleton` never shuts down.
    /// - Throws: `StallMonitorError` when the monitor runs already (`.alreadyRunning`), a loop does
    ///   not answer within a second (`.eventLoopDidNotAnswer`), or no sampler slot or signal is free.
    public func start(_ group: MultiThreadedEventLoopGroup) throws(StallMonitorError) {
        #if STALLMON_LINUX
        try state.withLock { (session: inout EventLoopGroupSession?) throws(StallMonitorError) in
            guard session == nil else { throw StallMonitorError.alreadyRunning() }
            session = try EventLoopGroupSession.watching(
                group, configuration: configuration, sinks: sinks, logger: logger, metricsFactory: metricsFactory)
        }
        #else
        logger.debug("stall monitoring is unsupported on this platform (Linux only): the monitor does nothing")
        #endif
    }

    /// The future's value once it completes, or `nil` after a second (a stalled loop).
    fileprivate static func wait<Value: Sendable>(_ future: EventLoopFuture<Value>, on loop: any EventLoop) throws
        -> Value?
    {
        let answered = DispatchSemaphore(value: 0)
        let result = Mutex<Result<Value, any Error>?>(nil)
        future.whenComplete { outcome in
            result.withLock { $0 = outcome }
            answered.signal()
        }
        guard answered.wait(timeout: .now() + 1) == .success else { return nil }
        return try result.withLock { $0 }?.get()
    }

    /// Stops watching: stalls in progress get their ended reports, and every report is out when it
    /// returns. The loops keep counting ticks (two stores each) until the group shuts down.
    public func stop() {
        let session = state.withLock { session in
            defer { session = nil }
            return session
        }
        session?.stop()
    }

    public var isRunning: Bool { state.withLock { $0 != nil } }

    /// Counts since ``start(_:)``; zero when not running.
    public var statistics: StallMonitor.Statistics {
        state.withLock { $0?.statistics } ?? .zero
    }

    /// How long each loop's ticks have lasted since ``start(_:)`` (from the end of its wait for
    /// events to the end of the tick), one per loop; empty when not running or
    /// `StallMonitor.Configuration.loopLatency` is off. Reads the histograms without a lock.
    public var loopLatency: [LoopLatency] {
        state.withLock { $0?.loopLatency } ?? []
    }

    /// One health line per loop, e.g. `loop of NIO-ELT-0-#0 healthy; no stalls in 1h`.
    public var status: String {
        state.withLock { $0?.status } ?? "stall monitor not running"
    }

    /// Times the group's watchdog thread has woken up since ``start(_:)``, for measurements: 0 for a
    /// group that stays idle.
    package var watchdogWakeups: Int {
        state.withLock { $0?.watchdogWakeups } ?? 0
    }

    /// Kernel id of the group's watchdog thread (0 when not running).
    package var watchdogThreadID: Int32 {
        state.withLock { $0?.watchdogThreadID } ?? 0
    }
}

/// Counts ticks into the state its loop thread was bound to.
struct TickCounter: NIOEventLoopMetricsDelegate {
    func processedTick(info: NIOEventLoopTickInfo) {
        #if STALLMON_LINUX
        stallmon_tick(info.startTime.uptimeNanoseconds, info.endTime.uptimeNanoseconds)
        #endif
    }
}

#if STALLMON_LINUX
extension EventLoopGroupSession {
    /// Starts watching every loop of `group`: learns each loop's thread with a task on it (which
    /// also binds the loop's tick state, counted by ``NIOStallMonitor/metricsDelegate`` where the
    /// group has it, and unblocks the sampling signal there), and gives the watchdog a heartbeat for
    /// each loop, `EventLoop.execute` of one call that stamps the moment it runs.
    static func watching(
        _ group: MultiThreadedEventLoopGroup, configuration: StallMonitor.Configuration, sinks: [any ReportSink],
        logger: Logger, metricsFactory: (any MetricsFactory)?
    ) throws(StallMonitorError) -> EventLoopGroupSession {
        let signal = try SamplingSignal.choose(configuration, for: .eventLoops, logger: logger)
        var loops: [(WatchedEventLoop, TickState)] = []
        for loop in group.makeIterator() {
            guard let ticks = TickState.make() else { throw StallMonitorError.outOfMemory() }
            // Before the loop thread is bound: it reads the histogram unsynchronized.
            if configuration.loopLatency, !ticks.enableLatency() { throw StallMonitorError.outOfMemory() }
            let registered = loop.submit { () -> WatchedEventLoop in
                stallmon_ticks_bind(ticks.pointer)
                if let signal { SamplingSignal.unblockOnCurrentThread(signal) }
                return WatchedEventLoop.current()
            }
            guard var described = try? NIOStallMonitor.wait(registered, on: loop) ?? nil else {
                throw StallMonitorError.eventLoopDidNotAnswer()
            }
            described.beat = { loop.execute { stallmon_ticks_beat(ticks.pointer) } }
            loops.append((described, ticks))
        }
        return try EventLoopGroupSession(
            configuration: configuration, sinks: sinks, logger: logger, loops: loops, signal: signal,
            metricsFactory: metricsFactory)
    }
}
#endif

extension StallMonitor {
    /// Watches everything an async server runs on, in one call: the main actor (``StallMonitor/Target/asyncMain``),
    /// Swift's cooperative pool, where async route handlers run (unless `cooperative_pool` is
    /// `false`), and the event loops of `eventLoops`, by default `MultiThreadedEventLoopGroup.singleton`,
    /// which Hummingbird, Vapor and gRPC Swift run on unless told otherwise. The group is watched as
    /// it is, with heartbeats: no metrics delegate, no change to how the service makes it.
    ///
    /// ```swift
    /// @main struct App {
    ///     static func main() async throws {
    ///         let stallmon = try StallMonitor()
    ///         try stallmon.startService()   // before the first await
    ///         try await app.runService()
    ///     }
    /// }
    /// ```
    ///
    /// ``stop()`` stops all of it. A service that makes SwiftNIO's event loops the global executor
    /// (`NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()`),
    /// before or after this call in `main()`'s synchronous part, keeps them: its async jobs then run
    /// inside the singleton's ticks, watched there, and the monitor logs a warning that the pool
    /// itself goes unwatched.
    /// A service whose framework runs on a group of its own passes it: ``startService(eventLoops:)``.
    /// Set `NIOSingletons`' thread-count suggestions, if any, before this call: it makes the singleton.
    /// - Important: Call it on the main thread, in `main()` before its first `await`, as
    ///   ``start(_:)`` with ``StallMonitor/Target/asyncMain``.
    /// - Throws: `StallMonitorError` as ``start(_:)`` and ``NIOStallMonitor/start(_:)`` do; nothing
    ///   runs then.
    public func startService() throws(StallMonitorError) {
        try startService(watching: MultiThreadedEventLoopGroup.singleton, singleton: true)
    }

    /// ``startService()`` for a service that runs on a group of its own, which it passes here
    /// (`nil`: no event loops are watched); `MultiThreadedEventLoopGroup.singleton` is never made.
    /// - Parameter eventLoops: The group the service runs on. It must outlive the monitor:
    ///   ``stop()`` before the group shuts down.
    /// - Throws: `StallMonitorError` as ``startService()`` does; nothing runs then.
    public func startService(eventLoops: MultiThreadedEventLoopGroup?) throws(StallMonitorError) {
        try startService(watching: eventLoops, singleton: false)
    }

    private func startService(watching eventLoops: MultiThreadedEventLoopGroup?, singleton: Bool)
        throws(StallMonitorError)
    {
        try start(.asyncMain, eventLoopsWatched: singleton)
        #if STALLMON_LINUX
        guard let eventLoops else { return }
        do {
            let session = try EventLoopGroupSession.watching(
                eventLoops, configuration: configuration, sinks: sinks, logger: logger,
                metricsFactory: metricsFactory)
            if !attach(session) { session.stop() }
        } catch {
            stop()
            throw error
        }
        #endif
    }
}
