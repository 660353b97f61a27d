import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Tracing

/// The monitor's side of the span table: what a registered span says of its request, and the notes
/// of stalls inside it. Installed by the first ``StallmonTracer`` made.
struct SpanTableReader: StallRequestReader {
    /// Spans around a span that a report looks through for the request's method and route, at most.
    static let maximumDepth = 8

    func request(slot: Int32, sequence: UInt64) -> StallReport.Request? {
        if let request = Self.said(slot: slot, sequence: sequence) { return request }
        let key = SpanRegistration(slot: slot, sequence: sequence).packed
        return Self.ended.withLock { $0.requests[key] }
    }

    /// What a span that ended with a stall inside it said last (a Hummingbird span names its route
    /// only as it ends, before the stall's last report): kept for the monitor's later reports, the
    /// latest `maximumEnded`.
    private static let ended = Mutex<(requests: [UInt64: StallReport.Request], order: [UInt64])>(([:], []))
    static let maximumEnded = 256

    /// Keeps what the span of `registration` says now, as it ends with a stall noted inside it.
    static func keepEnded(_ registration: SpanRegistration) {
        guard let request = said(slot: registration.slot, sequence: registration.sequence) else { return }
        ended.withLock { ended in
            if ended.order.count >= maximumEnded { ended.requests[ended.order.removeFirst()] = nil }
            ended.requests[registration.packed] = request
            ended.order.append(registration.packed)
        }
    }

    /// What the span of registration `sequence` of `slot` says now, while it runs.
    private static func said(slot: Int32, sequence: UInt64) -> StallReport.Request? {
        var request = StallReport.Request()
        var registration = SpanRegistration(slot: slot, sequence: sequence)
        for depth in 0..<maximumDepth {
            // The copy is taken under the slot's lock; the wrapped span is read outside it.
            guard var said = SpanTable.withParts(registration, { SpanSaid($0) }) else {
                if depth == 0 { return nil }
                break
            }
            said.readWrapped()
            said.fill(&request, innermost: depth == 0)
            guard said.parent.isRegistered else { break }
            registration = said.parent
        }
        return request
    }

    func noteStall(_ note: StallNote, slot: Int32, sequence: UInt64) {
        _ = SpanTable.withParts(SpanRegistration(slot: slot, sequence: sequence)) { parts in
            parts.pointee.stalled.store(true, ordering: .releasing)
            if let index = parts.pointee.notes.firstIndex(where: { $0.stallID == note.stallID }) {
                if !parts.pointee.notes[index].ended || note.ended { parts.pointee.notes[index] = note }
            } else if parts.pointee.notes.count < Self.maximumNotes {
                parts.pointee.notes.append(note)
            }
        }
    }

    /// Stalls a span keeps for its events, at most: a span that stalls more often is broken anyway.
    static let maximumNotes = 16
}

/// A copy of a span's parts, taken under its slot's lock.
private struct SpanSaid {
    var operation: String
    var attributeSets: [SpanAttributes]
    var trace: TraceParent?
    var parent: SpanRegistration
    var wrapped: HeldSpan?

    init(_ parts: UnsafeMutablePointer<SpanParts>) {
        operation = parts.pointee.operation
        attributeSets = Array(
            UnsafeBufferPointer(start: parts.pointee.attributeSets, count: parts.pointee.attributeCount))
        trace = parts.pointee.trace
        parent = parts.pointee.parent
        wrapped = parts.pointee.wrapped
    }

    /// The wrapped tracer's span, read outside the slot's lock: its name, attributes and W3C IDs.
    mutating func readWrapped() {
        guard let wrapped else { return }
        (operation, attributeSets) = wrapped.with { ($0.operationName, [$0.attributes]) }
        trace = wrapped.traceParent
    }

    /// Fills the parts of `request` still empty from this span: its name and span ID only for the
    /// innermost span, the request's parts from any.
    func fill(_ request: inout StallReport.Request, innermost: Bool) {
        let kept = KeptAttributes(attributeSets)
        if innermost {
            request.operation = operation
            if let trace { (request.traceID, request.spanID) = (trace.traceID, trace.spanIDText) }
        }
        if request.method.isEmpty { request.method = kept.method ?? "" }
        if request.route.isEmpty { request.route = kept.route ?? "" }
        if request.path.isEmpty { request.path = kept.path ?? "" }
        if request.rpcMethod.isEmpty, let method = kept.rpcMethod {
            let service = kept.rpcService ?? ""
            request.rpcMethod = service.isEmpty || method.isEmpty ? method : "\(service)/\(method)"
        }
    }
}

extension StallNote {
    /// The `stall` event of this stall, on a span that ends now.
    func spanEvent(wallNow: UInt64, monotonicNow: UInt64) -> SpanEvent {
        var note = self
        // A span often ends before the monitor has seen its stall end. The pool thread stamps the
        // end of a stalled job (a Vapor handler's task ends before the middleware's span); else the
        // stall lasted at most until now (a Hummingbird span ends inside the job that stalled,
        // which is still running).
        if !note.ended {
            if let end = SpanTable.poolJobEnd(threadID: note.threadID, start: note.startNanoseconds) {
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
