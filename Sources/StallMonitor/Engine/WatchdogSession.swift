#if STALLMON_LINUX
import CStallCapture
import CoreMetrics
import Logging

/// How the backend of a loop names the callout a stalled stack was in (frames innermost first):
/// each backend knows its own loop's callouts, and its loops' reporters ask it.
typealias CalloutNaming = @Sendable ([StallFrame]) -> StallReport.Callout

/// The lifecycle every monitor shares, whatever loop it watches: a sampler slot for its watchdog
/// thread, one reporter per loop (each with its own rate limit and status), the watchdog, the
/// `started` and `stopped` reports, and the statistics. The sessions of each kind of loop
/// (``StallMonitor/RunLoopSession``, ``EventLoopGroupSession``, ``CooperativePoolSession``) make it
/// through one set-up, ``make(loops:configuration:signal:sinks:metricsFactory:logger:interruptBlockedThreads:engineLogger:backend:)``,
/// and add what their loops need around it.
final class WatchdogSession: @unchecked Sendable {
    let watchdog: Watchdog
    let reporters: [Reporter]
    private let descriptions: [MonitorDescription]
    private let slot: Int32
    private let logger: Logger
    private let latency: [LoopLatencyExporter]

    /// One loop a watch reports on: what its reporter and its `started` and `stopped` entries name.
    struct Loop {
        var name: String
        var threadID: Int
        /// How its backend names the callout a stalled stack was in.
        var callouts: CalloutNaming
        var isEventLoop = false
        /// Whether the loop counts as running from the start (a run loop is not seen running until
        /// its first turn: its status says so until then).
        var seenTurning = true
    }

    /// The one set-up of a watch, whatever its loops: claims a sampler slot, makes a reporter and a
    /// description per loop and the engine, has `backend` make the backend (and the loops' latency
    /// exporters) from them, and makes the session, not yet started. The slot goes back when
    /// `backend` throws.
    /// - Parameters:
    ///   - signal: The sampling signal, `nil` when none was free.
    ///   - interruptBlockedThreads: Whether the sampler signals a thread in a system call.
    ///   - engineLogger: Where the sampler says, once, that the program took its signal over.
    static func make<Backend: WatchdogBackend>(
        loops: [Loop], configuration: StallMonitor.Configuration, signal: Int32?, sinks: [any ReportSink],
        metricsFactory: any MetricsFactory, logger: Logger, interruptBlockedThreads: Bool = false,
        engineLogger: Logger? = nil,
        backend makeBackend: (_ engine: StallEngine, _ slot: Int32, _ reporters: [Reporter]) throws(StallMonitorError)
            -> (Backend, [LoopLatencyExporter])
    ) throws(StallMonitorError) -> (session: WatchdogSession, backend: Backend) {
        let slot = try claimSlot()
        let reporters = loops.map { loop in
            let reporter = Reporter(
                configuration: configuration, loopName: loop.name, threadID: loop.threadID, sinks: sinks,
                seenTurning: loop.seenTurning, callouts: loop.callouts,
                metrics: StallMetrics(loop: loop.name, factory: metricsFactory),
                logger: logger)
            let description = MonitorDescription(
                loop: loop.name, threadID: loop.threadID, configuration: configuration, signal: signal,
                isEventLoop: loop.isEventLoop)
            return (reporter, description)
        }
        let engine = StallEngine(
            configuration: configuration, signal: signal, slot: slot, interruptBlockedThreads: interruptBlockedThreads,
            logger: engineLogger)
        let backend: Backend
        let latency: [LoopLatencyExporter]
        do throws(StallMonitorError) {
            (backend, latency) = try makeBackend(engine, slot, reporters.map(\.0))
        } catch {
            releaseSlot(slot)
            throw error
        }
        let session = WatchdogSession(
            slot: slot, backend: backend, reporters: reporters, latency: latency, logger: logger)
        return (session, backend)
    }

    /// Claims a sampler slot for a watchdog thread.
    /// Release it with ``releaseSlot(_:)`` if the session is never made.
    /// - Throws: ``StallMonitorError`` when every slot is taken.
    static func claimSlot() throws(StallMonitorError) -> Int32 {
        let slot = stallmon_sampler_slot_claim()
        guard slot >= 0 else { throw StallMonitorError.tooManyMonitors() }
        return slot
    }

    static func releaseSlot(_ slot: Int32) {
        stallmon_sampler_slot_release(slot)
    }

    /// - Parameters:
    ///   - slot: From ``claimSlot()``; the session releases it at its stop.
    ///   - reporters: One per loop, with the description its `started` and `stopped` reports carry.
    ///   - latency: The loops' latency histograms, exported a last time at the stop.
    init(
        slot: Int32, backend: some WatchdogBackend, reporters: [(Reporter, MonitorDescription)],
        latency: [LoopLatencyExporter], logger: Logger
    ) {
        self.slot = slot
        self.watchdog = Watchdog(backend)
        self.reporters = reporters.map(\.0)
        self.descriptions = reporters.map(\.1)
        self.latency = latency
        self.logger = logger
    }

    /// Starts the watchdog thread, and says so in each loop's `started` report.
    func start() {
        watchdog.start()
        for (reporter, description) in zip(reporters, descriptions) { reporter.emit(.started(description)) }
    }

    /// Stops the watchdog (a stall in progress gets its ended report), exports the latency a last
    /// time, and waits until each loop's `stopped` report and every report before it is out.
    func stop() {
        watchdog.stop()
        for exporter in latency { exporter.export() }
        // The watchdog counts the stalls of all its loops together: with several, no loop's
        // `stopped` report carries a count.
        let stalls = reporters.count == 1 ? watchdog.stalls : 0
        for (reporter, description) in zip(reporters, descriptions) {
            let statistics = StallMonitor.Statistics(
                stalls: stalls, suppressedReports: reporter.suppressedReports.load(),
                droppedReports: reporter.droppedReports.load(), lostReports: reporter.lostReports.load())
            reporter.finish(description, statistics, logger: logger)
        }
        Self.releaseSlot(slot)
    }

    var statistics: StallMonitor.Statistics {
        StallMonitor.Statistics(
            stalls: watchdog.stalls,
            suppressedReports: reporters.reduce(0) { $0 + $1.suppressedReports.load() },
            droppedReports: reporters.reduce(0) { $0 + $1.droppedReports.load() },
            lostReports: reporters.reduce(0) { $0 + $1.lostReports.load() }
        )
    }
}
#endif  // STALLMON_LINUX
