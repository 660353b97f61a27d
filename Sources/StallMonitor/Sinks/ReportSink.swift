/// Receives what a ``StallMonitor`` reports, never on a monitored thread. A ``JournalSink`` runs on
/// the process's reporting thread (`stallmon-report`), which every monitor shares; every other sink
/// has, per monitored loop, a queue of ``StallMonitor/Configuration/reportQueueCapacity`` events
/// and a thread of its own (`stallmon-sink`) while the queue holds any. A slow sink delays only its
/// own later events (past the capacity its oldest are dropped and counted), never the journal,
/// another sink or a monitored loop. A sink gets one loop's events in order, one at a time; with
/// several loops it may be called for two at once. A sink must not wait for another monitor's
/// reports, nor stop a monitor.
public protocol ReportSink: Sendable {
    /// Delivers one event.
    /// - Throws: When the event did not reach its destination: the monitor counts it as lost
    ///   (``StallMonitor/Statistics/lostReports``) and tells in its `stopped` summary.
    func emit(_ event: StallMonitorEvent) throws
}

/// One thing a monitor reports: an event of some ``Kind``, with what that kind carries.
///
/// Later versions may add kinds, so a sink acts on the kinds it knows and lets the others pass:
///
/// ```swift
/// func emit(_ event: StallMonitorEvent) throws {
///     switch event.kind {
///     case .stallEnded, .watchdogStall: try page(event.report!)
///     default: break
///     }
/// }
/// ```
///
/// A sink that handles every stall report can read ``report`` alone: it is set for each kind that
/// carries one, the kinds to come included.
public struct StallMonitorEvent: Sendable {
    /// What happened. Compare with `==` or `switch` over the kinds a sink knows, with a `default`.
    public struct Kind: Sendable, Hashable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable {
            case started
            case stopped
            case stallDetected
            case stallEnded
            case watchdogStall
            case suppressed
        }

        private let value: Value

        private init(_ value: Value) {
            self.value = value
        }

        /// Monitoring began: ``StallMonitorEvent/monitor`` says what and how.
        public static let started = Self(.started)
        /// Monitoring ended: ``StallMonitorEvent/monitor`` and ``StallMonitorEvent/statistics``.
        public static let stopped = Self(.stopped)
        /// A stall reached the threshold and goes on: ``StallMonitorEvent/report``.
        public static let stallDetected = Self(.stallDetected)
        /// A stall ended: ``StallMonitorEvent/report``, with its whole duration.
        public static let stallEnded = Self(.stallEnded)
        /// A stall outlasted the service's `WatchdogSec=`; systemd is about to kill the service:
        /// ``StallMonitorEvent/report``.
        public static let watchdogStall = Self(.watchdogStall)
        /// Reports held back by the rate limit, summed up: ``StallMonitorEvent/suppression``.
        public static let suppressed = Self(.suppressed)

        /// The kind's name, e.g. `stallEnded`.
        public var description: String { value.rawValue }
    }

    public let kind: Kind
    /// What is monitored: set for ``Kind/started`` and ``Kind/stopped``.
    public let monitor: MonitorDescription?
    /// The monitor's counts when it stopped: set for ``Kind/stopped``.
    public let statistics: StallMonitor.Statistics?
    /// The stall: set for ``Kind/stallDetected``, ``Kind/stallEnded`` and ``Kind/watchdogStall``.
    public let report: StallReport?
    /// The reports held back: set for ``Kind/suppressed``.
    public let suppression: SuppressionReport?

    private init(
        _ kind: Kind, monitor: MonitorDescription? = nil, statistics: StallMonitor.Statistics? = nil,
        report: StallReport? = nil, suppression: SuppressionReport? = nil
    ) {
        self.kind = kind
        self.monitor = monitor
        self.statistics = statistics
        self.report = report
        self.suppression = suppression
    }

    package static func started(_ monitor: MonitorDescription) -> Self {
        Self(.started, monitor: monitor)
    }

    package static func stopped(_ monitor: MonitorDescription, _ statistics: StallMonitor.Statistics) -> Self {
        Self(.stopped, monitor: monitor, statistics: statistics)
    }

    package static func stallDetected(_ report: StallReport) -> Self {
        Self(.stallDetected, report: report)
    }

    package static func stallEnded(_ report: StallReport) -> Self {
        Self(.stallEnded, report: report)
    }

    package static func watchdogStall(_ report: StallReport) -> Self {
        Self(.watchdogStall, report: report)
    }

    package static func suppressed(_ suppression: SuppressionReport) -> Self {
        Self(.suppressed, suppression: suppression)
    }
}

/// What is being monitored, and how.
public struct MonitorDescription: Sendable, Hashable {
    /// `main`, or the thread's name.
    public var loop: String
    public var threadID: Int
    public var configuration: StallMonitor.Configuration
    /// The signal used for sampling, `nil` when none was free (reports then carry no stack).
    public var signal: Int32?
    /// Whether `loop` names an event loop's thread (SwiftNIO's) rather than a run loop's.
    public var isEventLoop: Bool = false

    /// `STALL_LOOP` of the cooperative pool's stalls.
    package static let cooperativePoolLoop = "cooperative-pool"

    /// `monitoring main run loop (tid 1234): threshold 250 ms, sample interval 20 ms, signal SIGRTMAX-4`.
    public var message: String {
        let loopName =
            loop == MonitorDescription.cooperativePoolLoop
            ? "the cooperative pool"
            : isEventLoop ? "event loop \(loop)" : loop == "main" ? "main run loop" : "run loop of thread \(loop)"
        let signalName = signal.map(SignalName.name(of:)) ?? "none (no stacks)"
        return "monitoring \(loopName) (tid \(threadID)): threshold \(configuration.threshold.milliseconds) ms, "
            + "sample interval \(configuration.sampleInterval.milliseconds) ms, signal \(signalName)"
    }
}
