import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Tracing

/// What stallmon keeps of one span while it runs: registered in the monitor's table under the
/// task (or thread) that started the span, and read by the monitor's reporting thread when a
/// thread serving the span stalls. The only object a span of ``StallmonTracer`` allocates.
///
/// `@unchecked Sendable`: `slot` is written once, by the thread that starts the span, before
/// anything but ``StallmonSpan/end(at:)`` reads it; the rest is immutable or behind a mutex.
final class RequestState: StallRequestRecord, @unchecked Sendable {
    struct Own {
        var operationName: String
        var attributes: SpanAttributes = [:]
    }

    /// Alone: the span's name and attributes (the wrapped tracer keeps none).
    let own: Mutex<Own>
    let recordsItself: Bool
    /// Alone: the span's trace context.
    private let trace: TraceParent?
    /// Wrapping: the wrapped tracer's span, read on the reporting thread (a span is Sendable), and
    /// the tracer, which says the span's W3C IDs when asked to inject its context.
    private let inner: (any Tracing.Span)?
    private let instrument: (any Instrument)?
    /// The span the task or thread was serving when this one started: the request's method and
    /// route, when this span (a database call's, say) has none of its own.
    let parent: RequestState?
    var slot: Int32 = -1

    private let notes = Mutex<[StallNote]>([])

    init(ownOperation: String, trace: TraceParent, parent: RequestState?) {
        self.own = Mutex(Own(operationName: ownOperation))
        self.recordsItself = true
        self.trace = trace
        self.inner = nil
        self.instrument = nil
        self.parent = parent
    }

    init(inner: any Tracing.Span, instrument: any Instrument, parent: RequestState?) {
        self.own = Mutex(Own(operationName: ""))
        self.recordsItself = false
        self.trace = nil
        self.inner = inner
        self.instrument = instrument
        self.parent = parent
    }

    /// Withdraws the span from the table: stalls from here on are not its own.
    func end() {
        RequestTable.withdraw(slot)
        slot = -1
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
            recordsItself
            ? own.withLock { ($0.operationName, $0.attributes) } : (inner!.operationName, inner!.attributes)
        func text(_ names: String...) -> String {
            for name in names {
                switch attributes.get(name) {
                case .string(let value)?: return value
                case .stringConvertible(let value)?: return value.description
                case let value?: return "\(value)"
                case nil: continue
                }
            }
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
        guard let inner, let instrument else { return nil }
        var headers: [String: String] = [:]
        instrument.inject(inner.context, into: &headers, using: HeaderInjector())
        guard let header = headers[TraceParent.header], let parsed = TraceParent(header) else { return nil }
        return (parsed.traceID, parsed.spanIDText)
    }

    // MARK: Stalls inside the span

    func noteStall(_ note: StallNote) {
        notes.withLock { notes in
            if let index = notes.firstIndex(where: { $0.stallID == note.stallID }) {
                if !notes[index].ended || note.ended { notes[index] = note }
            } else if notes.count < Self.maximumNotes {
                notes.append(note)
            }
        }
    }

    /// Stalls a span keeps for its events, at most: a span that stalls more often is broken anyway.
    static let maximumNotes = 16

    var stalled: Bool { notes.withLock { !$0.isEmpty } }

    /// One `stall` event per stall inside the span, at its start.
    func stallEvents() -> [SpanEvent] {
        let notes = notes.withLock { $0 }
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

/// Collects what a tracer injects into an outgoing request's headers.
private struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key.lowercased()] = value
    }
}
