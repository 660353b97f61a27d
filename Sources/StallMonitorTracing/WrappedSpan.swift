import Instrumentation
import Tracing

/// The service's tracer that a ``StallmonTracer`` wraps, made once per tracer and never freed
/// (spans name it unretained). Generic in a subclass (``WrappingTracerOf``), so that the tracer is
/// called as its own type and its spans are held as theirs, while ``StallmonTracer`` stays a type
/// that code holding `any Tracer` looks up nothing for.
class WrappingTracer: @unchecked Sendable {
    /// Starts a span of the wrapped tracer, held as its own type.
    func start<Instant: TracerInstant>(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Instant,
        function: String, file fileID: String, line: UInt
    ) -> WrappedSpan {
        fatalError("a subclass starts spans")
    }

    /// The W3C trace context the wrapped tracer writes for `context`, parsed.
    func traceParent(of context: InstrumentationContext) -> TraceParent? {
        fatalError("a subclass injects")
    }

    static func make(_ tracer: some Tracer) -> Unmanaged<WrappingTracer> {
        Unmanaged.passRetained(WrappingTracerOf(tracer))
    }
}

final class WrappingTracerOf<Wrapped: Tracer>: WrappingTracer, @unchecked Sendable {
    private let tracer: Wrapped
    /// The spans' type, looked up once: an instance is made from it without a metadata lookup.
    private let spanType: WrappedSpanOf<Wrapped.Span>.Type

    init(_ tracer: Wrapped) {
        self.tracer = tracer
        self.spanType = WrappedSpanOf<Wrapped.Span>.self
    }

    override func start<Instant: TracerInstant>(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Instant,
        function: String, file fileID: String, line: UInt
    ) -> WrappedSpan {
        // Moved into the object that holds it, not copied: a struct span's copy retains each of its
        // parts.
        spanType.init(
            tracer.startSpan(
                operationName, context: context, ofKind: kind, at: instant, function: function, file: fileID,
                line: line),
            tracer: Unmanaged.passUnretained(self))
    }

    override func traceParent(of context: InstrumentationContext) -> TraceParent? {
        var headers: [String: String] = [:]
        tracer.inject(context, into: &headers, using: HeaderInjector())
        return headers[TraceParent.header].flatMap { TraceParent($0) }
    }
}

/// The wrapped tracer's span of a ``StallmonSpan``. Generic in a subclass (``WrappedSpanOf``),
/// which holds the span as its own type: a span that is a struct is stored in this one allocation,
/// where an `any Span` would box it.
class WrappedSpan: SpanKeeper, @unchecked Sendable {
    /// The tracer that started it: what says its W3C IDs.
    let tracer: Unmanaged<WrappingTracer>

    init(tracer: Unmanaged<WrappingTracer>) {
        self.tracer = tracer
    }

    var context: InstrumentationContext { fatalError("abstract") }
    var operationName: String {
        get { fatalError("abstract") }
        set { fatalError("abstract") }
    }
    var attributes: SpanAttributes {
        get { fatalError("abstract") }
        set { fatalError("abstract") }
    }
    var isRecording: Bool { fatalError("abstract") }
    func setStatus(_ status: SpanStatus) { fatalError("abstract") }
    func addEvent(_ event: SpanEvent) { fatalError("abstract") }
    func recordError<Instant: TracerInstant>(_ error: any Error, attributes: SpanAttributes, at instant: Instant) {
        fatalError("abstract")
    }
    func addLink(_ link: SpanLink) { fatalError("abstract") }
    func end<Instant: TracerInstant>(at instant: Instant) { fatalError("abstract") }
}

final class WrappedSpanOf<Inner: Tracing.Span>: WrappedSpan, @unchecked Sendable {
    private let span: Inner

    required init(_ span: consuming Inner, tracer: Unmanaged<WrappingTracer>) {
        self.span = span
        super.init(tracer: tracer)
    }

    override var context: InstrumentationContext { span.context }
    override var operationName: String {
        get { span.operationName }
        set { span.operationName = newValue }
    }
    override var attributes: SpanAttributes {
        get { span.attributes }
        set { span.attributes = newValue }
    }
    override var isRecording: Bool { span.isRecording }
    override func setStatus(_ status: SpanStatus) { span.setStatus(status) }
    override func addEvent(_ event: SpanEvent) { span.addEvent(event) }
    override func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: Instant
    ) {
        span.recordError(error, attributes: attributes, at: instant)
    }
    override func addLink(_ link: SpanLink) { span.addLink(link) }
    override func end<Instant: TracerInstant>(at instant: Instant) { span.end(at: instant) }
}

/// Collects what a tracer injects into an outgoing request's headers.
private struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key.lowercased()] = value
    }
}
