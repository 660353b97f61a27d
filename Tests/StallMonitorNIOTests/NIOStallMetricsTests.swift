import MetricsTestKit
import NIOCore
import NIOPosix
import StallMonitor
import StallMonitorNIO
import StallmonFixtureKit
import StallmonTestSupport
import Testing

extension Serial {
    /// The same metrics from a SwiftNIO group's loops, in the test process.
    @Suite
    struct NIOStallMetricsTests {
        @Test func eventLoopStallsAndTickDurationsBecomeMetricsByLoop() throws {
            var configuration = StallMonitor.Configuration()
            configuration.threshold = .milliseconds(50)
            configuration.sampleInterval = .milliseconds(10)
            configuration.loopLatency = true
            let metrics = TestMetrics()
            let monitor = try NIOStallMonitor(configuration: configuration, sinks: [], metricsFactory: metrics)
            let group = try monitor.makeEventLoopGroup(numberOfThreads: 1)
            let loop = group.next()
            for _ in 0..<10 {
                try loop.submit { Burn.cpu(milliseconds: 2) }.wait()
            }
            try loop.submit { Burn.cpu(milliseconds: 120) }.wait()
            let counted = waitUntil { metrics.counterTotal(label: "stallmon_stalls_total") >= 1 }
            let latency = try #require(monitor.loopLatency.first)
            monitor.stop()
            try group.syncShutdownGracefully()

            #expect(counted)
            #expect(monitor.loopLatency.isEmpty)
            let stalls = try #require(metrics.counters(label: "stallmon_stalls_total").first)
            #expect(stalls.dimensions.first { $0.0 == "loop" }?.1 == latency.loop)
            #expect(latency.loop.hasPrefix("NIO-ELT-"))
            #expect(stalls.totalValue == 1)
            let duration = try #require(metrics.timers(label: "stallmon_stall_duration_seconds").first?.values.first)
            #expect(duration >= 110_000_000)
            // Ticks: the eleven tasks' 140 ms (a tick may run several of them), one tick over 120 ms.
            #expect(latency.count >= 1)
            #expect(latency.total >= .milliseconds(135))
            #expect((latency.quantile(1) ?? .zero) >= .milliseconds(120))
            let windows = try metrics.expectCounter("stallmon_loop_windows_total", [("loop", latency.loop)])
            #expect(windows.totalValue >= Int64(latency.count))
        }
    }
}
