import Instrumentation
import ServiceContextModule
import StallMonitor

/// The trace context of a stall's log record: a ``LoggerSink`` logs a stall inside a traced request
/// with the request's trace as the current one, built by the bootstrapped instrument (this tracer,
/// and through it the one it wraps) from the report's IDs as a W3C `traceparent`. A logging
/// backend that reads the current trace context, as swift-otel's does, then links the record to
/// the span the stall happened in.
enum LogTraceContext {
    /// Installed by every tracer made; the instrument is read at each log call, so the one
    /// bootstrapped then is the one that extracts.
    static func install() {
        TraceContextBinding.install(binding { InstrumentationSystem.instrument })
    }

    /// Runs the log call in a context that `instrument` extracted from the `traceparent`.
    static func binding(_ instrument: @escaping @Sendable () -> any Instrument) -> TraceContextBinding.Bind {
        { traceparent, body in
            var context = ServiceContext.topLevel
            instrument().extract([TraceParent.header: traceparent], into: &context, using: DictionaryExtractor())
            ServiceContext.withValue(context) { body() }
        }
    }

    /// Reads a header from a dictionary.
    struct DictionaryExtractor: Extractor {
        func extract(key: String, from carrier: [String: String]) -> String? {
            carrier[key]
        }
    }
}
