#if STALLMON_LINUX
import CStallCapture
import CoreMetrics
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The monitor of one group of event loops, from start to stop: the shared ``WatchdogSession`` (a
/// reporter per loop, each with its own rate limit and status, the sampler slot and the group's one
/// watchdog thread) around the group's ``EventLoopBackend``. Framework adapters (StallMonitorNIO)
/// register the loops' threads and bind their tick state.
package final class EventLoopGroupSession: @unchecked Sendable {
    package let configuration: StallMonitor.Configuration
    private let session: WatchdogSession
    private let logger: Logger
    private let latency: [LoopLatencyExporter]

    /// Starts watching `loops`, whose threads count their ticks into the paired tick state.
    /// - Parameters:
    ///   - signal: From ``SamplingSignal/choose(_:for:logger:)`` for `.eventLoops`, unblocked on the
    ///     loop threads.
    ///   - metricsFactory: Where the metrics go; `nil` means `MetricsSystem.factory`.
    /// - Throws: ``StallMonitorError`` when no sampler slot is free.
    package init(
        configuration: StallMonitor.Configuration, sinks: [any ReportSink], logger: Logger,
        loops: [(WatchedEventLoop, TickState)], signal: Int32?,
        metricsFactory: (any MetricsFactory)? = nil
    ) throws(StallMonitorError) {
        let factory = metricsFactory ?? MetricsSystem.factory
        self.configuration = configuration
        self.logger = logger
        if let signal, loops.contains(where: { ThreadInspector(threadID: $0.0.threadID).blocks(signal) }) {
            logger.warning(
                "an event loop thread blocks the sampling signal; its stall reports will carry no stack",
                metadata: ["signal": "\(SignalName.name(of: signal))"]
            )
        }
        // Tick state whose histogram ``TickState/enableLatency()`` turned on before its thread was bound.
        let latency = loops.compactMap { loop, ticks in
            stallmon_ticks_latency(ticks.pointer).map {
                LoopLatencyExporter(loop: loop.name, histogram: $0, factory: factory)
            }
        }
        self.latency = latency
        let backend: EventLoopBackend
        (session, backend) = try WatchdogSession.make(
            loops: loops.map {
                .init(
                    name: $0.0.name, threadID: Int($0.0.threadID),
                    callouts: StallReport.Callout.recognizeEventLoopCallout, isEventLoop: true)
            },
            configuration: configuration, signal: signal, sinks: sinks, metricsFactory: factory, logger: logger
        ) { (engine, slot, reporters) throws(StallMonitorError) in
            (
                try EventLoopBackend(engine: engine, loops: loops, reporters: reporters, slot: slot, latency: latency),
                latency
            )
        }
        if let reason = backend.unavailableReason {
            // A fallback that costs wakeups, not sight: every stall is still seen.
            logger.info(
                "idle event loops are looked at once per threshold: \(reason)",
                metadata: ["stallmon.threshold_ms": "\(configuration.threshold.milliseconds)"]
            )
        }
        session.start()
        logger.debug(
            "stallmon started",
            metadata: [
                "stallmon.loops": "\(loops.map(\.0.name).joined(separator: ","))",
                "stallmon.configuration": "\(configuration.summary)",
            ]
        )
    }

    /// Stops the watchdog (stalls in progress get their ended reports) and waits until every
    /// report is out.
    package func stop() {
        session.stop()
        logger.debug("stallmon stopped", metadata: ["stallmon.stalls": "\(statistics.stalls)"])
    }

    package var statistics: StallMonitor.Statistics { session.statistics }

    /// How long each loop's ticks have lasted since the start; empty unless `loop_latency` is on.
    package var loopLatency: [LoopLatency] { latency.map { $0.snapshot() } }

    /// Times the watchdog thread woke up, for measurements.
    package var watchdogWakeups: Int { session.watchdog.wakeups }
    package var watchdogThreadID: Int32 { session.watchdog.threadID }

    /// One line per loop, e.g. `loop of NIO-ELT-0-#0 healthy; no stalls in 1h`.
    package var status: String {
        session.reporters.map { $0.status.line() }.joined(separator: "; ")
    }
}
#else

/// Event loops are watched on Linux only: elsewhere no session is ever made, and
/// `NIOStallMonitor.start(_:)` does nothing (``StallMonitor/isSupported``).
package final class EventLoopGroupSession: Sendable {
    private init() {}
    package func stop() {}
    package var statistics: StallMonitor.Statistics { .zero }
    package var status: String { "stall monitor not running: unsupported on this platform" }
    package var watchdogWakeups: Int { 0 }
    package var watchdogThreadID: Int32 { 0 }
    package var loopLatency: [LoopLatency] { [] }
}
#endif  // STALLMON_LINUX

extension StallMonitor.Statistics {
    /// No stalls, nothing suppressed or dropped.
    package static let zero = Self(stalls: 0, suppressedReports: 0, droppedReports: 0, lostReports: 0)
}
