import Synchronization
import Tracing

// The tracer that `span_wrapped_cost_ns` wraps, in a module of its own, as a service's tracer
// (swift-otel's) is: the code that `StallmonTracer(wrapping:)` specializes for it calls it across
// the module, as it calls swift-otel's, and does not inline it.

/// A tracer that records as swift-otel's does, for the cost of wrapping one: its span is a class
/// that keeps its name, attributes, events, links and status under a lock, and the tracer counts the
/// spans that end (swift-otel hands them to its processor).
package struct RecordingTracer: Tracer {
    package let ended = Ended()

    package init() {}

    /// The spans of a tracer (and its copies) that have ended.
    package final class Ended: Sendable {
        let count = Atomic<Int>(0)

        package var spans: Int { count.load(ordering: .relaxed) }
    }

    package func startSpan<Instant: TracerInstant>(
        _ operationName: String, context: @autoclosure () -> InstrumentationContext, ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant, function: String, file fileID: String, line: UInt
    ) -> RecordingSpan {
        RecordingSpan(operationName: operationName, context: context(), kind: kind, start: instant(), ended: ended)
    }

    package func forceFlush() {}

    package func extract<Carrier, Extract: Extractor>(
        _ carrier: Carrier, into context: inout InstrumentationContext, using extractor: Extract
    ) where Extract.Carrier == Carrier {}

    package func inject<Carrier, Inject: Injector>(
        _ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject
    ) where Inject.Carrier == Carrier {}
}

package final class RecordingSpan: Tracing.Span, @unchecked Sendable {
    struct State {
        var operationName: String
        var attributes: SpanAttributes = [:]
        var events: [SpanEvent] = []
        var links: [SpanLink] = []
        var status: SpanStatus?
        var end: UInt64?
    }

    package let context: InstrumentationContext
    let kind: SpanKind
    let start: UInt64
    private let ended: RecordingTracer.Ended
    private let state: Mutex<State>

    init(
        operationName: String, context: InstrumentationContext, kind: SpanKind, start: some TracerInstant,
        ended: RecordingTracer.Ended
    ) {
        self.context = context
        self.kind = kind
        self.start = start.nanosecondsSinceEpoch
        self.ended = ended
        self.state = Mutex(State(operationName: operationName))
    }

    package var operationName: String {
        get { state.withLock { $0.operationName } }
        set { state.withLock { $0.operationName = newValue } }
    }

    package var attributes: SpanAttributes {
        get { state.withLock { $0.attributes } }
        set { state.withLock { $0.attributes = newValue } }
    }

    package var isRecording: Bool { state.withLock { $0.end == nil } }

    package func setStatus(_ status: SpanStatus) { state.withLock { $0.status = status } }

    package func addEvent(_ event: SpanEvent) { state.withLock { $0.events.append(event) } }

    package func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {
        addEvent(SpanEvent(name: "exception", at: instant(), attributes: attributes))
    }

    package func addLink(_ link: SpanLink) { state.withLock { $0.links.append(link) } }

    package func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        let end = instant().nanosecondsSinceEpoch
        state.withLock { $0.end = end }
        ended.count.add(1, ordering: .relaxed)
    }
}

/// A recording tracer as swift-otel's `OTel.makeTracingBackend()` hands out its tracer: of an
/// opaque type, which the service wraps as it is; and the count of its spans that ended.
package func makeRecordingTracer() -> (factory: some Tracer, ended: RecordingTracer.Ended) {
    let tracer = RecordingTracer()
    return (tracer, tracer.ended)
}
