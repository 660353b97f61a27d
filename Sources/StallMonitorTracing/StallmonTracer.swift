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
/// it hands every call to it, and reads the IDs from what that tracer injects.
///
/// Cost: one allocation and a few atomic operations per span. Nothing is added to the spans the
/// wrapped tracer exports but the `stall` events and the `stallmon.stalled` attribute of spans that
/// stalled.
public struct StallmonTracer<Wrapped: Tracer>: Tracer {
    public typealias Span = StallmonSpan<Wrapped.Span>

    let wrapped: Wrapped
    /// Whether the spans keep their attributes and IDs themselves: the wrapped tracer records none.
    let recordsItself: Bool

    /// A tracer that registers the spans of `wrapped` with stallmon and hands everything else to it.
    public init(wrapping wrapped: Wrapped) {
        self.wrapped = wrapped
        self.recordsItself = wrapped is NoOpTracer
    }

    public func startSpan<Instant: TracerInstant>(
        _ operationName: String,
        context: @autoclosure () -> InstrumentationContext,
        ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant,
        function: String,
        file fileID: String,
        line: UInt
    ) -> StallmonSpan<Wrapped.Span> {
        let parent = context()
        let inner = wrapped.startSpan(
            operationName, context: parent, ofKind: kind, at: instant(), function: function, file: fileID, line: line)
        return StallmonSpan(inner, operationName: operationName, parent: parent, tracer: self)
    }

    @available(*, deprecated)
    public func forceFlush() {
        wrapped.forceFlush()
    }

    public func extract<Carrier, Extract>(
        _ carrier: Carrier, into context: inout InstrumentationContext, using extractor: Extract
    ) where Extract: Extractor, Extract.Carrier == Carrier {
        wrapped.extract(carrier, into: &context, using: extractor)
        if recordsItself, let header = extractor.extract(key: TraceParent.header, from: carrier),
            let parent = TraceParent(header)
        {
            context.stallmonTrace = parent
        }
    }

    public func inject<Carrier, Inject>(
        _ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject
    ) where Inject: Injector, Inject.Carrier == Carrier {
        wrapped.inject(context, into: &carrier, using: injector)
        if recordsItself, let trace = context.stallmonTrace {
            injector.inject(trace.header, forKey: TraceParent.header, into: &carrier)
        }
    }
}

extension StallmonTracer where Wrapped == NoOpTracer {
    /// A tracer for a service without a tracing backend: its spans only tell stallmon their requests.
    public init() {
        self.init(wrapping: NoOpTracer())
    }
}
