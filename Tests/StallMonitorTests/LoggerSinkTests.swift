import InMemoryLogging
import Logging
import StallJournal
import Synchronization
import Testing

@testable import StallMonitor

/// The swift-log route carries the whole report: every journal field as metadata under stable
/// names, and a traced stall's trace as the current trace context of the log call.
struct LoggerSinkTests {
    static func logged(_ event: StallMonitorEvent, traceContext: TraceContextBinding.Bind? = nil) -> [InMemoryLogHandler
        .Entry]
    {
        var handler = InMemoryLogHandler()
        handler.logLevel = .trace
        let logger = Logger(label: "stalls") { [handler] _ in handler }
        LoggerSink(logger: logger, traceContext: traceContext).emit(event)
        return handler.entries
    }

    @Test func aStallCarriesEveryJournalFieldUnderItsName() throws {
        let report = JSONLineTests.traced(Reports.report())
        let event = StallMonitorEvent.stallEnded(report)
        let entry = try #require(Self.logged(event).first)
        let metadata = entry.metadata.mapValues(\.description)
        #expect(entry.level == .warning)
        #expect(entry.message.description == report.message)
        #expect(metadata["stall.loop"] == "main")
        #expect(metadata["stall.frame"] == "Service.refresh() (Service.swift:42)")
        #expect(metadata["stall.thread_state"] == "R")
        #expect(metadata["stall.cpu_ms"] == "300.000")
        #expect(metadata["stall.duration_ms"] == "312.000")
        #expect(metadata["stall.threshold_ms"] == "250.000")
        #expect(metadata["stall.callout"] == "timer")
        #expect(metadata["stall.id"] == report.stallID)
        #expect(metadata["thread.id"] == "42")
        #expect(metadata["http.request.method"] == "GET")
        #expect(metadata["http.route"] == "/users/:id")
        #expect(metadata["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(metadata["span_id"] == "00f067aa0ba902b7")
        #expect(metadata["stall.backtrace"]?.contains("Service.refresh()") == true)
        // Every field but the message, its priority (the level) and the identifier (the backend's).
        let fields = JournalSink.fields(for: event, syslogIdentifier: "svc")
            .filter { !["MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER"].contains($0.name) }
        #expect(Set(metadata.keys) == Set(fields.map { LoggerSink.metadataKey(for: $0.name) }))
        #expect(metadata.count == fields.count)
    }

    @Test func aGRPCStallNamesItsRPCMethod() throws {
        var report = Reports.report()
        report.request = StallRecord.Request(rpcMethod: "stallmon.examples.Stalls/Cpu")
        let entry = try #require(Self.logged(.stallDetected(report)).first)
        #expect(entry.metadata["rpc.method"]?.description == "stallmon.examples.Stalls/Cpu")
        #expect(entry.metadata["trace_id"] == nil)
    }

    @Test func levelsFollowTheJournalsPriorities() throws {
        #expect(Self.logged(.watchdogStall(Reports.report(event: .watchdog))).first?.level == .critical)
        var long = Reports.report()
        long.duration = long.threshold * 8
        #expect(Self.logged(.stallEnded(long)).first?.level == .error)
        let started = MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: 60)
        let entry = try #require(Self.logged(.started(started)).first)
        #expect(entry.level == .debug)
        #expect(entry.metadata["stallmon.event"]?.description == "started")
        let stopped = Self.logged(.stopped(started, .init(stalls: 2, suppressedReports: 1, droppedReports: 0)))
        #expect(stopped.first?.metadata["stallmon.stalls"]?.description == "2")
    }

    /// The log call runs inside the trace context binding, handed the stall's W3C `traceparent`;
    /// a stall without a trace is logged without one.
    @Test func aTracedStallIsLoggedWithItsTraceAsTheCurrentContext() throws {
        let bound = Mutex<[String]>([])
        let handlerSawBinding = Mutex<[Bool]>([])
        var handler = InMemoryLogHandler()
        handler.logLevel = .trace
        let logger = Logger(label: "stalls") { [handler] _ in handler }
        let sink = LoggerSink(logger: logger) { [handler] traceparent, body in
            bound.withLock { $0.append(traceparent) }
            body()
            handlerSawBinding.withLock { $0.append(handler.entries.count == 1) }
        }
        sink.emit(.stallEnded(JSONLineTests.traced(Reports.report())))
        #expect(bound.withLock { $0 } == ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
        #expect(handlerSawBinding.withLock { $0 } == [true], "the record was not logged inside the binding")
        sink.emit(.stallEnded(Reports.report()))
        #expect(bound.withLock { $0.count } == 1)
        #expect(handler.entries.count == 2)
    }
}
