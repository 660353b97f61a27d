import Instrumentation
import Logging
import ServiceContextModule
import StallJournal
import StallMonitor
import Synchronization
import Testing

@testable import StallMonitorTracing

/// A `LoggerSink` logs a traced stall with its trace as the current `ServiceContext`, extracted by
/// the instrument from a W3C `traceparent`: what swift-otel's log handler reads for the record's
/// trace and span IDs.
struct LogTraceContextTests {
    enum TraceParentKey: ServiceContextKey {
        typealias Value = String
    }

    /// Extracts `traceparent` as it is, under a key of its own (as swift-otel's propagator puts its
    /// span context under its own).
    struct RecordingInstrument: Instrument {
        func extract<Carrier, Extract>(
            _ carrier: Carrier, into context: inout ServiceContext, using extractor: Extract
        ) where Extract: Extractor, Extract.Carrier == Carrier {
            context[TraceParentKey.self] = extractor.extract(key: "traceparent", from: carrier)
        }

        func inject<Carrier, Inject>(
            _ context: ServiceContext, into carrier: inout Carrier, using injector: Inject
        ) where Inject: Injector, Inject.Carrier == Carrier {}
    }

    /// Keeps, for each record, the trace context current when it was logged.
    struct ContextRecordingHandler: LogHandler {
        let seen: Seen
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            seen.records.withLock { $0.append(ServiceContext.current?[TraceParentKey.self]) }
        }
    }

    final class Seen: Sendable {
        let records = Mutex<[String?]>([])
    }

    @Test func aTracedStallsRecordIsLoggedInsideItsTraceAndAnUntracedOneOutsideAny() {
        let seen = Seen()
        let logger = Logger(label: "stalls") { _ in ContextRecordingHandler(seen: seen) }
        let sink = LoggerSink(
            logger: logger, traceContext: LogTraceContext.binding { RecordingInstrument() })
        var report = StallReport(
            event: .ended, stallID: "0123456789abcdef0123456789abcdef", loop: "cooperative-pool", threadID: 42,
            duration: .milliseconds(312), threshold: .milliseconds(100), activity: .poolJob, runLoopMode: "",
            callout: .poolJob, threadState: "R", syscall: nil, waitChannel: nil, cpuTime: .milliseconds(300),
            samples: 15, unansweredSamples: 0, stackSamples: 14, stack: [], fingerprint: "00000000deadbeef",
            noStackReason: "no samples", startNanoseconds: 1, pausedTime: .zero)
        report.request = StallRecord.Request(
            method: "GET", route: "/cpu", traceID: "4bf92f3577b34da6a3ce929d0e0e4736", spanID: "00f067aa0ba902b7")
        sink.emit(.stallEnded(report))
        report.request = StallRecord.Request(method: "GET", route: "/cpu")
        sink.emit(.stallEnded(report))
        #expect(
            seen.records.withLock { $0 } == ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", nil])
    }
}
