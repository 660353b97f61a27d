import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Tracing

/// A span of ``StallmonTracer``: the wrapped tracer's span, registered with stallmon while it runs.
/// Everything a span does is handed to the wrapped one; when it ends, every stall that happened
/// inside it becomes a `stall` event on it, and its `stallmon.stalled` attribute is set.
///
/// Alone (``StallmonTracer/init()``), a span keeps what a report reads: its name, and its HTTP
/// method, route, path and gRPC method among the attributes set on it. Like the spans of
/// `NoOpTracer`, it reads back no attributes, and its context is the one it started in: keeping
/// every attribute, or inserting the span into a context, would cost more than all the rest of a
/// span.
///
/// A span must end, as every span of swift-distributed-tracing must: one dropped unended names
/// the stalls of its task until the task ends (outside a task, until its last copy goes).
public struct StallmonSpan: Tracing.Span {
    // Three words, so that a span fits an existential's inline buffer: the frameworks' middlewares
    // start spans through `any LegacyTracer` (the global `withSpan` and `startSpan`), whose spans
    // are `any Span`, and a larger span would be boxed, an allocation per span.

    /// Where the span is registered (`SpanRegistration`, packed): what it says is kept there.
    private let packedRegistration: UInt64
    /// Alone: the context it started in (a `traceparent` extracted into it stays there). `nil`
    /// wrapping: copies of the span then retain and release nothing of it (the runtime returns at
    /// once for a null), where an empty context is the empty dictionary's storage.
    private let startContext: InstrumentationContext?
    /// Wrapping, the object that holds the tracer's span (see ``WrappingTracer``); outside a task,
    /// a ``ThreadSpanKeeper`` (as `packedRegistration` says), which holds that object and
    /// withdraws the registration if the span is dropped unended. `nil` alone in a task: such a
    /// span allocates nothing.
    // Sendable: a span is, and so is every object that holds one.
    nonisolated(unsafe) private let keeper: AnyObject?

    var registration: SpanRegistration { SpanRegistration(packed: packedRegistration & SpanRegistration.packedMask) }
    /// The wrapped tracer's span, unretained: the span holds it for as long as it is used.
    private var wrapped: WrappedSpan? {
        let number = packedRegistration >> Self.callsShift
        guard number != 0 else { return nil }
        let calls = SpanCalls.numbered(number)
        let object =
            packedRegistration & Self.keptBit != 0
            ? unsafeDowncast(keeper.unsafelyUnwrapped, to: ThreadSpanKeeper.self).wrapped.unsafelyUnwrapped
            : keeper.unsafelyUnwrapped
        return WrappedSpan(calls: calls, span: .passUnretained(object))
    }
    /// In `packedRegistration`, over the registration: `keeper` is a ``ThreadSpanKeeper``; and the
    /// number of the wrapped span's calls, 0 alone (see ``SpanCalls/number(of:)``).
    private static let keptBit: UInt64 = 1 << 59
    private static let callsShift: UInt64 = 60

    init(alone operationName: String, context: @autoclosure () -> InstrumentationContext) {
        // A child of the span its task serves, unless the context it is given carries another
        // trace (a message's, or a request's read from its header): then of that.
        let context = context()
        let given = context.isEmpty ? nil : context.stallmonTrace
        let (key, registration) = SpanTable.register { parts, around in
            var aroundTrace = around.flatMap { SpanTable.trace(of: $0.registration) }
            if let given, let local = aroundTrace,
                local.traceHigh != given.traceHigh || local.traceLow != given.traceLow
            {
                (around, aroundTrace) = (nil, nil)
            }
            parts.pointee.operation = operationName
            parts.pointee.trace = TraceParent.child(of: aroundTrace ?? given)
            if parts.pointee.wrapped != nil { parts.pointee.wrapped = nil }
        }
        startContext = context
        if registration.isRegistered && !SpanTable.isTask(key) {
            packedRegistration = registration.packed | Self.keptBit
            keeper = ThreadSpanKeeper(registration, wrapped: nil)
        } else {
            packedRegistration = registration.packed
            keeper = nil
        }
    }

    /// A span of `tracer`'s, held by `span` (retained: the span takes it over).
    init(wrapping span: Unmanaged<AnyObject>, of tracer: Unmanaged<WrappingTracer>) {
        let object = span.takeRetainedValue()
        let (key, registration) = SpanTable.register { parts, _ in
            if !parts.pointee.operation.isEmpty { parts.pointee.operation = "" }
            parts.pointee.trace = nil
            parts.pointee.wrapped = HeldSpan(tracer: tracer, object: object)
        }
        startContext = nil
        let calls = tracer._withUnsafeGuaranteedRef { $0.callsNumber } << Self.callsShift
        if registration.isRegistered && !SpanTable.isTask(key) {
            packedRegistration = registration.packed | calls | Self.keptBit
            keeper = ThreadSpanKeeper(registration, wrapped: object)
        } else {
            packedRegistration = registration.packed | calls
            keeper = object
        }
    }

    public var context: InstrumentationContext {
        if let wrapped { return wrapped.context }
        return startContext ?? .topLevel
    }

    public var operationName: String {
        get {
            if let wrapped { return wrapped.operationName }
            return SpanTable.withParts(registration) { $0.pointee.operation } ?? ""
        }
        nonmutating set {
            if let wrapped {
                wrapped.setOperationName(newValue)
            } else {
                _ = SpanTable.withParts(registration) { $0.pointee.operation = newValue }
            }
        }
    }

    public var attributes: SpanAttributes {
        get {
            if let wrapped { return wrapped.attributes }
            return [:]
        }
        nonmutating set {
            if let wrapped {
                wrapped.setAttributes(newValue)
            } else {
                SpanTable.keepAttributes(newValue, of: registration)
            }
        }
    }

    public var isRecording: Bool {
        if let wrapped { return wrapped.isRecording }
        return false
    }

    public func setStatus(_ status: SpanStatus) {
        wrapped?.setStatus(status)
    }

    public func addEvent(_ event: SpanEvent) {
        wrapped?.addEvent(event)
    }

    public func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {
        wrapped?.recordError(error, attributes: attributes, at: instant().timestamp)
    }

    public func addLink(_ link: SpanLink) {
        wrapped?.addLink(link)
    }

    public func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        let notes = SpanTable.withdraw(registration)
        guard let wrapped else { return }
        if !notes.isEmpty {
            let wallNow = DefaultTracerClock.now.nanosecondsSinceEpoch
            let monotonicNow = MonotonicClock.now()
            for note in notes { wrapped.addEvent(note.spanEvent(wallNow: wallNow, monotonicNow: monotonicNow)) }
            var attributes = wrapped.attributes
            attributes["stallmon.stalled"] = true
            wrapped.setAttributes(attributes)
        }
        wrapped.end(at: instant().timestamp)
    }
}
