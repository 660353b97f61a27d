#if STALLMON_LINUX
import CStallCapture
import CoreMetrics
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The monitor of one group of event loops, from start to stop: a reporter per loop (each with its
/// own rate limit and status), the sampling signal and slot, and the group's one watchdog thread.
/// Framework adapters (StallMonitorNIO) register the loops' threads and bind their tick state.
package final class EventLoopGroupSession: @unchecked Sendable {
    package let configuration: StallMonitor.Configuration
    private let watchdog: EventLoopWatchdog
    private let reporters: [Reporter]
    private let descriptions: [MonitorDescription]
    private let slot: Int32
    private let logger: Logger
    private let latency: [LoopLatencyExporter]

    /// Starts watching `loops`, whose threads count their ticks into the paired tick state.
    /// - Parameters:
    ///   - signal: From ``samplingSignal(_:logger:)``, unblocked on the loop threads.
    ///   - metricsFactory: Where the metrics go; `nil` means `MetricsSystem.factory`.
    /// - Throws: ``StallMonitorError`` when no sampler slot is free.
    package init(
        configuration: StallMonitor.Configuration, sinks: [any ReportSink], logger: Logger,
        loops: [(EventLoopWatchdog.Loop, EventLoopWatchdog.TickState)], signal: Int32?,
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
        slot = stallmon_sampler_slot_claim()
        guard slot >= 0 else { throw StallMonitorError.tooManyMonitors() }
        _ = stallmon_continue_watch_install()
        reporters = loops.map { loop, _ in
            Reporter(
                configuration: configuration, loopName: loop.name, threadID: Int(loop.threadID), sinks: sinks,
                seenTurning: true, metrics: StallMetrics(loop: loop.name, factory: factory))
        }
        // Tick state whose histogram ``enableLatency(_:)`` turned on before its thread was bound.
        latency = loops.compactMap { loop, ticks in
            stallmon_ticks_latency(ticks.pointer).map {
                LoopLatencyExporter(loop: loop.name, histogram: $0, factory: factory)
            }
        }
        descriptions = loops.map { loop, _ in
            MonitorDescription(
                loop: loop.name, threadID: Int(loop.threadID), configuration: configuration, signal: signal,
                isEventLoop: true)
        }
        do {
            watchdog = try EventLoopWatchdog(
                configuration: configuration, loops: loops, reporters: reporters, signal: signal, slot: slot,
                latency: latency)
        } catch {
            stallmon_sampler_slot_release(slot)
            throw error
        }
        if let reason = watchdog.unavailableReason {
            // A fallback that costs wakeups, not sight: every stall is still seen.
            logger.info(
                "idle event loops are looked at once per threshold: \(reason)",
                metadata: ["stallmon.threshold_ms": "\(configuration.threshold.milliseconds)"]
            )
        }
        watchdog.start()
        for (reporter, description) in zip(reporters, descriptions) { reporter.emit(.started(description)) }
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
        watchdog.stop()
        for exporter in latency { exporter.export() }
        let total = statistics
        for (reporter, description) in zip(reporters, descriptions) {
            let statistics = StallMonitor.Statistics(
                stalls: 0, suppressedReports: reporter.suppressedReports.load(),
                droppedReports: reporter.droppedReports.load(), lostReports: reporter.lostReports.load()
            )
            reporter.finish(description, statistics, logger: logger)
        }
        stallmon_sampler_slot_release(slot)
        logger.debug("stallmon stopped", metadata: ["stallmon.stalls": "\(total.stalls)"])
    }

    package var statistics: StallMonitor.Statistics {
        StallMonitor.Statistics(
            stalls: watchdog.stalls,
            suppressedReports: reporters.reduce(0) { $0 + $1.suppressedReports.load() },
            droppedReports: reporters.reduce(0) { $0 + $1.droppedReports.load() },
            lostReports: reporters.reduce(0) { $0 + $1.lostReports.load() }
        )
    }

    /// How long each loop's ticks have lasted since the start; empty unless `loop_latency` is on.
    package var loopLatency: [LoopLatency] { latency.map { $0.snapshot() } }

    /// Has the loop thread bound to `ticks` count its tick durations; call it before binding the
    /// thread. Returns false when the histogram cannot be allocated.
    package static func enableLatency(_ ticks: EventLoopWatchdog.TickState) -> Bool {
        stallmon_ticks_enable_latency(ticks.pointer) == 0
    }

    /// Times the watchdog thread woke up, for measurements.
    package var watchdogWakeups: Int { watchdog.wakeups }
    package var watchdogThreadID: Int32 { watchdog.threadID }

    /// One line per loop, e.g. `loop of NIO-ELT-0-#0 healthy; no stalls in 1h`.
    package var status: String {
        reporters.map { $0.status.line() }.joined(separator: "; ")
    }

    /// The configured signal, or the highest real-time signal that has no handler (`nil`, with a
    /// warning, when there is none), with stallmon's handler installed. Unblock it on each loop
    /// thread with ``unblockOnCurrentThread(_:)``: a parent may have spawned the service with
    /// real-time signals blocked, and the signal is the monitor's own, so nothing else changes.
    /// - Throws: ``StallMonitorError`` when the configured signal is taken.
    package static func samplingSignal(_ configuration: StallMonitor.Configuration, logger: Logger)
        throws(StallMonitorError) -> Int32?
    {
        if let signal = configuration.signal {
            let rc = stallmon_sampler_install(signal)
            guard rc == 0 else {
                throw StallMonitorError.signalUnavailable(
                    signal, reason: rc == -EBUSY ? "another handler owns it" : "sigaction failed (errno \(-rc))")
            }
            return signal
        }
        let candidates = stride(from: stallmon_sigrtmax() - 4, through: stallmon_sigrtmin() + 4, by: -1)
        guard let signal = candidates.first(where: { stallmon_sampler_install($0) == 0 }) else {
            logger.warning("no free real-time signal for sampling; stall reports will carry no stack")
            return nil
        }
        return signal
    }

    /// Unblocks `signal` on the calling thread (a loop thread, from a task it runs).
    package static func unblockOnCurrentThread(_ signal: Int32) {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, signal)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
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
