/// The bounds of stallmon's journal fields: every reader holds entries to them, every writer
/// clamps to them.
///
/// Any local user can write journal entries, with stallmon's MESSAGE_IDs and any fields, so every
/// value read back is hostile until checked. A value outside its bound makes the entry malformed
/// (``JournalDecodingError`` names the field and the value), except the identity of the sender
/// (``identifierBytes``), which is cut with a marker: the entry still counts, under a shortened name.
package enum FieldLimits {
    /// The longest duration any `…_USEC` field may hold: 366 days.
    package static let maximumMicroseconds: UInt64 = 366 * 86_400 * 1_000_000
    /// The largest count (samples, suppressed reports, stalls, rate-limit burst): `UInt32.max`,
    /// 49 days of samples at the smallest interval (1 ms). Summing two billion of them still fits
    /// an `Int`.
    package static let maximumCount = Int(UInt32.max)
    /// Thread ids: Linux's largest `pid_max`, 2^22.
    package static let threadIDs = 1...4_194_304
    /// syslog(3) priorities.
    package static let priorities = 0...7
    /// `STALL_FINGERPRINT`: exactly this many lowercase hex digits.
    package static let fingerprintDigits = 16
    /// `STALL_ID`: exactly this many lowercase hex digits.
    package static let stallIDDigits = 32
    /// A W3C trace ID (`STALL_TRACE_ID`) and span ID (`STALL_SPAN_ID`), in lowercase hex.
    package static let traceIDDigits = 32
    package static let spanIDDigits = 16
    /// `MESSAGE`, in bytes.
    package static let messageBytes = 2048
    /// `STALL_FRAME`, in bytes.
    package static let frameBytes = 1024
    /// `STALL_BACKTRACE`, in bytes, as readers accept it: `journalctl -o json` prints `null` for
    /// longer fields unless `--all` is given.
    package static let backtraceBytes = 4096
    /// `STALL_STACKS`, in bytes, for the same reason as ``backtraceBytes``.
    package static let stacksBytes = 4096
    /// `STALL_BACKTRACE`, in bytes, as writers fill it: journalctl's 4096 bytes count the field's
    /// `NAME=` too, so a value of ``backtraceBytes`` (which a SwiftNIO loop's 64 frames reach) came
    /// out `null`. Readers still accept ``backtraceBytes``, which earlier writers filled.
    package static let backtraceWriteBytes = 4095 - "STALL_BACKTRACE=".utf8.count
    /// `STALL_STACKS`, in bytes, as writers fill it, for the same reason as ``backtraceWriteBytes``.
    package static let stacksWriteBytes = 4095 - "STALL_STACKS=".utf8.count
    /// `SYSLOG_IDENTIFIER` and the unit (`_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`), in bytes; systemd's
    /// own unit names are at most 256. Longer ones are cut, ending in ``truncationMarker``.
    package static let identifierBytes = 256
    /// `STALL_LOOP` and `STALL_RUNLOOP_MODE`, in bytes.
    package static let nameBytes = 256
    /// `STALL_ACTIVITY`, `STALL_CALLOUT`, `STALL_THREAD_STATE` and `STALL_THREAD_SYSCALL`, in bytes.
    package static let keywordBytes = 64
    /// `STALL_THREAD_WCHAN` (a kernel symbol), in bytes.
    package static let waitChannelBytes = 512
    /// The reader keeps at most this many bytes of any field, so a huge field costs no memory; any
    /// field the schema reads is far shorter, so a cut one is still rejected.
    package static let readBytes = 65_536
    /// Ends a value that was cut.
    package static let truncationMarker = "…"

    /// `text` cut to at most `bytes` bytes of UTF-8 on a character boundary, ending in
    /// ``truncationMarker`` when it was cut.
    package static func clamp(_ text: String, toBytes bytes: Int) -> String {
        guard text.utf8.count > bytes else { return text }
        let budget = max(0, bytes - truncationMarker.utf8.count)
        var result = ""
        var used = 0
        for scalar in text.unicodeScalars {
            let cost = UTF8.width(scalar)
            if used + cost > budget { break }
            result.unicodeScalars.append(scalar)
            used += cost
        }
        return result + truncationMarker
    }

    /// A sender's name (`SYSLOG_IDENTIFIER`, a unit) cut to ``identifierBytes``.
    package static func identifier(_ text: String) -> String { clamp(text, toBytes: identifierBytes) }

    /// A duration clamped to ``maximumMicroseconds``.
    package static func microseconds(_ value: UInt64) -> UInt64 { min(value, maximumMicroseconds) }

    /// A count clamped to `0...`` maximumCount``.
    package static func count(_ value: Int) -> Int { min(max(value, 0), maximumCount) }

    /// Whether `text` is a W3C Trace Context trace or span ID: exactly `digits` lowercase hex
    /// digits, not all zero (the all-zero ID is invalid there: no trace, or no span).
    package static func isTraceContextID(_ text: String, digits: Int) -> Bool {
        isLowercaseHex(text, digits: digits) && text.utf8.contains { $0 != UInt8(ascii: "0") }
    }

    /// Whether `text` is exactly `digits` lowercase hex digits.
    package static func isLowercaseHex(_ text: String, digits: Int) -> Bool {
        text.utf8.count == digits
            && text.utf8.allSatisfy {
                (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                    || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0)
            }
    }
}

/// Reads the fields of one entry, holding each to its bound.
struct FieldReader {
    let fields: [String: String]

    func optionalString(_ name: String, maximumBytes: Int) throws(JournalDecodingError) -> String? {
        guard let value = fields[name] else { return nil }
        let length = value.utf8.count
        guard length <= maximumBytes else {
            throw JournalDecodingError(
                field: name, value: value,
                reason: "\(length) bytes long, longer than the \(maximumBytes) allowed")
        }
        return value
    }

    func string(_ name: String, maximumBytes: Int) throws(JournalDecodingError) -> String {
        guard let value = try optionalString(name, maximumBytes: maximumBytes) else {
            throw JournalDecodingError(field: name, value: nil, reason: "missing")
        }
        return value
    }

    /// A sender's name: never malformed, cut to ``FieldLimits/identifierBytes`` with a marker.
    func identifier(_ name: String) -> String? { fields[name].map(FieldLimits.identifier) }

    /// Exactly `digits` lowercase hex digits.
    func hex(_ name: String, digits: Int) throws(JournalDecodingError) -> String {
        guard let value = fields[name] else { throw JournalDecodingError(field: name, value: nil, reason: "missing") }
        guard FieldLimits.isLowercaseHex(value, digits: digits) else {
            throw JournalDecodingError(field: name, value: value, reason: "not \(digits) lowercase hex digits")
        }
        return value
    }

    func optionalHex(_ name: String, digits: Int) throws(JournalDecodingError) -> String? {
        guard fields[name] != nil else { return nil }
        return try hex(name, digits: digits)
    }

    /// A W3C trace or span ID (``FieldLimits/isTraceContextID(_:digits:)``), where the entry has one.
    func optionalTraceContextID(_ name: String, digits: Int) throws(JournalDecodingError) -> String? {
        guard let value = try optionalHex(name, digits: digits) else { return nil }
        guard FieldLimits.isTraceContextID(value, digits: digits) else {
            throw JournalDecodingError(
                field: name, value: value, reason: "all zero, an invalid ID in W3C Trace Context")
        }
        return value
    }

    func integer(_ name: String, in range: ClosedRange<Int64>) throws(JournalDecodingError) -> Int64 {
        guard let text = fields[name] else { throw JournalDecodingError(field: name, value: nil, reason: "missing") }
        guard text.utf8.count <= 20, let value = Int64(text) else {
            throw JournalDecodingError(field: name, value: text, reason: "not an integer")
        }
        guard range.contains(value) else {
            throw JournalDecodingError(
                field: name, value: text, reason: "out of range (\(range.lowerBound)…\(range.upperBound))")
        }
        return value
    }

    func optionalInteger(_ name: String, in range: ClosedRange<Int64>) throws(JournalDecodingError) -> Int64? {
        guard fields[name] != nil else { return nil }
        return try integer(name, in: range)
    }

    /// A duration in microseconds, at most ``FieldLimits/maximumMicroseconds``.
    func microseconds(_ name: String) throws(JournalDecodingError) -> UInt64 {
        UInt64(try integer(name, in: 0...Int64(FieldLimits.maximumMicroseconds)))
    }

    func optionalMicroseconds(_ name: String) throws(JournalDecodingError) -> UInt64? {
        try optionalInteger(name, in: 0...Int64(FieldLimits.maximumMicroseconds)).map { UInt64($0) }
    }

    /// A count, `0...`` FieldLimits/maximumCount``.
    func count(_ name: String) throws(JournalDecodingError) -> Int {
        Int(try integer(name, in: 0...Int64(FieldLimits.maximumCount)))
    }

    func optionalCount(_ name: String) throws(JournalDecodingError) -> Int? {
        try optionalInteger(name, in: 0...Int64(FieldLimits.maximumCount)).map { Int($0) }
    }

    func threadID(_ name: String) throws(JournalDecodingError) -> Int {
        let range = FieldLimits.threadIDs
        return Int(try integer(name, in: Int64(range.lowerBound)...Int64(range.upperBound)))
    }

    func priority() throws(JournalDecodingError) -> Int {
        let range = FieldLimits.priorities
        return Int(try integer("PRIORITY", in: Int64(range.lowerBound)...Int64(range.upperBound)))
    }
}
