import Synchronization

/// Receives what a ``StallMonitor`` reports. Sinks run on the monitor's reporting queue, never
/// on a monitored thread; a slow sink delays later reports (which are queued, then dropped and
/// counted past ``StallMonitor/Configuration/reportQueueCapacity``), never the monitored loop.
public protocol ReportSink: Sendable {
    /// Delivers one event.
    /// - Throws: When the event did not reach its destination: the monitor counts it as lost
    ///   (``StallMonitor/Statistics/lostReports``) and tells in its `stopped` summary.
    func emit(_ event: StallMonitorEvent) throws
}

/// Everything a monitor reports.
public enum StallMonitorEvent: Sendable {
    case started(MonitorDescription)
    case stopped(MonitorDescription, StallMonitor.Statistics)
    case stallDetected(StallReport)
    case stallEnded(StallReport)
    /// A stall outlasted the service's `WatchdogSec=`; systemd is about to kill the service.
    case watchdogStall(StallReport)
    case suppressed(SuppressionReport)
}

/// What is being monitored, and how.
public struct MonitorDescription: Sendable, Hashable {
    /// `main`, or the thread's name.
    public var loop: String
    public var threadID: Int
    public var configuration: StallMonitor.Configuration
    /// The signal used for sampling, `nil` when none was free (reports then carry no stack).
    public var signal: Int32?

    /// `monitoring main run loop (tid 1234): threshold 250 ms, sample interval 20 ms, signal SIGRTMAX-4`.
    public var message: String {
        let loopName =
            loop == EventLoopWatchdog.poolLoopName
            ? "the cooperative pool" : loop == "main" ? "main run loop" : "run loop of thread \(loop)"
        let signalName = signal.map(SignalName.name(of:)) ?? "none (no stacks)"
        return "monitoring \(loopName) (tid \(threadID)): threshold \(configuration.threshold.milliseconds) ms, "
            + "sample interval \(configuration.sampleInterval.milliseconds) ms, signal \(signalName)"
    }
}

/// Collects events in memory, for tests and for programs that act on stalls themselves.
public final class CollectingSink: ReportSink, Sendable {
    private let collected = Mutex<[StallMonitorEvent]>([])
    private let onEvent: (@Sendable (StallMonitorEvent) -> Void)?

    public init(onEvent: (@Sendable (StallMonitorEvent) -> Void)? = nil) {
        self.onEvent = onEvent
    }

    public func emit(_ event: StallMonitorEvent) {
        collected.withLock { $0.append(event) }
        onEvent?(event)
    }

    public var events: [StallMonitorEvent] { collected.withLock { $0 } }
}
