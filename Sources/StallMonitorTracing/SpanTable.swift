import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Tracing

#if STALLMON_LINUX
import CStallCapture
#endif

/// A span's registration in the monitor's table of requests in flight: its slot and registration
/// number there.
struct SpanRegistration: Sendable, Equatable {
    var slot: Int32
    var sequence: UInt64

    /// Not registered: no monitor to tell (not Linux), or the table is full near the key.
    static let none = SpanRegistration(slot: -1, sequence: 0)

    var isRegistered: Bool { slot >= 0 }

    /// In the low 59 bits of a word (`packedMask`): the slot in 16 (all ones: none), the
    /// registration number in the 43 that it counts in.
    var packed: UInt64 { UInt64(UInt16(truncatingIfNeeded: slot)) | (sequence & Self.sequenceMask) << 16 }
    private static let sequenceMask: UInt64 = (1 << 43) - 1
    static let packedMask: UInt64 = (1 << 59) - 1

    init(slot: Int32, sequence: UInt64) {
        self.slot = slot
        self.sequence = sequence
    }

    init(packed: UInt64) {
        let slot = UInt16(truncatingIfNeeded: packed)
        self.init(slot: slot == .max ? -1 : Int32(slot), sequence: (packed >> 16) & Self.sequenceMask)
    }
}

/// The monitor's table of requests in flight (CStallCapture's `stallmon_request_*`): where a span
/// says which task or thread serves it, and what a report says of it. Each slot of the table has a
/// ``SpanParts`` of its own, made by its first span and reused by every later one, so that a span
/// allocates nothing; a span writes its parts and a reader copies them under the slot's lock.
/// `SpanParts` are reached through the C table by pointer and never freed (a slot's storage lives
/// as long as the process; at most one per slot).
/// Elsewhere than on Linux there is no monitor to tell: spans register nowhere.
enum SpanTable {
    // MARK: A span's registration

    /// What a span starting now in the calling task would be inside: the span its task serves
    /// (none outside a task: a span registered under a thread, an event loop's, covers all the loop
    /// runs until it ends, other connections' work too, and is no parent of theirs).
    struct Around {
        var registration: SpanRegistration
        var depth: UInt32
    }

    /// The calling task or thread's key (task address, or thread ID tagged with 1).
    static func currentKey() -> UInt64 {
        #if STALLMON_LINUX
        stallmon_request_current_key()
        #else
        0
        #endif
    }

    /// Whether `key` is a task's: a span there is a parent of the task's next spans, and a span
    /// outside a task needs a ``ThreadRegistration`` to withdraw it if it is dropped unended.
    static func isTask(_ key: UInt64) -> Bool { key != 0 && key & 1 == 0 }

    /// The innermost span the task `key` serves now.
    static func around(_ key: UInt64) -> Around? {
        #if STALLMON_LINUX
        guard isTask(key) else { return nil }
        var key = key
        var found = stallmon_request_found()
        guard stallmon_request_find(&key, 1, &found) != 0 else { return nil }
        return Around(registration: SpanRegistration(slot: found.slot, sequence: found.sequence), depth: found.depth)
        #else
        return nil
        #endif
    }

    /// Registers a span of the calling task or thread (whose key it returns), inside the span its
    /// task serves now, and has `write` write what it says into its slot's parts: its name and
    /// trace alone, or the wrapped tracer's span. `write` is given that span, and may set it aside:
    /// the span's parent (a span of another trace is no child of it). It replaces the slot's last
    /// span's wrapped tracer's span, which no reader holds any more (see ``SpanParts/wrapped``).
    ///
    /// The parts are written before the registration is published, without their lock: no reader
    /// copies them before.
    @inline(__always)
    static func register(
        _ write: (UnsafeMutablePointer<SpanParts>, inout Around?) -> Void
    ) -> (key: UInt64, registration: SpanRegistration) {
        #if STALLMON_LINUX
        var key: UInt64 = 0
        var found = stallmon_request_found()
        var sequence: UInt64 = 0
        var pointer: UnsafeMutableRawPointer? = nil
        let slot = stallmon_request_register_current(&key, &found, &sequence, &pointer)
        guard slot >= 0 else { return (key, .none) }
        let parts: UnsafeMutablePointer<SpanParts>
        if let pointer {
            parts = pointer.assumingMemoryBound(to: SpanParts.self)
        } else {
            parts = .allocate(capacity: 1)
            parts.initialize(to: SpanParts())
            stallmon_request_set_parts(slot, parts)
        }
        parts.pointee.attributeCount = 0
        if parts.pointee.stalled.load(ordering: .relaxed) {
            parts.pointee.notes = []
            parts.pointee.stalled.store(false, ordering: .relaxed)
        }
        var around =
            found.slot >= 0
            ? Around(registration: SpanRegistration(slot: found.slot, sequence: found.sequence), depth: found.depth)
            : nil
        write(parts, &around)
        parts.pointee.parent = around?.registration ?? .none
        stallmon_request_publish(slot, sequence)
        return (key, SpanRegistration(slot: slot, sequence: sequence))
        #else
        return (0, .none)
        #endif
    }

    /// Withdraws `registration`: stalls from here on are not its span's. Returns the notes of the
    /// stalls inside it; none when it was withdrawn already (a copy of the span ended it).
    ///
    /// A wrapped tracer's span stays in the slot's parts until the slot's next span starts, which
    /// releases it: readers that found the span copy it under the slot's lock, and the next span
    /// waits for that lock to be free, so the end takes no lock.
    static func withdraw(_ registration: SpanRegistration) -> [StallNote] {
        #if STALLMON_LINUX
        guard registration.isRegistered, let pointer = stallmon_request_parts(registration.slot) else { return [] }
        let parts = pointer.assumingMemoryBound(to: SpanParts.self)
        guard parts.pointee.stalled.load(ordering: .acquiring) else {
            _ = stallmon_request_withdraw(registration.slot, registration.sequence)
            return []
        }
        SpanTableReader.keepEnded(registration)
        // Once the readers that found the span are done: the notes come out, to be released outside
        // the lock.
        var notes: [StallNote] = []
        stallmon_request_lock(registration.slot)
        if stallmon_request_withdraw(registration.slot, registration.sequence) != 0 {
            swap(&notes, &parts.pointee.notes)
            parts.pointee.stalled.store(false, ordering: .relaxed)
        }
        stallmon_request_unlock(registration.slot)
        return notes
        #else
        return []
        #endif
    }

    // MARK: What a span says

    /// Runs `body` on the parts of `registration` under the slot's lock, if the slot still holds it.
    @inline(__always)
    static func withParts<T>(_ registration: SpanRegistration, _ body: (UnsafeMutablePointer<SpanParts>) -> T) -> T? {
        #if STALLMON_LINUX
        guard registration.isRegistered,
            let pointer = stallmon_request_lock_held(registration.slot, registration.sequence)
        else { return nil }
        defer { stallmon_request_unlock(registration.slot) }
        return body(pointer.assumingMemoryBound(to: SpanParts.self))
        #else
        return nil
        #endif
    }

    /// Keeps `attributes`, set on the span of `registration` alone, for a report to read: as they
    /// come, a retain, since the monitor reads them only for a stall.
    static func keepAttributes(_ attributes: SpanAttributes, of registration: SpanRegistration) {
        guard registration.isRegistered, !attributes.isEmpty else { return }
        // What the set replaces (an earlier span's) is released after the lock: its values' deinit
        // is the program's code.
        var replaced: SpanAttributes? = nil
        _ = withParts(registration) { parts in
            let count = parts.pointee.attributeCount
            if count < SpanParts.maximumAttributeSets {
                let set = parts.pointee.attributeSets + count
                replaced = set.move()
                set.initialize(to: attributes)
                parts.pointee.attributeCount = count + 1
            } else {
                parts.pointee.attributeSets[count - 1].merge(attributes)
            }
        }
        _ = replaced
    }

    /// The trace of the span of `registration`, alone.
    static func trace(of registration: SpanRegistration) -> TraceParent? {
        withParts(registration) { $0.pointee.trace } ?? nil
    }

    /// The trace context of the span the calling task serves: what goes out with its requests.
    static func currentTrace() -> TraceParent? {
        around(currentKey()).flatMap { trace(of: $0.registration) }
    }

    // MARK: The slots' parts

    // MARK: Helpers

    /// When the pool thread `threadID` ended the job it ran at `start` that the monitor watched as
    /// a stall, if it has.
    static func poolJobEnd(threadID: Int, start: UInt64) -> UInt64? {
        #if STALLMON_LINUX
        let end = stallmon_pool_stall_end_of_thread(pid_t(threadID), start)
        return end == 0 ? nil : end
        #else
        return nil
        #endif
    }

    /// IDs for a new span: its trace's, unless `trace` is nil, and its own; never 0.
    static func newIDs(_ trace: UnsafeMutablePointer<(UInt64, UInt64)>?, _ span: inout UInt64) {
        #if STALLMON_LINUX
        if let trace {
            trace.withMemoryRebound(to: UInt64.self, capacity: 2) { stallmon_request_new_ids($0, $0 + 1, &span) }
        } else {
            stallmon_request_new_ids(nil, nil, &span)
        }
        #else
        func nonZero() -> UInt64 {
            while true {
                let value = UInt64.random(in: .min ... .max)
                if value != 0 { return value }
            }
        }
        trace?.pointee = (nonZero(), nonZero())
        span = nonZero()
        #endif
    }
}

/// What the spans of one slot say, one span at a time: read by the monitor under the slot's lock
/// while the slot holds the reader's registration, and written under it too, but for a span's
/// start, which comes before the registration is published. Made once per slot and never freed;
/// reached by pointer, so that no access is checked for exclusivity at run time.
struct SpanParts: ~Copyable {
    /// Alone: the span's name, and its attributes as they were set (a report reads a few): the
    /// first `attributeCount` sets. The sets past them are an earlier span's, released as they are
    /// overwritten.
    var operation = ""
    let attributeSets: UnsafeMutablePointer<SpanAttributes>
    var attributeCount = 0
    /// The sets of attributes kept as they come, at most: past them, the last is merged into.
    static let maximumAttributeSets = 8
    /// Alone: the span's trace context.
    var trace: TraceParent?
    /// The span its task served when it started: the request's method and route, when this span
    /// (a database call's, say) has none of its own.
    var parent = SpanRegistration.none
    /// Wrapping: the tracer's span (released by the slot's next span: see `SpanTable.withdraw`).
    var wrapped: HeldSpan?
    /// Stalls inside the span, for its events; `stalled` once there is one.
    var notes: [StallNote] = []
    let stalled = Atomic<Bool>(false)

    init() {
        attributeSets = .allocate(capacity: Self.maximumAttributeSets)
        attributeSets.initialize(repeating: [:], count: Self.maximumAttributeSets)
    }
}

/// The attributes a report reads, picked from a span's attributes: the current names before the
/// older ones (`http.method`, `http.target`), later sets before earlier ones.
struct KeptAttributes {
    private(set) var route: String?
    private(set) var rpcMethod: String?
    private(set) var rpcService: String?
    private var requestMethod: String?
    private var olderMethod: String?
    private var urlPath: String?
    private var olderTarget: String?

    var method: String? { requestMethod ?? olderMethod }
    var path: String? { urlPath ?? olderTarget }

    init(_ sets: [SpanAttributes]) {
        for attributes in sets { attributes.forEach { name, value in keep(name, value) } }
    }

    private mutating func keep(_ name: String, _ value: SpanAttribute) {
        switch name {
        case "http.request.method": requestMethod = Self.text(value)
        case "http.method": olderMethod = Self.text(value)
        case "http.route": route = Self.text(value)
        case "url.path": urlPath = Self.text(value)
        case "http.target": olderTarget = Self.text(value)
        case "rpc.method": rpcMethod = Self.text(value)
        case "rpc.service": rpcService = Self.text(value)
        default: break
        }
    }

    private static func text(_ value: SpanAttribute) -> String {
        switch value {
        case .string(let value): value
        case .stringConvertible(let value): value.description
        default: "\(value)"
        }
    }
}

/// The registration of a span outside a task, and the object that holds its wrapped tracer's span
/// (the span itself, a ``SpanBox`` or an ``IndirectSpan``: see ``WrappingTracer``). A thread's
/// registrations never lapse by themselves (a task's do when the task ends), so a span dropped
/// unended there would name every later stall of its thread.
final class ThreadSpanKeeper: @unchecked Sendable {
    private let registration: SpanRegistration
    let wrapped: AnyObject?

    init(_ registration: SpanRegistration, wrapped: AnyObject?) {
        self.registration = registration
        self.wrapped = wrapped
    }

    deinit {
        _ = SpanTable.withdraw(registration)
    }
}
