import InMemoryLogging
import Logging
import NIOCore
import NIOPosix
import StallMonitor
import StallMonitorNIO
import StallmonTestSupport
import Testing

/// swift-log's levels for libraries, as for a run loop's monitor (`MonitorLogLevelTests`): an event
/// loop group's monitor logs its normal start and stop at debug.
extension Serial {
    @Suite
    struct NIOMonitorLogLevelTests {
        @Test func anEventLoopMonitorLogsStartAndStopAtDebug() throws {
            var handler = InMemoryLogHandler()
            handler.logLevel = .trace
            let logger = Logger(label: "test") { _ in handler }
            let monitor = try NIOStallMonitor(configuration: StallMonitor.Configuration(), logger: logger, sinks: [])
            let group = try monitor.makeEventLoopGroup(numberOfThreads: 2)
            monitor.stop()
            try group.syncShutdownGracefully()
            let lifecycle = handler.entries.filter { $0.message.description.hasPrefix("stallmon st") }
            #expect(lifecycle.map(\.message.description) == ["stallmon started", "stallmon stopped"])
            #expect(lifecycle.allSatisfy { $0.level == .debug })
        }
    }
}
