import Logging
import NIOCore
import NIOPosix
import StallJournal
import StallMonitorNIO
import StallMonitorServiceLifecycle
import StallMonitorTestKit
import Synchronization
import Testing

@testable import StallMonitor

/// What a service that depends on the libraries gets on each platform. On Linux the monitor works
/// (the other test targets show how); elsewhere the API compiles and does nothing, and says so.
/// `PRETEND_NON_LINUX=1 swift test` runs the second half on Linux (see Package.swift).
@Suite struct PlatformSupportTests {
    @Test func monitorIsSupportedExactlyWhereTheLinuxImplementationIsBuilt() {
        #if STALLMON_LINUX
        #expect(StallMonitor.isSupported)
        #else
        #expect(!StallMonitor.isSupported)
        #endif
    }

    #if !STALLMON_LINUX
    @Test func startLogsOneDebugLineAndMonitorsNothing() throws {
        let log = LogRecorder()
        let sink = CollectingSink()
        let monitor = try StallMonitor(configuration: .init(), logger: log.logger, sinks: [sink])

        try monitor.start()
        try monitor.start(.currentThread)  // not "already running": nothing runs

        #expect(!monitor.isRunning)
        #expect(log.entries.count == 2)
        #expect(log.entries.allSatisfy { $0.level == .debug && $0.message.contains("unsupported on this platform") })
        #expect(monitor.allowingStall { 42 } == 42)
        #expect(monitor.status == "stall monitor not running: unsupported on this platform")
        #expect(monitor.watchdogThreadID == 0)
        #expect(!monitor.notifyReady())
        monitor.stop()
        #expect(monitor.statistics == StallMonitor.Statistics(stalls: 0, suppressedReports: 0, droppedReports: 0))
        #expect(sink.events.isEmpty)
        #expect(log.entries.count == 2)
    }

    @Test func eventLoopGroupRunsUnwatched() async throws {
        let log = LogRecorder()
        let monitor = try NIOStallMonitor(configuration: .init(), logger: log.logger, sinks: [CollectingSink()])
        let group = try monitor.makeEventLoopGroup(numberOfThreads: 1)
        #expect(try await group.next().submit { 7 }.get() == 7)
        #expect(!monitor.isRunning)
        #expect(log.entries.map(\.level) == [.debug])
        monitor.stop()
        try await group.shutdownGracefully()
    }

    @Test func serviceStartsNothingAndEndsWhenCancelled() async throws {
        let log = LogRecorder()
        let service = try StallMonitorService(StallMonitor(configuration: .init(), logger: log.logger, sinks: []))
        let run = Task { await service.run() }
        run.cancel()
        await run.value
        #expect(!service.monitor.isRunning)
        #expect(log.entries.map(\.level) == [.debug])
    }

    @Test func journalSinkHandsEveryEntryToItsFallback() throws {
        let fallback = CollectingSink()
        let sink = JournalSink(fallback: fallback)
        #expect(!sink.isAvailable)
        let description = MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: nil)
        try sink.emit(.started(description))
        #expect(fallback.events.count == 1)
        #expect(sink.failedEntries == 1)
        #expect(throws: SystemdError.self) { try JournalWriter().send([JournalField("MESSAGE", "hello")]) }
    }
    #endif
}

/// Keeps what a logger was given.
final class LogRecorder: Sendable {
    struct Entry: Sendable {
        var level: Logger.Level
        var message: String
    }

    private let recorded = Mutex<[Entry]>([])

    var entries: [Entry] { recorded.withLock { $0 } }

    var logger: Logger {
        Logger(label: "stallmon") { _ in Handler(recorder: self) }
    }

    private struct Handler: LogHandler {
        let recorder: LogRecorder
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            recorder.recorded.withLock { $0.append(Entry(level: event.level, message: "\(event.message)")) }
        }
    }
}
