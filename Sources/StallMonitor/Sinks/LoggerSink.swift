import Logging
import StallJournal
import Synchronization

/// Logs reports through a swift-log `Logger`, every field of the journal entry as metadata: stalls
/// as warnings (errors from eight times the threshold on, critical for a stall that outlasted the
/// service watchdog, as in the journal), summaries of suppressed reports as notices, the monitor's
/// start and stop at debug.
///
/// The names follow OpenTelemetry's semantic conventions where one exists (`thread.id`,
/// `http.request.method`, `http.route`, `url.path`, `rpc.method`, and `trace_id`, `span_id` as its
/// log data model names them outside OTLP); the others are the catalog's names in lower case with
/// `stall.` or `stallmon.` in front (`stall.loop`, `stall.frame`, `stall.thread_state`), and a
/// duration in milliseconds with three decimals (`stall.duration_ms`, `stall.cpu_ms`) where the
/// journal has microseconds. ``metadataKey(for:)`` gives each name. `MESSAGE` is the log message,
/// `PRIORITY` its level, `SYSLOG_IDENTIFIER` is left to the logging backend (its resource, its label).
///
/// A stall inside a traced request is logged with its trace as the current one: with `StallmonTracer`
/// bootstrapped (StallMonitorTracing), the report's trace and span IDs go through the tracer's own
/// `extract` into a `ServiceContext` bound around the log call, so that a backend that reads the
/// current trace context (swift-otel's, whose OTLP log record then carries `traceId` and `spanId`)
/// links the record to the span the stall happened in.
public struct LoggerSink: ReportSink {
    private let logger: Logger
    /// How the trace becomes the current one; `nil` for the one the tracer installed.
    private let traceContext: TraceContextBinding.Bind?

    public init(logger: Logger) {
        self.init(logger: logger, traceContext: nil)
    }

    package init(logger: Logger, traceContext: TraceContextBinding.Bind?) {
        self.logger = logger
        self.traceContext = traceContext
    }

    public func emit(_ event: StallMonitorEvent) {
        let fields = JournalSink.fields(for: event, syslogIdentifier: "")
        guard !fields.isEmpty else { return }
        var message = ""
        var priority = 4
        var metadata: Logger.Metadata = [:]
        metadata.reserveCapacity(fields.count)
        var traceID = ""
        var spanID = ""
        for field in fields {
            switch field.name {
            case "MESSAGE": message = field.value
            case "PRIORITY": priority = Int(field.value) ?? priority
            case "SYSLOG_IDENTIFIER": continue
            default:
                if field.name == StallRecord.Field.traceID { traceID = field.value }
                if field.name == StallRecord.Field.spanID { spanID = field.value }
                metadata[Self.metadataKey(for: field.name)] = .string(Self.metadataValue(field))
            }
        }
        let lifecycle = event.kind == .started || event.kind == .stopped
        let logLevel = lifecycle ? .debug : Self.level(priority: priority)
        let log = { logger.log(level: logLevel, "\(message)", metadata: metadata) }
        if !traceID.isEmpty, !spanID.isEmpty, let bind = traceContext ?? TraceContextBinding.current {
            bind("00-\(traceID)-\(spanID)-01", log)
        } else {
            log()
        }
    }

    /// The metadata name of a journal field: `STALL_LOOP` → `stall.loop`, `STALL_CPU_USEC` →
    /// `stall.cpu_ms`, `STALL_REQUEST_ROUTE` → `http.route`, `STALLMON_LOST` → `stallmon.lost`.
    public static func metadataKey(for field: String) -> String {
        if let name = conventionNames[field] { return name }
        var name = field.lowercased()
        if name.hasSuffix("_usec") { name = String(name.dropLast(5)) + "_ms" }
        if name.hasPrefix("stallmon_") { return "stallmon." + name.dropFirst(9) }
        if name.hasPrefix("stall_") { return "stall." + name.dropFirst(6) }
        return "stallmon." + name
    }

    /// The names of OpenTelemetry's semantic conventions, and what they stand for.
    private static let conventionNames: [String: String] = [
        StallRecord.Field.threadID: "thread.id",
        StallRecord.Field.requestMethod: "http.request.method",
        StallRecord.Field.requestRoute: "http.route",
        StallRecord.Field.requestPath: "url.path",
        StallRecord.Field.requestRPCMethod: "rpc.method",
        StallRecord.Field.traceID: "trace_id",
        StallRecord.Field.spanID: "span_id",
    ]

    /// A field's value as metadata: microseconds as milliseconds with three decimals, the rest as
    /// the journal holds it.
    private static func metadataValue(_ field: JournalField) -> String {
        guard field.name.hasSuffix("_USEC"), let microseconds = UInt64(field.value) else { return field.value }
        let fraction = String(microseconds % 1000)
        return "\(microseconds / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
    }

    /// syslog's priority as swift-log's level.
    private static func level(priority: Int) -> Logger.Level {
        switch priority {
        case ...2: .critical
        case 3: .error
        case 4: .warning
        case 5: .notice
        case 6: .info
        default: .debug
        }
    }
}

/// How a ``LoggerSink`` makes a stall's trace the current one around its log call: set by
/// StallMonitorTracing's tracer (the only source of trace IDs in reports), which binds a
/// `ServiceContext` built by the bootstrapped instrument's `extract` from a W3C `traceparent`.
package enum TraceContextBinding {
    /// Runs `body` with the trace of a `traceparent` header as the current trace context.
    package typealias Bind = @Sendable (_ traceparent: String, _ body: () -> Void) -> Void

    private static let installed = Mutex<Bind?>(nil)

    package static func install(_ bind: @escaping Bind) {
        installed.withLock { $0 = bind }
    }

    static var current: Bind? { installed.withLock { $0 } }
}
