import Instrumentation

/// A W3C trace context (`traceparent: 00-<trace-id>-<parent-id>-<flags>`): the trace and the span
/// that the context's next span is a child of.
struct TraceParent: Sendable, Hashable {
    static let header = "traceparent"

    var traceHigh: UInt64
    var traceLow: UInt64
    var spanID: UInt64
    var flags: UInt8

    init(traceHigh: UInt64, traceLow: UInt64, spanID: UInt64, flags: UInt8) {
        self.traceHigh = traceHigh
        self.traceLow = traceLow
        self.spanID = spanID
        self.flags = flags
    }

    /// Parses a `traceparent` value; `nil` when it is not version 00 (or a later version's first
    /// four fields), or its IDs are zero or not lowercase hex.
    init?(_ header: String) {
        let parts = header.utf8.split(separator: UInt8(ascii: "-"), omittingEmptySubsequences: false)
        guard parts.count >= 4, parts[0].count == 2, parts[1].count == 32, parts[2].count == 16, parts[3].count == 2,
            let version = Self.hex(parts[0]), version != 0xff, version != 0 || parts.count == 4,
            let high = Self.hex(parts[1].prefix(16)), let low = Self.hex(parts[1].dropFirst(16)),
            let span = Self.hex(parts[2]), let flags = Self.hex(parts[3]),
            high | low != 0, span != 0
        else { return nil }
        self.init(traceHigh: high, traceLow: low, spanID: span, flags: UInt8(flags))
    }

    var traceID: String { Self.digits(traceHigh) + Self.digits(traceLow) }
    var spanIDText: String { Self.digits(spanID) }
    var header: String { "00-\(traceID)-\(spanIDText)-\(Self.digits(UInt64(flags), count: 2))" }

    /// A new trace's first span, or a child of `parent` in its trace.
    static func child(of parent: TraceParent?) -> TraceParent {
        var span: UInt64 = 0
        if let parent {
            SpanTable.newIDs(nil, &span)
            return TraceParent(
                traceHigh: parent.traceHigh, traceLow: parent.traceLow, spanID: span, flags: parent.flags)
        }
        var trace: (UInt64, UInt64) = (0, 0)
        SpanTable.newIDs(&trace, &span)
        return TraceParent(traceHigh: trace.0, traceLow: trace.1, spanID: span, flags: 1)
    }

    private static func hex(_ bytes: some Collection<UInt8>) -> UInt64? {
        var value: UInt64 = 0
        for byte in bytes {
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            default: return nil
            }
            value = value << 4 | UInt64(digit)
        }
        return value
    }

    static func digits(_ value: UInt64, count: Int = 16) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, count - text.count)) + text
    }
}

extension InstrumentationContext {
    private enum StallmonStateKey: InstrumentationContextKey {
        typealias Value = TraceParent
        static let nameOverride: String? = "stallmon-span"
    }

    /// What `StallmonTracer` keeps in a context when it is the only tracer: the caller's trace
    /// context extracted from an incoming request.
    var stallmonTrace: TraceParent? {
        get { self[StallmonStateKey.self] }
        set { self[StallmonStateKey.self] = newValue }
    }
}
