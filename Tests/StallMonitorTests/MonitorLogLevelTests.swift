import Foundation
import InMemoryLogging
import Logging
import StallMonitor
import StallmonTestSupport
import Testing

/// swift-log's levels for libraries: a monitor's normal start and stop at debug, what an operator
/// must fix at warning, on the logger the caller gave (or the task-local one), never one of its own.
extension Serial {
    @Suite
    struct MonitorLogLevelTests {
        @Test func startAndStopAreLoggedAtDebugAndNothingAtInfoOrAbove() throws {
            var handler = InMemoryLogHandler()
            handler.logLevel = .trace
            let logger = Logger(label: "test") { _ in handler }
            let monitor = try StallMonitor(configuration: StallMonitor.Configuration(), logger: logger, sinks: [])
            let loop = LoopThread { try? monitor.start(.currentThread) }
            loop.perform {}
            monitor.stop()
            loop.stop()
            let started = handler.entries.filter { $0.message.description == "stallmon started" }
            let stopped = handler.entries.filter { $0.message.description == "stallmon stopped" }
            #expect(started.map(\.level) == [.debug])
            #expect(stopped.map(\.level) == [.debug])
            #expect(handler.entries.filter { $0.level >= .info }.isEmpty, "\(handler.entries)")
        }

        /// Silence must mean health: a loop the monitor cannot see reaches the caller's logger as a
        /// warning, which an operator's usual level shows.
        @Test func aLoopThatNeverTurnsIsAWarningOnTheCallersLogger() throws {
            let handler = InMemoryLogHandler()  // at .info, as most services run
            let logger = Logger(label: "test") { _ in handler }
            var configuration = StallMonitor.Configuration()
            configuration.loopStartTimeout = .milliseconds(100)
            let monitor = try StallMonitor(configuration: configuration, logger: logger, sinks: [])
            let loop = LoopThread(turning: false) { try? monitor.start(.currentThread) }
            let deadline = ContinuousClock.now + .seconds(5)
            while !handler.entries.contains(where: { $0.level >= .warning }), ContinuousClock.now < deadline {
                usleep(10_000)
            }
            monitor.stop()
            loop.stop()
            let warnings = handler.entries.filter { $0.level >= .warning }
            #expect(warnings.map(\.level) == [.warning], "\(handler.entries)")
            #expect(warnings.first?.message.description.contains("stallmon cannot see the") == true)
            #expect(handler.entries.allSatisfy { $0.level >= .warning }, "nothing below warning at .info")
        }

        @Test func withoutALoggerTheMonitorLogsToTheTaskLocalOne() throws {
            let handler = InMemoryLogHandler()
            var configuration = StallMonitor.Configuration()
            configuration.loopStartTimeout = .milliseconds(100)
            let monitor = try withLogger(handler: handler) { _ in
                try StallMonitor(configuration: configuration, sinks: [])
            }
            let loop = LoopThread(turning: false) { try? monitor.start(.currentThread) }
            let deadline = ContinuousClock.now + .seconds(5)
            while handler.entries.isEmpty, ContinuousClock.now < deadline { usleep(10_000) }
            monitor.stop()
            loop.stop()
            #expect(handler.entries.first?.level == .warning, "\(handler.entries)")
        }
    }
}
