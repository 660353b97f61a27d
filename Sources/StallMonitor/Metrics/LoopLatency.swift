import CStallCapture
import CoreMetrics
import StallJournal
import Synchronization

/// How long the windows of a monitored loop lasted since the monitor started: a run-loop window
/// (its callouts, from a before-timers or after-waiting transition to the next transition), a drain
/// of the main queue under ``StallMonitor/Target/asyncMain``, or a tick of a SwiftNIO event loop.
/// The loop-latency distribution that Node's `monitorEventLoopDelay` and tokio's poll-time
/// histogram give their runtimes, counted on the loop's thread into log-linear buckets (below 1 µs,
/// then four per power of two) and read without a lock.
///
/// Windows that overlap an ``StallMonitor/allowingStall(_:)`` scope are not counted.
public struct LoopLatency: Sendable, Hashable {
    /// One bucket: windows shorter than `upperBound` and at least as long as the previous bucket's
    /// bound. The last bucket has no upper bound (windows from 60.1 s on).
    public struct Bucket: Sendable, Hashable {
        public var upperBound: Duration?
        public var count: Int
    }

    /// `main`, the thread's name, or the event loop's thread name (`NIO-ELT-0-#1`).
    public var loop: String
    /// The buckets that counted a window, shortest first.
    public var buckets: [Bucket]
    /// Windows counted.
    public var count: Int
    /// Their total duration: over a span of wall time, the share of it the loop was busy.
    public var total: Duration

    /// The upper bound of the bucket that holds the `quantile` (0…1) of the windows: at most 25 %
    /// above the true value. `nil` when no window was counted, or it lies in the last bucket.
    public func quantile(_ quantile: Double) -> Duration? {
        guard count > 0 else { return nil }
        let rank = max(1, Int((quantile * Double(count)).rounded(.up)))
        var seen = 0
        for bucket in buckets {
            seen += bucket.count
            if seen >= rank { return bucket.upperBound }
        }
        return buckets.last?.upperBound
    }
}

#if STALLMON_LINUX
extension LoopLatency {
    init(loop: String, counts: [UInt64], sum: UInt64) {
        self.loop = loop
        buckets = counts.indices.compactMap { index in
            counts[index] == 0 ? nil : Bucket(upperBound: Self.upperBound(index), count: Int(counts[index]))
        }
        count = Int(counts.reduce(0, +))
        total = .nanoseconds(sum)
    }

    /// A bucket's exclusive upper bound, `nil` for the last.
    static func upperBound(_ index: Int) -> Duration? {
        let bound = stallmon_latency_bucket_upper_ns(Int32(index))
        return bound == .max ? nil : .nanoseconds(bound)
    }
}

/// Reads one loop's latency histogram and hands it to the metrics backend: the windows counted
/// since the previous export, as a counter and as quantile gauges. It runs when the watchdog is
/// awake anyway (at most once a second, while the loop is busy) and when the monitor stops: a
/// histogram costs an idle process no wakeup.
///
/// | label | kind | dimensions |
/// |---|---|---|
/// | `stallmon_loop_windows_total` | counter | `loop` |
/// | `stallmon_loop_window_seconds` | gauge | `loop`, `quantile` (`0.5`, `0.9`, `0.99`, `0.999`, `1`) |
final class LoopLatencyExporter: @unchecked Sendable {
    static let windowsLabel = "stallmon_loop_windows_total"
    static let quantileLabel = "stallmon_loop_window_seconds"
    static let quantiles: [(value: Double, name: String)] = [
        (0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99"), (0.999, "0.999"), (1, "1"),
    ]
    /// The shortest time between two exports while the watchdog is awake.
    static let interval: UInt64 = 1_000_000_000

    let loop: String
    /// Owned by the loop state (or tick state), which outlives the exporter's use of it.
    private let histogram: OpaquePointer
    private let windows: Counter
    private let gauges: [Gauge]
    private let state: Mutex<(counts: [UInt64], exportedAt: UInt64)>

    init(loop: String, histogram: OpaquePointer, factory: any MetricsFactory) {
        self.loop = loop
        self.histogram = histogram
        windows = Counter(label: Self.windowsLabel, dimensions: [("loop", loop)], factory: factory)
        gauges = Self.quantiles.map {
            Gauge(label: Self.quantileLabel, dimensions: [("loop", loop), ("quantile", $0.name)], factory: factory)
        }
        state = Mutex((Array(repeating: 0, count: Int(STALLMON_LATENCY_BUCKETS)), MonotonicClock.now()))
    }

    /// Everything counted since the monitor started.
    func snapshot() -> LoopLatency {
        let (counts, sum) = read()
        return LoopLatency(loop: loop, counts: counts, sum: sum)
    }

    /// Exports when the previous export is at least ``interval`` old.
    func exportIfDue(now: UInt64 = MonotonicClock.now()) {
        guard state.withLock({ now &- $0.exportedAt >= Self.interval }) else { return }
        export(now: now)
    }

    /// Exports the windows counted since the previous export (none: nothing changes).
    func export(now: UInt64 = MonotonicClock.now()) {
        let (counts, _) = read()
        let delta = state.withLock { state in
            defer { state = (counts, now) }
            // A count never decreases (one writer), but may lag another: clamp at 0.
            return zip(counts, state.counts).map { $0 > $1 ? $0 - $1 : 0 }
        }
        let interval = LoopLatency(loop: loop, counts: delta, sum: 0)
        guard interval.count > 0 else { return }
        windows.increment(by: interval.count)
        for (gauge, quantile) in zip(gauges, Self.quantiles) {
            // The last bucket has no upper bound: it is shown as its lower one.
            let bound = interval.quantile(quantile.value) ?? Self.lastBucketStart
            gauge.record(bound.totalSeconds)
        }
    }

    private static let lastBucketStart = LoopLatency.upperBound(Int(STALLMON_LATENCY_BUCKETS) - 2)!

    private func read() -> ([UInt64], UInt64) {
        var counts = [UInt64](repeating: 0, count: Int(STALLMON_LATENCY_BUCKETS))
        let sum = counts.withUnsafeMutableBufferPointer { stallmon_latency_read(histogram, $0.baseAddress) }
        return (counts, sum)
    }
}
#endif  // STALLMON_LINUX
