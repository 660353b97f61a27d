import CStallCapture
import CoreFoundation
import Foundation
import MetricsTestKit
import StallMonitorTestKit
import StallmonFixtureKit
import StallmonTestSupport
import Synchronization
import Testing

@testable import StallMonitor

/// The loop-latency histogram's buckets and its export, without a loop.
@Suite struct LoopLatencyHistogramTests {
    @Test func everyDurationFallsInTheBucketWhoseBoundsHoldIt() {
        var values: [UInt64] = [0, 1, 1023, 1024, 1279, 1280, 1_000_000, 30_000_000, 250_000_000, 60_000_000_000]
        for exponent in 10...36 {
            let power = UInt64(1) << UInt64(exponent)
            values += [power - 1, power, power + 1, power + power / 4 - 1, power + power / 4, power + power / 2]
        }
        for value in values {
            let index = Int(stallmon_latency_bucket(value))
            #expect((0..<Int(STALLMON_LATENCY_BUCKETS)).contains(index))
            #expect(value < stallmon_latency_bucket_upper_ns(Int32(index)), "\(value) ns above bucket \(index)")
            if index > 0 {
                #expect(
                    value >= stallmon_latency_bucket_upper_ns(Int32(index - 1)), "\(value) ns below bucket \(index)")
            }
        }
    }

    @Test func bucketsAreAQuarterOctaveWideFromOneMicrosecondUpAndTheLastIsOpen() {
        #expect(stallmon_latency_bucket(1023) == 0)
        #expect(stallmon_latency_bucket(1024) == 1)
        #expect(stallmon_latency_bucket_upper_ns(0) == 1024)
        #expect(stallmon_latency_bucket_upper_ns(1) == 1280)
        #expect(stallmon_latency_bucket_upper_ns(4) == 2048)
        for index in 1..<Int32(STALLMON_LATENCY_BUCKETS) - 1 {
            let lower = Double(stallmon_latency_bucket_upper_ns(index - 1))
            let upper = Double(stallmon_latency_bucket_upper_ns(index))
            #expect(upper > lower && upper <= lower * 1.25 + 1, "bucket \(index): \(lower)…\(upper)")
        }
        let last = Int32(STALLMON_LATENCY_BUCKETS) - 1
        #expect(stallmon_latency_bucket(UInt64(1) << 40) == last)
        #expect(stallmon_latency_bucket_upper_ns(last) == .max)
        #expect(LoopLatency.upperBound(Int(last)) == nil)
    }

    @Test func quantilesAreTheUpperBoundOfTheBucketThatHoldsThem() throws {
        let histogram = try #require(stallmon_latency_create())
        defer { stallmon_latency_free(histogram) }
        for _ in 0..<98 { stallmon_latency_record(histogram, 5_000) }  // 5 µs: bucket 4.096…5.12 µs
        stallmon_latency_record(histogram, 2_000_000)  // 2 ms: 1.835…2.097 ms
        stallmon_latency_record(histogram, 100_000_000)  // 100 ms: 88.1…100.7 ms
        var counts = [UInt64](repeating: 0, count: Int(STALLMON_LATENCY_BUCKETS))
        let sum = counts.withUnsafeMutableBufferPointer { stallmon_latency_read(histogram, $0.baseAddress) }
        let latency = LoopLatency(loop: "test", counts: counts, sum: sum)
        #expect(latency.count == 100)
        #expect(latency.total == .nanoseconds(98 * 5_000 + 2_000_000 + 100_000_000))
        #expect(latency.buckets.map(\.count) == [98, 1, 1])
        #expect(latency.quantile(0.5) == .nanoseconds(5_120))
        #expect(latency.quantile(0.98) == .nanoseconds(5_120))
        #expect(latency.quantile(0.99) == .nanoseconds(2_097_152))
        #expect(latency.quantile(1) == .nanoseconds(100_663_296))
        #expect(LoopLatency(loop: "empty", counts: [], sum: 0).quantile(0.5) == nil)
    }

    @Test func exportsHandTheBackendOnlyTheWindowsSinceThePreviousExport() throws {
        let histogram = try #require(stallmon_latency_create())
        defer { stallmon_latency_free(histogram) }
        let metrics = TestMetrics()
        let exporter = LoopLatencyExporter(loop: "worker", histogram: histogram, factory: metrics)
        for _ in 0..<9 { stallmon_latency_record(histogram, 10_000) }
        stallmon_latency_record(histogram, 40_000_000)
        exporter.export()

        let windows = try metrics.expectCounter("stallmon_loop_windows_total", [("loop", "worker")])
        func gauge(_ quantile: String) throws -> TestRecorder {
            try metrics.expectGauge("stallmon_loop_window_seconds", [("loop", "worker"), ("quantile", quantile)])
        }
        #expect(windows.totalValue == 10)
        #expect(try gauge("0.5").lastValue == 10_240e-9)
        #expect(try gauge("0.9").lastValue == 10_240e-9)
        #expect(try gauge("1").lastValue == 41_943_040e-9)

        // Only the new windows count: one of 3 ms, so every quantile is its bucket.
        stallmon_latency_record(histogram, 3_000_000)
        exporter.export()
        #expect(windows.totalValue == 11)
        #expect(try gauge("0.5").lastValue == 3_145_728e-9)
        #expect(try gauge("1").lastValue == 3_145_728e-9)

        // No window since: nothing changes.
        exporter.export()
        #expect(windows.values.count == 2)
        #expect(try gauge("1").values.count == 2)
        // A snapshot counts from the start.
        #expect(exporter.snapshot().count == 11)
    }

    @Test func anExportIsDueOnceASecond() throws {
        let histogram = try #require(stallmon_latency_create())
        defer { stallmon_latency_free(histogram) }
        let metrics = TestMetrics()
        let exporter = LoopLatencyExporter(loop: "worker", histogram: histogram, factory: metrics)
        let start = stallmon_now_ns()
        stallmon_latency_record(histogram, 10_000)
        exporter.exportIfDue(now: start + 500_000_000)
        #expect(metrics.counterTotal(label: "stallmon_loop_windows_total") == 0)
        exporter.exportIfDue(now: start + 1_100_000_000)
        #expect(metrics.counterTotal(label: "stallmon_loop_windows_total") == 1)
    }
}

extension Serial {
    /// Real stalls of a run loop in the test process, reported into swift-metrics' TestMetrics.
    @Suite
    struct StallMetricsTests {
        @Test func stallsBecomeACounterAndATimerByLoopAndCalloutAndSuppressionsAreCounted() throws {
            var configuration = StallMonitor.Configuration()
            configuration.threshold = .milliseconds(50)
            configuration.sampleInterval = .milliseconds(10)
            configuration.rateLimit = .init(burst: 1, interval: .seconds(60))
            let metrics = TestMetrics()
            let sink = CollectingSink()
            let loop = try MonitoredLoopThread(configuration: configuration, sinks: [sink], factory: metrics)
            // The same stall twice, in two windows: the second is over the rate limit. Blocked in
            // usleep, every sample shows the same stack, so both have the same fingerprint.
            for _ in 0..<2 { loop.performAndWait { usleep(150_000) } }
            let counted = waitUntil { metrics.counterTotal(label: "stallmon_stalls_total") >= 2 }
            loop.stop()

            #expect(counted)
            let ended = try #require(
                sink.events.compactMap { $0.kind == .stallEnded ? $0.report : nil }.first)
            let dimensions = [("loop", ended.loop), ("callout", ended.callout.rawValue)]
            #expect(try metrics.expectCounter("stallmon_stalls_total", dimensions).totalValue == 2)
            let durations = try metrics.expectTimer("stallmon_stall_duration_seconds", dimensions).values
            #expect(durations.count == 2)
            #expect(durations.allSatisfy { $0 >= 140_000_000 && $0 < 5_000_000_000 }, "\(durations) ns")
            #expect(durations.contains(Int64(ended.duration.nanoseconds)))
            let suppressed = try metrics.expectCounter("stallmon_suppressed_reports_total", [("loop", ended.loop)])
            #expect(suppressed.totalValue == 1)
            #expect(suppressed.totalValue == Int64(loop.monitor.statistics.suppressedReports))
        }

        @Test func droppedAndLostReportsAreCountedAsTheStatisticsCountThem() throws {
            var configuration = StallMonitor.Configuration()
            configuration.threshold = .milliseconds(50)
            configuration.sampleInterval = .milliseconds(10)
            configuration.reportQueueCapacity = 1
            let metrics = TestMetrics()
            let sink = StuckFailingSink()
            let loop = try MonitoredLoopThread(configuration: configuration, sinks: [sink], factory: metrics)
            // The sink holds its own queue (of one) in the `started` event: its later events push
            // each other out, while the reporting thread goes on.
            for _ in 0..<3 { loop.performAndWait { Burn.cpu(milliseconds: 80) } }
            let stalled = waitUntil { loop.monitor.statistics.droppedReports >= 2 }
            sink.release()
            // The sink fails `started` and then the one report its queue kept; stopped only then,
            // or `stopped` could push that report out of the queue (dropped, not lost) first.
            let drained = waitUntil { loop.monitor.statistics.lostReports >= 2 }
            loop.stop()

            #expect(stalled)
            #expect(drained)
            let loopName = try #require(metrics.counters(label: "stallmon_lost_reports_total").first?.dimensions)
            let statistics = loop.monitor.statistics
            let lost = try metrics.expectCounter("stallmon_lost_reports_total", loopName)
            // Dropped at the report queue (`sink` "all") or at the sink's own: together, the statistics.
            #expect(metrics.counterTotal(label: "stallmon_dropped_reports_total") == Int64(statistics.droppedReports))
            let droppedBySink = try metrics.expectCounter(
                "stallmon_dropped_reports_total", loopName + [("sink", "StuckFailingSink")])
            #expect(droppedBySink.totalValue >= 2)
            #expect(statistics.droppedReports >= 2)
            // Every event the sink got failed: started, the reports that were not dropped, stopped.
            #expect(lost.totalValue == Int64(statistics.lostReports))
            #expect(statistics.lostReports >= 3)
        }

        @Test func loopLatencyCountsEveryWindowOnTheLoopThread() throws {
            var configuration = StallMonitor.Configuration()
            configuration.loopLatency = true
            let metrics = TestMetrics()
            let loop = try MonitoredLoopThread(configuration: configuration, sinks: [], factory: metrics)
            for _ in 0..<20 { loop.performAndWait { Burn.cpu(milliseconds: 1) } }
            loop.performAndWait { Burn.cpu(milliseconds: 30) }
            let seen = waitUntil { (loop.monitor.loopLatency?.quantile(1) ?? .zero) >= .milliseconds(30) }
            let latency = try #require(loop.monitor.loopLatency)
            loop.stop()

            #expect(seen)
            #expect(latency.count >= 21)
            #expect(latency.total >= .milliseconds(50))
            #expect(latency.buckets.contains { ($0.upperBound ?? .zero) > .milliseconds(30) && $0.count >= 1 })
            // stop() exports what the watchdog had not: every window reaches the backend.
            let windows = try metrics.expectCounter("stallmon_loop_windows_total", [("loop", latency.loop)])
            #expect(windows.totalValue >= Int64(latency.count))
            let longest = try metrics.expectGauge(
                "stallmon_loop_window_seconds", [("loop", latency.loop), ("quantile", "1")])
            #expect(longest.values.contains { $0 >= 0.030 })
            #expect(loop.monitor.loopLatency == nil)
        }

        @Test func withoutLoopLatencyNoHistogramIsKept() throws {
            let metrics = TestMetrics()
            let loop = try MonitoredLoopThread(
                configuration: StallMonitor.Configuration(), sinks: [], factory: metrics)
            for _ in 0..<5 { loop.performAndWait { Burn.cpu(milliseconds: 1) } }
            #expect(loop.monitor.loopLatency == nil)
            loop.stop()
            #expect(metrics.counters(label: "stallmon_loop_windows_total").isEmpty)
            #expect(metrics.recorders(label: "stallmon_loop_window_seconds").isEmpty)
        }

    }
}

/// A thread that runs its own run loop, monitored with `start(.currentThread)` from that thread.
private final class MonitoredLoopThread: @unchecked Sendable {
    let monitor: StallMonitor
    private let runLoop = Mutex<CFRunLoop?>(nil)
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    init(configuration: StallMonitor.Configuration, sinks: [any ReportSink], factory: TestMetrics) throws {
        monitor = try StallMonitor(configuration: configuration, sinks: sinks, metricsFactory: factory)
        let started = DispatchSemaphore(value: 0)
        let failure = Mutex<(any Error)?>(nil)
        let thread = Thread { [self] in
            stallmon_set_thread_name("metrics-loop")
            do {
                try monitor.start(.currentThread)
            } catch {
                failure.withLock { $0 = error }
            }
            runLoop.withLock { $0 = CFRunLoopGetCurrent() }
            started.signal()
            // A mode with no source or timer (observers do not count) does not wait: the loop
            // would spin a core. The timer lets it sleep until a block or the deadline.
            let timer = Timer(timeInterval: 3600, repeats: true) { _ in }
            RunLoop.current.add(timer, forMode: .default)
            while !stopping.load(ordering: .acquiring) {
                _ = RunLoop.current.run(mode: .default, before: Date() + 0.05)
            }
            timer.invalidate()
            // Stopped on its own thread: the loop state is released here at once.
            monitor.stop()
            finished.signal()
        }
        thread.start()
        started.wait()
        if let error = failure.withLock({ $0 }) { throw error }
    }

    /// Runs `body` in a callout of the loop.
    func perform(_ body: @escaping @Sendable () -> Void) {
        guard let runLoop = runLoop.withLock({ $0 }) else { return }
        CFRunLoopPerformBlock(runLoop, kCFRunLoopDefaultMode, body)
        CFRunLoopWakeUp(runLoop)
    }

    /// Runs `body` in a callout of the loop and waits until it returned: the next one runs in a
    /// window of its own.
    func performAndWait(_ body: @escaping @Sendable () -> Void) {
        let done = DispatchSemaphore(value: 0)
        perform {
            body()
            done.signal()
        }
        done.wait()
    }

    func stop() {
        stopping.store(true, ordering: .releasing)
        perform {}
        finished.wait()
    }
}

/// A sink that holds its queue in its first event until released, and fails every event.
private final class StuckFailingSink: ReportSink, @unchecked Sendable {
    private let released = DispatchSemaphore(value: 0)
    private let first = Atomic<Bool>(true)

    struct Failure: Error {}

    func emit(_ event: StallMonitorEvent) throws {
        if first.exchange(false, ordering: .relaxed) { released.wait() }
        throw Failure()
    }

    func release() { released.signal() }
}
