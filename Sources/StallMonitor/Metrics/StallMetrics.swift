import CoreMetrics
import Synchronization

/// One loop's stall metrics, in whatever backend the application bootstrapped (or the factory it
/// passed): a counter and a timer per callout kind, and counters of the reports that did not go out.
///
/// | label | kind | dimensions |
/// |---|---|---|
/// | `stallmon_stalls_total` | counter | `loop`, `callout` |
/// | `stallmon_stall_duration_seconds` | timer | `loop`, `callout` |
/// | `stallmon_suppressed_reports_total` | counter | `loop` |
/// | `stallmon_dropped_reports_total` | counter | `loop`, `sink` |
/// | `stallmon_lost_reports_total` | counter | `loop` |
///
/// `sink` is the type name of the sink whose queue dropped the report (`LoggerSink`), or
/// ``allSinks`` for a report dropped at the report queue, before any sink had it.
final class StallMetrics: Sendable {
    static let stallsLabel = "stallmon_stalls_total"
    static let durationLabel = "stallmon_stall_duration_seconds"
    static let suppressedLabel = "stallmon_suppressed_reports_total"
    static let droppedLabel = "stallmon_dropped_reports_total"
    static let lostLabel = "stallmon_lost_reports_total"
    /// The `sink` of reports dropped at the report queue: no sink had them.
    static let allSinks = "all"

    private let factory: any MetricsFactory
    private let loop: String
    private let suppressed: Counter
    /// Created at a sink's first drop, so that the backend shows only sinks that dropped.
    private let dropped = Mutex<[String: Counter]>([:])
    private let lost: Counter
    /// Created at a callout kind's first stall, so that the backend shows only kinds that stalled.
    private let byCallout = Mutex<[StallReport.Callout: (stalls: Counter, duration: Timer)]>([:])

    init(loop: String, factory: any MetricsFactory) {
        self.factory = factory
        self.loop = loop
        let dimensions = [("loop", loop)]
        suppressed = Counter(label: Self.suppressedLabel, dimensions: dimensions, factory: factory)
        lost = Counter(label: Self.lostLabel, dimensions: dimensions, factory: factory)
    }

    /// A stall that ended (reported or suppressed), with its true duration.
    func recordStall(callout: StallReport.Callout, duration: Duration) {
        let metrics = byCallout.withLock { metrics in
            if let existing = metrics[callout] { return existing }
            let dimensions = [("loop", loop), ("callout", callout.rawValue)]
            let created = (
                Counter(label: Self.stallsLabel, dimensions: dimensions, factory: factory),
                Timer(label: Self.durationLabel, dimensions: dimensions, factory: factory)
            )
            metrics[callout] = created
            return created
        }
        metrics.stalls.increment()
        metrics.duration.recordNanoseconds(duration.nanoseconds)
    }

    func recordSuppressed() { suppressed.increment() }
    /// A report dropped at the report queue (`sink` ``allSinks``) or at a sink's own queue.
    func recordDropped(sink: String = allSinks) {
        let counter = dropped.withLock { counters in
            if let existing = counters[sink] { return existing }
            let created = Counter(
                label: Self.droppedLabel, dimensions: [("loop", loop), ("sink", sink)], factory: factory)
            counters[sink] = created
            return created
        }
        counter.increment()
    }
    func recordLost() { lost.increment() }
}
