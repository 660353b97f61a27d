import Instrumentation
import Synchronization
import Tracing

#if STALLMON_LINUX
import CStallCapture
#endif

/// The instants handed to a wrapped tracer: the instant a span's caller gave, as the one type that
/// every tracer takes (`TracerInstant` says nothing but its nanoseconds), so that the calls in
/// between are not generic.
typealias Timestamp = DefaultTracerClock.Timestamp

extension TracerInstant {
    var timestamp: Timestamp { Timestamp(nanosecondsSinceEpoch: nanosecondsSinceEpoch) }
}

/// The service's tracer that a ``StallmonTracer`` wraps, made once per tracer and never freed
/// (spans name it unretained). Generic in a subclass (``WrappingTracerOf``), so that the tracer is
/// called as its own type, while ``StallmonTracer`` stays a type that code holding `any Tracer`
/// looks up nothing for.
///
/// A span of the tracer is held as one object: the span itself when it is an object (swift-otel's
/// spans are), else a ``SpanBox``. The ``SpanCalls`` of its type call it through that object, and
/// a ``StallmonSpan`` finds them by their number in `packedRegistration`, so that it holds the
/// wrapped span in no object of its own and still fits three words.
class WrappingTracer: @unchecked Sendable {
    /// What calls the objects that hold the tracer's spans, and its number (see
    /// ``SpanCalls/number(of:)``).
    let calls: SpanCalls
    let callsNumber: UInt64

    init(calls: SpanCalls, number: UInt64) {
        self.calls = calls
        self.callsNumber = number
    }

    /// Starts a span of the wrapped tracer: the object that holds it, retained.
    func start(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Timestamp,
        function: String, file fileID: String, line: UInt
    ) -> Unmanaged<AnyObject> {
        fatalError("a subclass starts spans")
    }

    /// The W3C trace context the wrapped tracer writes for `context`, parsed.
    func traceParent(of context: InstrumentationContext) -> TraceParent? {
        fatalError("a subclass injects")
    }

    static func make<Wrapped: Tracer>(_ tracer: Wrapped) -> Unmanaged<WrappingTracer> {
        Unmanaged.passRetained(WrappingTracerOf<Wrapped, Wrapped.Span>(tracer))
    }
}

/// `Span` is the tracer's span type: a generic parameter of the class, its metadata is at hand
/// where an associated type would be looked up at each use.
final class WrappingTracerOf<Wrapped: Tracer, Span: Tracing.Span>: WrappingTracer, @unchecked Sendable
where Wrapped.Span == Span {
    private let tracer: Wrapped
    /// Whether the spans are objects, each held as itself; else each is moved into a ``SpanBox``.
    private let spansAreObjects: Bool
    /// The spans' calls when they have no number of their own: each span is then held with them,
    /// in an ``IndirectSpan``.
    private let indirectCalls: SpanCalls?

    init(_ tracer: Wrapped) {
        self.tracer = tracer
        let objects = objectSpanCalls(for: Span.self)
        let calls = objects ?? BoxedSpanCalls<Span>()
        self.spansAreObjects = objects != nil
        if let number = SpanCalls.number(of: calls) {
            self.indirectCalls = nil
            super.init(calls: calls, number: number)
        } else {
            self.indirectCalls = calls
            super.init(calls: SpanCalls.numbered(SpanCalls.indirect).takeUnretainedValue(), number: SpanCalls.indirect)
        }
    }

    override func start(
        _ operationName: String, context: InstrumentationContext, ofKind kind: SpanKind, at instant: Timestamp,
        function: String, file fileID: String, line: UInt
    ) -> Unmanaged<AnyObject> {
        func started() -> Span {
            tracer.startSpan(
                operationName, context: context, ofKind: kind, at: instant, function: function, file: fileID,
                line: line)
        }
        let object: Unmanaged<AnyObject>
        if spansAreObjects {
            // The span's own reference, handed over as it is: neither retained nor released.
            var reference: UnsafeMutableRawPointer? = nil
            withUnsafeMutablePointer(to: &reference) {
                // Bound as a raw pointer, used as the span's one reference: `withMemoryRebound`, the
                // sanctioned form, is a generic call here and cost 45 ns a span.
                UnsafeMutableRawPointer($0).assumingMemoryBound(to: Span.self).initialize(to: started())
            }
            object = Unmanaged.fromOpaque(reference.unsafelyUnwrapped)
        } else {
            // Moved into its box, not copied: a struct span's copy retains each of its parts.
            object = Unmanaged.passRetained(SpanBox(started()))
        }
        guard let indirectCalls else { return object }
        return Unmanaged.passRetained(IndirectSpan(object.takeRetainedValue(), calls: indirectCalls))
    }

    override func traceParent(of context: InstrumentationContext) -> TraceParent? {
        var headers: [String: String] = [:]
        tracer.inject(context, into: &headers, using: HeaderInjector())
        return headers[TraceParent.header].flatMap { TraceParent($0) }
    }
}

/// How the spans of one type are called, through the objects that hold them (see
/// ``WrappingTracer``): as their own type, generic in a subclass. Made once per span type and
/// never freed; numbered, so that a span names them in a few bits.
class SpanCalls: @unchecked Sendable {
    func context(of span: Unmanaged<AnyObject>) -> InstrumentationContext { fatalError("abstract") }
    func operationName(of span: Unmanaged<AnyObject>) -> String { fatalError("abstract") }
    func setOperationName(_ name: consuming String, of span: Unmanaged<AnyObject>) { fatalError("abstract") }
    func attributes(of span: Unmanaged<AnyObject>) -> SpanAttributes { fatalError("abstract") }
    func setAttributes(_ attributes: consuming SpanAttributes, of span: Unmanaged<AnyObject>) {
        fatalError("abstract")
    }
    func isRecording(_ span: Unmanaged<AnyObject>) -> Bool { fatalError("abstract") }
    func setStatus(_ status: SpanStatus, of span: Unmanaged<AnyObject>) { fatalError("abstract") }
    func addEvent(_ event: SpanEvent, to span: Unmanaged<AnyObject>) { fatalError("abstract") }
    func recordError(
        _ error: any Error, attributes: SpanAttributes, at instant: Timestamp, in span: Unmanaged<AnyObject>
    ) {
        fatalError("abstract")
    }
    func addLink(_ link: SpanLink, to span: Unmanaged<AnyObject>) { fatalError("abstract") }
    func end(_ span: Unmanaged<AnyObject>, at instant: Timestamp) { fatalError("abstract") }

    /// The number of the calls of ``IndirectSpan``s, and of numbered calls, at most.
    static let indirect: UInt64 = 15
    /// The span types whose calls have a number, and the numbers.
    private static let numbers = Mutex<[ObjectIdentifier: UInt64]>([:])

    /// The number of `calls`, given to the first calls of their span type; `nil` when all numbers
    /// are taken (a process wrapping more than 14 span types).
    static func number(of calls: SpanCalls) -> UInt64? {
        numbers.withLock { numbers in
            if numbers.isEmpty { setNumbered(indirect, IndirectSpanCalls()) }
            let type = ObjectIdentifier(Swift.type(of: calls))
            if let number = numbers[type] { return number }
            let number = UInt64(numbers.count) + 1
            guard number < indirect else { return nil }
            setNumbered(number, calls)
            numbers[type] = number
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
}

/// Calls spans that are objects: the object is the span.
final class ObjectSpanCalls<Span: Tracing.Span & AnyObject>: SpanCalls, @unchecked Sendable {
    /// Runs `body` with the span held by `span`, in place: a call through the span's protocol takes
    /// its address, where a value would be copied there, a retain and a release.
    @inline(__always)
    private func withSpan<Result>(_ span: Unmanaged<AnyObject>, _ body: (UnsafePointer<Span>) -> Result) -> Result {
        // As in `WrappingTracerOf.start`: one reference, read as the span's type in place.
        withUnsafePointer(to: span) { body(UnsafeRawPointer($0).assumingMemoryBound(to: Span.self)) }
    }

    override func context(of span: Unmanaged<AnyObject>) -> InstrumentationContext {
        withSpan(span) { $0.pointee.context }
    }
    override func operationName(of span: Unmanaged<AnyObject>) -> String {
        withSpan(span) { $0.pointee.operationName }
    }
    override func setOperationName(_ name: consuming String, of span: Unmanaged<AnyObject>) {
        var name = Optional(name)
        withSpan(span) { $0.pointee.operationName = name.take().unsafelyUnwrapped }
    }
    override func attributes(of span: Unmanaged<AnyObject>) -> SpanAttributes {
        withSpan(span) { $0.pointee.attributes }
    }
    override func setAttributes(_ attributes: consuming SpanAttributes, of span: Unmanaged<AnyObject>) {
        var attributes = Optional(attributes)
        withSpan(span) { $0.pointee.attributes = attributes.take().unsafelyUnwrapped }
    }
    override func isRecording(_ span: Unmanaged<AnyObject>) -> Bool {
        withSpan(span) { $0.pointee.isRecording }
    }
    override func setStatus(_ status: SpanStatus, of span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.pointee.setStatus(status) }
    }
    override func addEvent(_ event: SpanEvent, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.pointee.addEvent(event) }
    }
    override func recordError(
        _ error: any Error, attributes: SpanAttributes, at instant: Timestamp, in span: Unmanaged<AnyObject>
    ) {
        withSpan(span) { $0.pointee.recordError(error, attributes: attributes, at: instant) }
    }
    override func addLink(_ link: SpanLink, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.pointee.addLink(link) }
    }
    override func end(_ span: Unmanaged<AnyObject>, at instant: Timestamp) {
        withSpan(span) { $0.pointee.end(at: instant) }
    }
}

/// The calls of spans of `type`, if they are objects.
private func objectSpanCalls<Span: Tracing.Span>(for type: Span.Type) -> SpanCalls? {
    func make<Object: Tracing.Span & AnyObject>(_ type: Object.Type) -> SpanCalls { ObjectSpanCalls<Object>() }
    guard let objects = type as? any (AnyObject & Tracing.Span).Type else { return nil }
    return make(objects)
}

/// Holds a wrapped tracer's span that is not an object (`InMemoryTracer`'s is a struct): in this
/// one allocation, where an `any Span` would box it.
final class SpanBox<Inner: Tracing.Span>: @unchecked Sendable {
    let span: Inner

    init(_ span: consuming Inner) {
        self.span = span
    }
}

/// Calls spans that are not objects, each in its ``SpanBox``.
final class BoxedSpanCalls<Span: Tracing.Span>: SpanCalls, @unchecked Sendable {
    @inline(__always)
    private func withSpan<Result>(_ span: Unmanaged<AnyObject>, _ body: (SpanBox<Span>) -> Result) -> Result {
        span._withUnsafeGuaranteedRef { body(unsafeDowncast($0, to: SpanBox<Span>.self)) }
    }

    override func context(of span: Unmanaged<AnyObject>) -> InstrumentationContext {
        withSpan(span) { $0.span.context }
    }
    override func operationName(of span: Unmanaged<AnyObject>) -> String {
        withSpan(span) { $0.span.operationName }
    }
    override func setOperationName(_ name: consuming String, of span: Unmanaged<AnyObject>) {
        var name = Optional(name)
        withSpan(span) { $0.span.operationName = name.take().unsafelyUnwrapped }
    }
    override func attributes(of span: Unmanaged<AnyObject>) -> SpanAttributes {
        withSpan(span) { $0.span.attributes }
    }
    override func setAttributes(_ attributes: consuming SpanAttributes, of span: Unmanaged<AnyObject>) {
        var attributes = Optional(attributes)
        withSpan(span) { $0.span.attributes = attributes.take().unsafelyUnwrapped }
    }
    override func isRecording(_ span: Unmanaged<AnyObject>) -> Bool {
        withSpan(span) { $0.span.isRecording }
    }
    override func setStatus(_ status: SpanStatus, of span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.span.setStatus(status) }
    }
    override func addEvent(_ event: SpanEvent, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.span.addEvent(event) }
    }
    override func recordError(
        _ error: any Error, attributes: SpanAttributes, at instant: Timestamp, in span: Unmanaged<AnyObject>
    ) {
        withSpan(span) { $0.span.recordError(error, attributes: attributes, at: instant) }
    }
    override func addLink(_ link: SpanLink, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.span.addLink(link) }
    }
    override func end(_ span: Unmanaged<AnyObject>, at instant: Timestamp) {
        withSpan(span) { $0.span.end(at: instant) }
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

/// Calls each ``IndirectSpan`` through the calls it holds.
private final class IndirectSpanCalls: SpanCalls, @unchecked Sendable {
    @inline(__always)
    private func withSpan<Result>(
        _ span: Unmanaged<AnyObject>, _ body: (SpanCalls, Unmanaged<AnyObject>) -> Result
    ) -> Result {
        span._withUnsafeGuaranteedRef {
            let indirect = unsafeDowncast($0, to: IndirectSpan.self)
            return withExtendedLifetime(indirect) { body(indirect.calls, .passUnretained(indirect.object)) }
        }
    }

    override func context(of span: Unmanaged<AnyObject>) -> InstrumentationContext {
        withSpan(span) { $0.context(of: $1) }
    }
    override func operationName(of span: Unmanaged<AnyObject>) -> String {
        withSpan(span) { $0.operationName(of: $1) }
    }
    override func setOperationName(_ name: consuming String, of span: Unmanaged<AnyObject>) {
        var name = Optional(name)
        withSpan(span) { $0.setOperationName(name.take().unsafelyUnwrapped, of: $1) }
    }
    override func attributes(of span: Unmanaged<AnyObject>) -> SpanAttributes {
        withSpan(span) { $0.attributes(of: $1) }
    }
    override func setAttributes(_ attributes: consuming SpanAttributes, of span: Unmanaged<AnyObject>) {
        var attributes = Optional(attributes)
        withSpan(span) { $0.setAttributes(attributes.take().unsafelyUnwrapped, of: $1) }
    }
    override func isRecording(_ span: Unmanaged<AnyObject>) -> Bool {
        withSpan(span) { $0.isRecording($1) }
    }
    override func setStatus(_ status: SpanStatus, of span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.setStatus(status, of: $1) }
    }
    override func addEvent(_ event: SpanEvent, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.addEvent(event, to: $1) }
    }
    override func recordError(
        _ error: any Error, attributes: SpanAttributes, at instant: Timestamp, in span: Unmanaged<AnyObject>
    ) {
        withSpan(span) { $0.recordError(error, attributes: attributes, at: instant, in: $1) }
    }
    override func addLink(_ link: SpanLink, to span: Unmanaged<AnyObject>) {
        withSpan(span) { $0.addLink(link, to: $1) }
    }
    override func end(_ span: Unmanaged<AnyObject>, at instant: Timestamp) {
        withSpan(span) { $0.end($1, at: instant) }
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

    var context: InstrumentationContext { call { $0.context(of: span) } }
    var operationName: String { call { $0.operationName(of: span) } }
    func setOperationName(_ name: consuming String) {
        var name = Optional(name)
        call { $0.setOperationName(name.take().unsafelyUnwrapped, of: span) }
    }
    var attributes: SpanAttributes { call { $0.attributes(of: span) } }
    func setAttributes(_ attributes: consuming SpanAttributes) {
        var attributes = Optional(attributes)
        call { $0.setAttributes(attributes.take().unsafelyUnwrapped, of: span) }
    }
    var isRecording: Bool { call { $0.isRecording(span) } }
    func setStatus(_ status: SpanStatus) { call { $0.setStatus(status, of: span) } }
    func addEvent(_ event: SpanEvent) { call { $0.addEvent(event, to: span) } }
    func recordError(_ error: any Error, attributes: SpanAttributes, at instant: Timestamp) {
        call { $0.recordError(error, attributes: attributes, at: instant, in: span) }
    }
    func addLink(_ link: SpanLink) { call { $0.addLink(link, to: span) } }
    func end(at instant: Timestamp) { call { $0.end(span, at: instant) } }
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
