import Instrumentation
import Synchronization
import Tracing

#if STALLMON_LINUX
import CStallCapture
#endif

/// The instants handed to a wrapped tracer: the instant a span's caller gave, as the one type that
/// every tracer takes (`TracerInstant` says nothing but its nanoseconds), so that the calls in
/// between are not generic.
@usableFromInline
typealias Timestamp = DefaultTracerClock.Timestamp

extension TracerInstant {
    var timestamp: Timestamp { Timestamp(nanosecondsSinceEpoch: nanosecondsSinceEpoch) }
}

/// The service's tracer that a ``StallmonTracer`` wraps, made once per tracer and never freed
/// (spans name it unretained).
///
/// A span of the tracer is held as one object: the span itself when it is an object (swift-otel's
/// spans are), else a ``SpanBox``. The ``SpanCalls`` of its type call it through that object, and
/// a ``StallmonSpan`` finds them by their number in `packedRegistration`, so that it holds the
/// wrapped span in no object of its own and still fits three words.
///
/// What calls the tracer and its spans is made by inlinable code (``make(_:)``), so that it is
/// specialized for the tracer's type where the service wraps it (an opaque `some Tracer`, as
/// swift-otel's backend hands out, too): about 40 instructions a span fewer than unspecialized.
/// Closures, not a generic class: a generic class's methods run unspecialized whoever made it.
@usableFromInline
final class WrappingTracer: @unchecked Sendable {
    /// Starts a span: its name, context, kind, start, function, file and line.
    @usableFromInline
    typealias Start = (String, InstrumentationContext, SpanKind, Timestamp, String, String, UInt) -> SpanCalls.Object

    /// What calls the objects that hold the tracer's spans, and its number (see
    /// ``SpanCalls/number(of:)``).
    let calls: SpanCalls
    let callsNumber: UInt64
    /// Starts a span of the wrapped tracer: the object that holds it, retained.
    private let start: Start
    /// The `traceparent` header the wrapped tracer writes for a context.
    private let inject: (InstrumentationContext) -> String?
    /// The spans' calls when they have no number of their own: each span is then held with them,
    /// in an ``IndirectSpan``.
    private let indirectCalls: SpanCalls?

    @usableFromInline
    init(calls: SpanCalls, start: @escaping Start, inject: @escaping (InstrumentationContext) -> String?) {
        self.start = start
        self.inject = inject
        if let number = SpanCalls.number(of: calls) {
            self.calls = SpanCalls.numbered(number).takeUnretainedValue()
            self.callsNumber = number
            self.indirectCalls = nil
        } else {
            self.calls = SpanCalls.numbered(SpanCalls.indirect).takeUnretainedValue()
            self.callsNumber = SpanCalls.indirect
            self.indirectCalls = calls
        }
    }

    /// The wrapping of `tracer`, retained.
    @inlinable
    static func make<Wrapped: Tracer>(_ tracer: Wrapped) -> Unmanaged<WrappingTracer> {
        // Whether spans are objects, decided once: how they are held (`hold`) and called.
        let objects = Wrapped.Span.self as? any (Tracing.Span & AnyObject).Type
        let wrapping = WrappingTracer(
            calls: objects.map { SpanCalls.of(objects: $0) } ?? SpanCalls.of(boxed: Wrapped.Span.self),
            start: { operationName, context, kind, instant, function, fileID, line in
                SpanCalls.hold(objects: objects != nil) {
                    tracer.startSpan(
                        operationName, context: context, ofKind: kind, at: instant, function: function, file: fileID,
                        line: line)
                }
            },
            inject: { context in traceParentHeader(injectedBy: tracer, for: context) })
        return .passRetained(wrapping)
    }

    /// Starts a span of the wrapped tracer: the object that holds it, retained.
    @inline(__always)
    func start(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Timestamp,
        function: String, file fileID: String, line: UInt
    ) -> Unmanaged<AnyObject> {
        let object = start(operationName, context, kind, instant, function, fileID, line)
        guard let indirectCalls else { return object }
        return .passRetained(IndirectSpan(object.takeRetainedValue(), calls: indirectCalls))
    }

    /// The W3C trace context the wrapped tracer writes for `context`, parsed.
    func traceParent(of context: InstrumentationContext) -> TraceParent? {
        inject(context).flatMap { TraceParent($0) }
    }
}

/// The W3C `traceparent` header `tracer` writes for `context`.
@usableFromInline
func traceParentHeader(injectedBy tracer: some Tracer, for context: InstrumentationContext) -> String? {
    var headers: [String: String] = [:]
    tracer.inject(context, into: &headers, using: HeaderInjector())
    return headers[TraceParent.header]
}

/// How the spans of one type are called, through the objects that hold them (see
/// ``WrappingTracer``): as their own type, by closures made for it where the tracer is wrapped
/// (``of(objects:)``, ``of(boxed:)``). Made once per span type and never freed; numbered, so that a span names them in a
/// few bits.
@usableFromInline
final class SpanCalls: @unchecked Sendable {
    @usableFromInline
    typealias Object = Unmanaged<AnyObject>

    /// The span type whose calls these are.
    let type: ObjectIdentifier
    let context: (Object) -> InstrumentationContext
    let operationName: (Object) -> String
    let setOperationName: (consuming String, Object) -> Void
    let attributes: (Object) -> SpanAttributes
    let setAttributes: (consuming SpanAttributes, Object) -> Void
    let isRecording: (Object) -> Bool
    let setStatus: (SpanStatus, Object) -> Void
    let addEvent: (SpanEvent, Object) -> Void
    let recordError: (any Error, SpanAttributes, Timestamp, Object) -> Void
    let addLink: (SpanLink, Object) -> Void
    let end: (Timestamp, Object) -> Void

    @usableFromInline
    init(
        type: ObjectIdentifier,
        context: @escaping (Object) -> InstrumentationContext,
        operationName: @escaping (Object) -> String,
        setOperationName: @escaping (consuming String, Object) -> Void,
        attributes: @escaping (Object) -> SpanAttributes,
        setAttributes: @escaping (consuming SpanAttributes, Object) -> Void,
        isRecording: @escaping (Object) -> Bool,
        setStatus: @escaping (SpanStatus, Object) -> Void,
        addEvent: @escaping (SpanEvent, Object) -> Void,
        recordError: @escaping (any Error, SpanAttributes, Timestamp, Object) -> Void,
        addLink: @escaping (SpanLink, Object) -> Void,
        end: @escaping (Timestamp, Object) -> Void
    ) {
        self.type = type
        self.context = context
        self.operationName = operationName
        self.setOperationName = setOperationName
        self.attributes = attributes
        self.setAttributes = setAttributes
        self.isRecording = isRecording
        self.setStatus = setStatus
        self.addEvent = addEvent
        self.recordError = recordError
        self.addLink = addLink
        self.end = end
    }

    /// The calls of spans that are objects: the object is the span, reached unretained.
    ///
    /// Reached from ``WrappingTracer/make(_:)`` through the cast's existential, so not specialized; but an object
    /// span can only be reached unretained where it is known to be an object (`Unmanaged<Span>`),
    /// and specialized code that read it as an unconstrained `Span` retained and released it around
    /// every call, which cost more than the specialization saved. (This and ``of(boxed:)`` make the
    /// same closures: one function making both, through a protocol, cost 60 ns a span more,
    /// unspecialized.)
    @inlinable
    static func of<Span: Tracing.Span & AnyObject>(objects _: Span.Type) -> SpanCalls {
        func with<Result>(_ object: Object, _ body: (Span) -> Result) -> Result {
            Unmanaged<Span>.fromOpaque(object.toOpaque())._withUnsafeGuaranteedRef(body)
        }
        return SpanCalls(
            type: ObjectIdentifier(Span.self),
            context: { with($0) { $0.context } },
            operationName: { with($0) { $0.operationName } },
            setOperationName: { name, object in
                var name = Optional(name)
                with(object) { $0.operationName = name.take().unsafelyUnwrapped }
            },
            attributes: { with($0) { $0.attributes } },
            setAttributes: { attributes, object in
                var attributes = Optional(attributes)
                with(object) { $0.attributes = attributes.take().unsafelyUnwrapped }
            },
            isRecording: { with($0) { $0.isRecording } },
            setStatus: { status, object in with(object) { $0.setStatus(status) } },
            addEvent: { event, object in with(object) { $0.addEvent(event) } },
            recordError: { error, attributes, instant, object in
                with(object) { $0.recordError(error, attributes: attributes, at: instant) }
            },
            addLink: { link, object in with(object) { $0.addLink(link) } },
            end: { instant, object in with(object) { $0.end(at: instant) } })
    }

    /// The calls of spans that are not objects, each in its ``SpanBox``.
    @inlinable
    static func of<Span: Tracing.Span>(boxed _: Span.Type) -> SpanCalls {
        func with<Result>(_ object: Object, _ body: (borrowing Span) -> Result) -> Result {
            object._withUnsafeGuaranteedRef { body(unsafeDowncast($0, to: SpanBox<Span>.self).span) }
        }
        return SpanCalls(
            type: ObjectIdentifier(Span.self),
            context: { with($0) { $0.context } },
            operationName: { with($0) { $0.operationName } },
            setOperationName: { name, object in
                var name = Optional(name)
                with(object) { $0.operationName = name.take().unsafelyUnwrapped }
            },
            attributes: { with($0) { $0.attributes } },
            setAttributes: { attributes, object in
                var attributes = Optional(attributes)
                with(object) { $0.attributes = attributes.take().unsafelyUnwrapped }
            },
            isRecording: { with($0) { $0.isRecording } },
            setStatus: { status, object in with(object) { $0.setStatus(status) } },
            addEvent: { event, object in with(object) { $0.addEvent(event) } },
            recordError: { error, attributes, instant, object in
                with(object) { $0.recordError(error, attributes: attributes, at: instant) }
            },
            addLink: { link, object in with(object) { $0.addLink(link) } },
            end: { instant, object in with(object) { $0.end(at: instant) } })
    }

    /// The object that holds the span `start` makes, retained: the span itself when spans are
    /// `objects` (then called by ``of(objects:)``'s calls), else a ``SpanBox`` it is moved into (a struct span's copy retains each of its
    /// parts).
    @inlinable @inline(__always)
    static func hold<Span: Tracing.Span>(objects: Bool, _ start: () -> Span) -> Object {
        guard objects else { return .passRetained(SpanBox(start())) }
        // The span's own reference, made in place and handed over as it is: neither retained nor
        // released. (Made there, not moved there: unspecialized, moving it would look up the
        // metadata of a generic type, a few hundred instructions a span.)
        return withUnsafeTemporaryAllocation(
            byteCount: MemoryLayout<Object>.size, alignment: MemoryLayout<Object>.alignment
        ) {
            let reference = $0.baseAddress.unsafelyUnwrapped
            reference.initializeMemory(as: Span.self, to: start())
            let object = reference.load(as: Object.self)
            // The span is the returned object's now: the memory is left holding its bits, as the
            // trivial type they were read as, which needs no deinitializing.
            reference.bindMemory(to: Object.self, capacity: 1)
            return object
        }
    }

    /// The number of the calls of ``IndirectSpan``s, and of numbered calls, at most.
    static let indirect: UInt64 = 15
    /// The span types whose calls have a number, and the numbers.
    private static let numbers = Mutex<[ObjectIdentifier: UInt64]>([:])

    /// The number of the calls of `calls`'s span type, given to the first calls of that type; `nil`
    /// when all numbers are taken (a process wrapping more than 14 span types).
    static func number(of calls: SpanCalls) -> UInt64? {
        numbers.withLock { numbers in
            if numbers.isEmpty { setNumbered(indirect, indirectSpanCalls()) }
            if let number = numbers[calls.type] { return number }
            let number = UInt64(numbers.count) + 1
            guard number < indirect else { return nil }
            setNumbered(number, calls)
            numbers[calls.type] = number
            return number
        }
    }

    /// The calls numbered `number`: written once each, before any span names them, and never
    /// freed.
    @inline(__always)
    static func numbered(_ number: UInt64) -> Unmanaged<SpanCalls> {
        #if STALLMON_LINUX
        Unmanaged.fromOpaque(stallmon_span_calls_numbered(number).unsafelyUnwrapped)
        #else
        table.withLock { $0[Int(number)].unsafelyUnwrapped }
        #endif
    }

    private static func setNumbered(_ number: UInt64, _ calls: SpanCalls) {
        #if STALLMON_LINUX
        stallmon_span_calls_set(number, Unmanaged.passRetained(calls).toOpaque())
        #else
        table.withLock { $0[Int(number)] = .passRetained(calls) }
        #endif
    }

    #if !STALLMON_LINUX
    private static let table = Mutex<[Unmanaged<SpanCalls>?]>(Array(repeating: nil, count: Int(indirect) + 1))
    #endif

    /// Calls each ``IndirectSpan`` through the calls it holds.
    private static func indirectSpanCalls() -> SpanCalls {
        func with<Result>(_ object: Object, _ body: (SpanCalls, Object) -> Result) -> Result {
            object._withUnsafeGuaranteedRef {
                let indirect = unsafeDowncast($0, to: IndirectSpan.self)
                return withExtendedLifetime(indirect) { body(indirect.calls, .passUnretained(indirect.object)) }
            }
        }
        return SpanCalls(
            type: ObjectIdentifier(IndirectSpan.self),
            context: { with($0) { $0.context($1) } },
            operationName: { with($0) { $0.operationName($1) } },
            setOperationName: { name, object in
                var name = Optional(name)
                with(object) { $0.setOperationName(name.take().unsafelyUnwrapped, $1) }
            },
            attributes: { with($0) { $0.attributes($1) } },
            setAttributes: { attributes, object in
                var attributes = Optional(attributes)
                with(object) { $0.setAttributes(attributes.take().unsafelyUnwrapped, $1) }
            },
            isRecording: { with($0) { $0.isRecording($1) } },
            setStatus: { status, object in with(object) { $0.setStatus(status, $1) } },
            addEvent: { event, object in with(object) { $0.addEvent(event, $1) } },
            recordError: { error, attributes, instant, object in
                with(object) { $0.recordError(error, attributes, instant, $1) }
            },
            addLink: { link, object in with(object) { $0.addLink(link, $1) } },
            end: { instant, object in with(object) { $0.end(instant, $1) } })
    }
}

/// Holds a wrapped tracer's span that is not an object (`InMemoryTracer`'s is a struct): in this
/// one allocation, where an `any Span` would box it.
@usableFromInline
final class SpanBox<Inner: Tracing.Span>: @unchecked Sendable {
    @usableFromInline
    let span: Inner

    @usableFromInline
    init(_ span: consuming Inner) {
        self.span = span
    }
}

/// A span whose calls have no number, held with them: one more allocation a span, for the spans
/// of a process wrapping more span types than there are numbers.
final class IndirectSpan: @unchecked Sendable {
    let object: AnyObject
    let calls: SpanCalls

    init(_ object: AnyObject, calls: SpanCalls) {
        self.object = object
        self.calls = calls
    }
}

/// A wrapped tracer's span as stallmon reaches it: the object that holds it, unretained, and the
/// calls of its type. Whoever makes one keeps the object alive while it is used.
struct WrappedSpan {
    let calls: Unmanaged<SpanCalls>
    let span: Unmanaged<AnyObject>

    /// Calls `body` with the calls, unretained: they live as long as the process.
    @inline(__always)
    private func call<Result>(_ body: (SpanCalls) -> Result) -> Result { calls._withUnsafeGuaranteedRef(body) }

    var context: InstrumentationContext { call { $0.context(span) } }
    var operationName: String { call { $0.operationName(span) } }
    func setOperationName(_ name: consuming String) {
        var name = Optional(name)
        call { $0.setOperationName(name.take().unsafelyUnwrapped, span) }
    }
    var attributes: SpanAttributes { call { $0.attributes(span) } }
    func setAttributes(_ attributes: consuming SpanAttributes) {
        var attributes = Optional(attributes)
        call { $0.setAttributes(attributes.take().unsafelyUnwrapped, span) }
    }
    var isRecording: Bool { call { $0.isRecording(span) } }
    func setStatus(_ status: SpanStatus) { call { $0.setStatus(status, span) } }
    func addEvent(_ event: SpanEvent) { call { $0.addEvent(event, span) } }
    func recordError(_ error: any Error, attributes: SpanAttributes, at instant: Timestamp) {
        call { $0.recordError(error, attributes, instant, span) }
    }
    func addLink(_ link: SpanLink) { call { $0.addLink(link, span) } }
    func end(at instant: Timestamp) { call { $0.end(instant, span) } }
}

/// A wrapped tracer's span, held: what a slot keeps of its span, and a reader's copy of that.
struct HeldSpan {
    let tracer: Unmanaged<WrappingTracer>
    /// The object that holds the span, retained.
    let object: AnyObject

    /// Runs `body` on the span while this holds it.
    func with<Result>(_ body: (WrappedSpan) -> Result) -> Result {
        withExtendedLifetime(object) {
            body(
                WrappedSpan(
                    calls: tracer._withUnsafeGuaranteedRef { .passUnretained($0.calls) }, span: .passUnretained(object))
            )
        }
    }

    /// The W3C trace context of the span, as its tracer writes it.
    var traceParent: TraceParent? {
        with { span in tracer._withUnsafeGuaranteedRef { $0.traceParent(of: span.context) } }
    }
}

/// Collects what a tracer injects into an outgoing request's headers.
private struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key.lowercased()] = value
    }
}
