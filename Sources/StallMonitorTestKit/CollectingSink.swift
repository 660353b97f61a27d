import StallMonitor
import Synchronization

/// Collects events in memory, for tests and for programs that act on stalls themselves.
public final class CollectingSink: ReportSink, Sendable {
    private let collected = Mutex<[StallMonitorEvent]>([])
    private let onEvent: (@Sendable (StallMonitorEvent) -> Void)?

    /// - Parameter onEvent: Called with each event as it comes, on the sink's thread.
    public init(onEvent: (@Sendable (StallMonitorEvent) -> Void)? = nil) {
        self.onEvent = onEvent
    }

    public func emit(_ event: StallMonitorEvent) {
        collected.withLock { $0.append(event) }
        onEvent?(event)
    }

    /// Every event so far, in the order they came.
    public var events: [StallMonitorEvent] { collected.withLock { $0 } }
}
