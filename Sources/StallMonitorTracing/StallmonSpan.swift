import Instrumentation
import StallMonitor
import Synchronization
import Tracing

/// A span of ``StallmonTracer``: the wrapped tracer's span, registered with stallmon while it runs.
/// Everything a span does is handed to the wrapped one; when it ends, every stall that happened
/// inside it becomes a `stall` event on it, and its `stallmon.stalled` attribute is set.
public struct StallmonSpan<Inner: Tracing.Span>: Tracing.Span {
    let inner: Inner
    let state: RequestState
    /// Alone (the wrapped tracer records nothing): the parent's context with this span's trace context.
    private let ownContext: InstrumentationContext?

    init<Wrapped: Tracer>(
        _ inner: Inner, operationName: String, parent: InstrumentationContext, tracer: StallmonTracer<Wrapped>
    ) where Wrapped.Span == Inner {
        self.inner = inner
        if tracer.recordsItself {
            let trace = TraceParent.child(of: parent.stallmonTrace)
            var context = parent
            context.stallmonTrace = trace
            self.ownContext = context
            self.state = RequestState(ownOperation: operationName, trace: trace, parent: RequestTable.current())
        } else {
            self.ownContext = nil
            self.state = RequestState(inner: inner, instrument: tracer.wrapped, parent: RequestTable.current())
        }
        state.slot = RequestTable.register(state)
    }

    public var context: InstrumentationContext { ownContext ?? inner.context }

    public var operationName: String {
        get { state.recordsItself ? state.own.withLock { $0.operationName } : inner.operationName }
        nonmutating set {
            if state.recordsItself {
                state.own.withLock { $0.operationName = newValue }
            } else {
                inner.operationName = newValue
            }
        }
    }

    public var attributes: SpanAttributes {
        get { state.recordsItself ? state.own.withLock { $0.attributes } : inner.attributes }
        nonmutating set {
            if state.recordsItself {
                state.own.withLock { $0.attributes = newValue }
            } else {
                inner.attributes = newValue
            }
        }
    }

    public var isRecording: Bool { inner.isRecording }

    public func setStatus(_ status: SpanStatus) { inner.setStatus(status) }

    public func addEvent(_ event: SpanEvent) { inner.addEvent(event) }

    public func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {
        inner.recordError(error, attributes: attributes, at: instant())
    }

    public func addLink(_ link: SpanLink) { inner.addLink(link) }

    public func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        state.end()
        for event in state.stallEvents() { inner.addEvent(event) }
        if state.stalled { inner.attributes["stallmon.stalled"] = true }
        inner.end(at: instant())
    }
}
