import Instrumentation
import StallMonitor
import Synchronization
import Tracing

/// A span of ``StallmonTracer``: the wrapped tracer's span, registered with stallmon while it runs.
/// Everything a span does is handed to the wrapped one; when it ends, every stall that happened
/// inside it becomes a `stall` event on it, and its `stallmon.stalled` attribute is set.
///
/// Alone (``StallmonTracer/init()``), a span keeps its name and its attributes for a report, and
/// its context is the one it started in: inserting into a context would cost more than all the rest
/// of a span.
public struct StallmonSpan: Tracing.Span {
    /// Everything of the span, so that a copy of it costs one retain.
    let state: RequestState

    init(alone operationName: String, context: @autoclosure () -> InstrumentationContext) {
        // A child of the span its task serves, unless the context it is given carries another
        // trace (a message's, or a request's read from its header): then of that.
        let context = context()
        let given = context.stallmonState
        var around = RequestTable.current()
        if let given, let local = around, local.trace?.traceID != given.trace?.traceID { around = nil }
        state = RequestState(
            ownOperation: operationName, trace: TraceParent.child(of: around?.trace ?? given?.trace), parent: around,
            context: context)
        state.register()
    }

    init(wrapping inner: any Tracing.Span, injector: InjectorBox) {
        state = RequestState(inner: inner, injector: injector, parent: RequestTable.current())
        state.register()
    }

    public var context: InstrumentationContext { state.inner?.context ?? state.startContext ?? .topLevel }

    public var operationName: String {
        get { state.inner?.operationName ?? state.mutable.withLock { $0.operationName } }
        nonmutating set {
            if let inner = state.inner {
                inner.operationName = newValue
            } else {
                state.mutable.withLock { $0.operationName = newValue }
            }
        }
    }

    public var attributes: SpanAttributes {
        get { state.inner?.attributes ?? state.ownAttributes }
        nonmutating set {
            if let inner = state.inner {
                inner.attributes = newValue
            } else {
                state.ownAttributes = newValue
            }
        }
    }

    public var isRecording: Bool { state.inner?.isRecording ?? false }

    public func setStatus(_ status: SpanStatus) { state.inner?.setStatus(status) }

    public func addEvent(_ event: SpanEvent) { state.inner?.addEvent(event) }

    public func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {
        state.inner?.recordError(error, attributes: attributes, at: instant())
    }

    public func addLink(_ link: SpanLink) { state.inner?.addLink(link) }

    public func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        state.end()
        guard let inner = state.inner else { return }
        let events = state.stallEvents()
        if !events.isEmpty {
            for event in events { inner.addEvent(event) }
            inner.attributes["stallmon.stalled"] = true
        }
        inner.end(at: instant())
    }
}
