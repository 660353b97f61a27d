import Logging
import NIOCore
import NIOPosix
import StallMonitor
import StallMonitorNIO
import StallmonTestSupport
import Testing

/// The errors of an event loop group's monitor (`StallMonitorError`, as `StallMonitorErrorTests`).
extension Serial {
    @Suite
    struct NIOStallMonitorErrorTests {
        @Test func anEventLoopGroupWithoutTheDelegateIsWatchedWithHeartbeats() throws {
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            defer { try? group.syncShutdownGracefully() }
            let monitor = try NIOStallMonitor(
                configuration: StallMonitor.Configuration(), logger: .quiet, sinks: [])
            try monitor.start(group)
            #expect(monitor.isRunning)
            monitor.stop()
        }

        @Test func startingAWatchedEventLoopGroupAgainThrowsAlreadyRunning() throws {
            let monitor = try NIOStallMonitor(
                configuration: StallMonitor.Configuration(), logger: .quiet, sinks: [])
            let group = try monitor.makeEventLoopGroup(numberOfThreads: 1)
            defer {
                monitor.stop()
                try? group.syncShutdownGracefully()
            }
            let error = #expect(throws: StallMonitorError.self) { try monitor.start(group) }
            #expect(error?.code == .alreadyRunning)
        }
    }
}
