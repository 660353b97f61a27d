#if STALLMON_LINUX
import CStallCapture
import Logging

/// The lifecycle every monitor shares, whatever loop it watches: a sampler slot for its watchdog
/// thread, one reporter per loop (each with its own rate limit and status), the watchdog, the
/// `started` and `stopped` reports, and the statistics. The sessions of each kind of loop
/// (``StallMonitor/RunLoopSession``, ``EventLoopGroupSession``, ``CooperativePoolSession``) set up
/// what their loops need around it.
final class WatchdogSession: @unchecked Sendable {
    let watchdog: Watchdog
    let reporters: [Reporter]
    private let descriptions: [MonitorDescription]
    private let slot: Int32
    private let logger: Logger
    private let latency: [LoopLatencyExporter]

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
