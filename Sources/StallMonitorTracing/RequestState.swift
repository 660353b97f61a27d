import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Tracing

/// What stallmon keeps of one span while it runs: registered in the monitor's table under the
/// task (or thread) that started the span, and read by the monitor's reporting thread when a
/// thread serving the span stalls. The only object a span of ``StallmonTracer`` allocates.
///
/// `@unchecked Sendable`: what is not immutable is behind a mutex or atomic.
final class RequestState: StallRequestRecord, @unchecked Sendable {
    /// What changes while the span runs.
    struct Mutable {
        /// Alone: the span's name and attributes.
        var operationName = ""
        var attributes: SpanAttributes = [:]
        /// Stalls inside the span, for its events.
        var notes: [StallNote] = []
    }

    let mutable: Mutex<Mutable>
    /// Whether a stall was noted: a span that ends without one takes no lock for it.
    private let stalledFlag = Atomic<Bool>(false)
    /// Alone: the span's trace context.
    let trace: TraceParent?
    /// Wrapping: the wrapped tracer's span, read on the reporting thread (a span is Sendable), and
    /// the tracer, which says the span's W3C IDs when asked to inject its context.
    let inner: (any Tracing.Span)?
    private let injector: InjectorBox?
    /// Alone: the context it started in (a `traceparent` extracted into it stays there).
    let startContext: InstrumentationContext?
    /// The span the task or thread was serving when this one started: the request's method and
    /// route, when this span (a database call's, say) has none of its own.
    let parent: RequestState?
    /// Spans around it in its task or thread, or those of the request its task serves.
    let depth: UInt32
    /// Its slot in the table while registered, else -1: taken once, by the span's end or this
    /// record's deinit, whichever comes first (copies of a span may end it twice).
    private let slot = Atomic<Int32>(-1)

    init(ownOperation: String, trace: TraceParent, parent: RequestState?, context: InstrumentationContext? = nil) {
        self.mutable = Mutex(Mutable(operationName: ownOperation))
        self.trace = trace
        self.inner = nil
        self.injector = nil
        self.startContext = context
        self.parent = parent
        self.depth = parent.map { $0.depth &+ 1 } ?? 0
    }

    /// The trace context of an incoming request (`traceparent`): the parent of its server span.
    init(remote trace: TraceParent) {
        self.mutable = Mutex(Mutable())
        self.trace = trace
        self.inner = nil
        self.injector = nil
        self.startContext = nil
        self.parent = nil
        self.depth = 0
    }

    init(inner: any Tracing.Span, injector: InjectorBox, parent: RequestState?) {
        self.mutable = Mutex(Mutable())
        self.trace = nil
        self.inner = inner
        self.injector = injector
        self.startContext = nil
        self.parent = parent
        self.depth = parent.map { $0.depth &+ 1 } ?? 0
    }

    /// Registers the span under its task (or thread), once it is whole.
    func register() {
        slot.store(RequestTable.register(self), ordering: .releasing)
    }

    /// Withdraws the span from the table: stalls from here on are not its own.
    func end() {
        let registered = slot.exchange(-1, ordering: .acquiringAndReleasing)
        if registered >= 0 { RequestTable.withdraw(registered) }
    }

    /// A span dropped without its end withdraws here: a reader never retains it from then on.
    deinit {
        end()
    }

    /// Alone: the span's attributes, read and replaced as a whole (as the `Span` protocol sets
    /// them); the value replaced is released outside the lock.
    var ownAttributes: SpanAttributes {
        get { mutable.withLock { $0.attributes } }
        set {
            var replaced = newValue
            mutable.withLock { swap(&$0.attributes, &replaced) }
        }
    }

    static func text(_ value: SpanAttribute) -> String {
        switch value {
        case .string(let value): value
        case .stringConvertible(let value): value.description
        default: "\(value)"
        }
    }

    // MARK: What a report says of the request

    var stallRequest: StallReport.Request {
        var request = StallReport.Request()
        var state: RequestState? = self
        var innermost = true
        while let current = state {
            current.fill(&request, innermost: innermost)
            innermost = false
            state = current.parent
        }
        return request
    }

    /// Fills the parts of `request` still empty from this span: its name and span ID only for the
    /// innermost span, the request's parts from any.
    private func fill(_ request: inout StallReport.Request, innermost: Bool) {
        let (operation, attributes) =
            if let inner {
                (inner.operationName, inner.attributes)
            } else {
                mutable.withLock { ($0.operationName, $0.attributes) }
            }
        func text(_ names: String...) -> String {
            for name in names { if let value = attributes.get(name) { return Self.text(value) } }
            return ""
        }
        if innermost {
            request.operation = operation
            if let (trace, span) = ids() {
                (request.traceID, request.spanID) = (trace, span)
            }
        }
        if request.method.isEmpty { request.method = text("http.request.method", "http.method") }
        if request.route.isEmpty { request.route = text("http.route") }
        if request.path.isEmpty { request.path = text("url.path", "http.target") }
        if request.rpcMethod.isEmpty {
            let method = text("rpc.method")
            let service = text("rpc.service")
            request.rpcMethod = service.isEmpty || method.isEmpty ? method : "\(service)/\(method)"
        }
    }

    /// The span's W3C trace and span IDs: its own alone, else what the wrapped tracer injects.
    private func ids() -> (trace: String, span: String)? {
        if let trace { return (trace.traceID, trace.spanIDText) }
        guard let inner, let injector else { return nil }
        var headers: [String: String] = [:]
        injector.instrument.inject(inner.context, into: &headers, using: HeaderInjector())
        guard let header = headers[TraceParent.header], let parsed = TraceParent(header) else { return nil }
        return (parsed.traceID, parsed.spanIDText)
    }

    // MARK: Stalls inside the span

    func noteStall(_ note: StallNote) {
        mutable.withLock { state in
            if let index = state.notes.firstIndex(where: { $0.stallID == note.stallID }) {
                if !state.notes[index].ended || note.ended { state.notes[index] = note }
            } else if state.notes.count < Self.maximumNotes {
                state.notes.append(note)
            }
        }
        stalledFlag.store(true, ordering: .releasing)
    }

    /// Stalls a span keeps for its events, at most: a span that stalls more often is broken anyway.
    static let maximumNotes = 16

    /// One `stall` event per stall inside the span, at its start.
    func stallEvents() -> [SpanEvent] {
        guard stalledFlag.load(ordering: .acquiring) else { return [] }
        let notes = mutable.withLock { $0.notes }
        guard !notes.isEmpty else { return [] }
        let wallNow = DefaultTracerClock.now.nanosecondsSinceEpoch
        let monotonicNow = MonotonicClock.now()
        return notes.map { note in
            var note = note
            // A span often ends before the monitor has seen its stall end. The pool thread stamps
            // the end of a stalled job (a Vapor handler's task ends before the middleware's span);
            // else the stall lasted at most until now (a Hummingbird span ends inside the job that
            // stalled, which is still running).
            if !note.ended {
                if let end = RequestTable.poolJobEnd(threadID: note.threadID, start: note.startNanoseconds) {
                    note.duration = .nanoseconds(end - note.startNanoseconds)
                    note.ended = true
                } else if monotonicNow > note.startNanoseconds {
                    note.duration = max(note.duration, .nanoseconds(monotonicNow - note.startNanoseconds))
                }
            }
            let ago = monotonicNow > note.startNanoseconds ? monotonicNow - note.startNanoseconds : 0
            var attributes: SpanAttributes = [:]
            attributes["stallmon.stall.id"] = note.stallID
            attributes["stallmon.stall.duration_ms"] = Double(note.duration.nanoseconds) / 1e6
            attributes["stallmon.stall.ended"] = note.ended
            attributes["stallmon.stall.loop"] = note.loop
            attributes["thread.id"] = note.threadID
            if !note.frame.isEmpty { attributes["code.function"] = note.frame }
            return SpanEvent(
                name: "stall",
                at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: wallNow > ago ? wallNow - ago : 0),
                attributes: attributes)
        }
    }
}

/// The wrapped tracer, once per ``StallmonTracer``: what a span asks for its W3C IDs.
final class InjectorBox: Sendable {
    let instrument: any Instrument

    init(_ instrument: any Instrument) {
        self.instrument = instrument
    }
}

/// Collects what a tracer injects into an outgoing request's headers.
private struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key.lowercased()] = value
    }
}
