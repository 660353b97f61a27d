import Instrumentation
import StallMonitor
import Tracing

/// A tracer that tells stallmon which request a thread serves: every span it starts is registered
/// under the task it starts in (or its thread, outside a task), so that a stall inside it is
/// reported with the span's operation, HTTP method and route (or path), gRPC method and W3C trace
/// and span IDs, and the span gets a `stall` event when it ends.
///
/// Wrap the service's tracer, or use it alone when the service exports no traces:
///
/// ```swift
/// InstrumentationSystem.bootstrap(StallmonTracer(wrapping: otelTracer))  // with swift-otel, say
/// InstrumentationSystem.bootstrap(StallmonTracer())                       // no tracing backend
/// ```
///
/// Alone, it keeps what a report needs and nothing else: it reads W3C `traceparent` headers,
/// makes trace and span IDs, and writes `traceparent` into outgoing requests. Wrapping a tracer,
/// it hands every call to it, and reads the IDs from what that tracer injects, only for a stall.
///
/// Cost: alone, a span in a task allocates nothing and takes two compare-and-swaps, and one lock a
/// set of attributes (`span_cost_ns` in stallmon-bench); outside a task, a span allocates one small
/// object. Wrapping, a span holds the wrapped tracer's span as it is when that is an object (as
/// swift-otel's are), and moves any other into one object.
/// Nothing is added to the spans the wrapped tracer exports but the `stall` events and the
/// `stallmon.stalled` attribute of spans that stalled. Not generic, so that the code that starts
/// spans through `any Tracer` (`InstrumentationSystem.tracer`) looks no type up at run time: the
/// wrapped tracer and its spans are called through closures made once, when the tracer is; those
/// that start spans are specialized for the tracer's type where the service wraps it
/// (``init(wrapping:)`` is inlinable).
public struct StallmonTracer: Tracer {
    public typealias Span = StallmonSpan

    /// The service's tracer; `nil` alone.
    let wrapped: (any Tracer)?
    /// The same, as its own type, made once and never freed: what starts the spans.
    let wrapping: Unmanaged<WrappingTracer>?

    /// A tracer for a service without a tracing backend: its spans only tell stallmon their requests.
    public init() {
        self.wrapped = nil
        self.wrapping = nil
        StallRequests.install(SpanTableReader())
        LogTraceContext.install()
    }

    /// A tracer that registers the spans of `wrapped` with stallmon and hands everything else to it.
    ///
    /// Inlinable, so that the code that calls `wrapped` and its spans is made where the service
    /// wraps its tracer, specialized for its type.
    @inlinable
    public init(wrapping wrapped: some Tracer) {
        self.init(wrapped, wrapping: WrappingTracer.make(wrapped))
    }

    @usableFromInline
    init(_ wrapped: some Tracer, wrapping: @autoclosure () -> Unmanaged<WrappingTracer>) {
        let recording = !(wrapped is NoOpTracer)
        self.wrapped = recording ? wrapped : nil
        self.wrapping = recording ? wrapping() : nil
        StallRequests.install(SpanTableReader())
        LogTraceContext.install()
    }

    public func startSpan<Instant: TracerInstant>(
        _ operationName: String,
        context: @autoclosure () -> InstrumentationContext,
        ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant,
        function: String,
        file fileID: String,
        line: UInt
    ) -> StallmonSpan {
        guard let wrapping else {
            return StallmonSpan(alone: operationName, context: context())
        }
        // The rest in code that is not generic (this is, unspecialized, when called through `any
        // Tracer`).
        return Self.start(
            operationName, context: context(), ofKind: kind, at: instant().timestamp, function: function, file: fileID,
            line: line, wrapping: wrapping)
    }

    private static func start(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Timestamp,
        function: String, file fileID: String, line: UInt, wrapping: Unmanaged<WrappingTracer>
    ) -> StallmonSpan {
        let span = wrapping._withUnsafeGuaranteedRef {
            $0.start(
                operationName, context: context, ofKind: kind, at: instant, function: function, file: fileID, line: line
            )
        }
        return StallmonSpan(wrapping: span, of: wrapping)
    }

    @available(*, deprecated)
    public func forceFlush() {
        wrapped?.forceFlush()
    }

    public func extract<Carrier, Extract>(
        _ carrier: Carrier, into context: inout InstrumentationContext, using extractor: Extract
    ) where Extract: Extractor, Extract.Carrier == Carrier {
        if let wrapped {
            wrapped.extract(carrier, into: &context, using: extractor)
        } else if let header = extractor.extract(key: TraceParent.header, from: carrier),
            let parent = TraceParent(header)
        {
            context.stallmonTrace = parent
        }
    }

    public func inject<Carrier, Inject>(
        _ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject
    ) where Inject: Injector, Inject.Carrier == Carrier {
        if let wrapped {
            wrapped.inject(context, into: &carrier, using: injector)
        } else if let trace = SpanTable.currentTrace() ?? context.stallmonTrace {
            // The span the calling task serves (a span's context does not carry it: see
            // StallmonSpan), else the trace context the request came with.
            injector.inject(trace.header, forKey: TraceParent.header, into: &carrier)
        }
    }
}
