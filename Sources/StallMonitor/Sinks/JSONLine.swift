import StallJournal

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An event as one line of JSON, for a log collector that makes each line a record (Docker's
/// json-file driver, Kubernetes' container logs, Fluent Bit, Vector, promtail, the Datadog agent).
///
/// The object holds the journal entry's fields, named as the catalog names them (`MESSAGE_ID`,
/// `PRIORITY`, `SYSLOG_IDENTIFIER`, `STALL_DURATION_USEC`, …), each value the string the journal
/// holds, but for `MESSAGE`, which is `message`; before them `time` (RFC 3339, UTC, microseconds:
/// when the line was made) and `level` (syslog's name of `PRIORITY`: `crit`, `err`, `warning`,
/// `notice`, `info`). Values stay strings, as `journalctl -o json` gives them, so that one decoder
/// reads both and no reader guesses at a number's precision.
///
/// A line is at most ``maximumBytes``, its newline included: longer ones are cut, `STALL_STACKS`
/// first (left out whole: a part of it would mean other stacks), then `STALL_BACKTRACE` at a frame,
/// then the longest value left; a value that was cut ends in ``FieldLimits/truncationMarker``, and
/// `truncated` names every field cut or left out, comma-separated.
package enum JSONLine {
    /// Docker's json-file driver, and containerd's CRI logs, split longer lines into records of
    /// their own.
    package static let maximumBytes = 16 * 1024
    /// The key that names the fields cut to fit ``maximumBytes``.
    package static let truncatedKey = "truncated"

    /// syslog(3)'s names of the priorities, 0 to 7.
    static let levelNames = ["emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"]

    /// The line of an event's journal fields (see ``JournalSink/fields(for:syslogIdentifier:)``),
    /// its newline included; empty when there are none.
    /// - Parameter time: Seconds and nanoseconds since the epoch (`CLOCK_REALTIME`).
    package static func encode(_ fields: [JournalField], time: (seconds: Int, nanoseconds: Int)) -> [UInt8] {
        guard !fields.isEmpty else { return [] }
        var values = fields.map { Value(field: $0) }
        let priority = fields.first { $0.name == "PRIORITY" }.flatMap { Int($0.value) } ?? 6
        let level = levelNames[min(max(priority, 0), 7)]
        // `{"time":"2026-11-27T05:23:45.123456Z","level":"warning"` and `}\n`.
        let fixed = 2 + "\"time\":\"\"".utf8.count + 27 + ",\"level\":\"\"".utf8.count + level.utf8.count + 1
        var truncated: [String] = []
        var size = fixed + values.reduce(0) { $0 + $1.cost }
        if size > maximumBytes {
            // Room for `,"truncated":"…"`, every field name at worst.
            let reserve =
                ",\"\(truncatedKey)\":\"\"".utf8.count + values.reduce(0) { $0 + $1.field.name.utf8.count + 1 }
            while size + reserve > maximumBytes, let cut = cutOne(&values, excess: size + reserve - maximumBytes) {
                if !truncated.contains(cut) { truncated.append(cut) }
                size = fixed + values.reduce(0) { $0 + $1.cost }
            }
        }
        var line: [UInt8] = []
        line.reserveCapacity(size + 64)
        line.append(contentsOf: "{\"time\":\"".utf8)
        appendTime(time, to: &line)
        line.append(contentsOf: "\",\"level\":\"".utf8)
        line.append(contentsOf: level.utf8)
        line.append(UInt8(ascii: "\""))
        for value in values {
            line.append(UInt8(ascii: ","))
            line.append(UInt8(ascii: "\""))
            line.append(contentsOf: value.key.utf8)
            line.append(contentsOf: "\":\"".utf8)
            if value.escapedBytes == value.field.value.utf8.count {
                line.append(contentsOf: value.field.value.utf8)  // nothing to escape: most values
            } else {
                appendEscaped(value.field.value, to: &line)
            }
            line.append(UInt8(ascii: "\""))
        }
        if !truncated.isEmpty {
            line.append(contentsOf: ",\"\(truncatedKey)\":\"\(truncated.joined(separator: ","))\"".utf8)
        }
        line.append(contentsOf: "}\n".utf8)
        return line
    }

    /// The current time, as ``encode(_:time:)`` takes it.
    package static func now() -> (seconds: Int, nanoseconds: Int) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return (Int(now.tv_sec), Int(now.tv_nsec))
    }

    /// A field as the line writes it, and what it costs there: `,"KEY":"VALUE"`.
    struct Value {
        var field: JournalField
        var key: String
        var escapedBytes: Int

        init(field: JournalField) {
            self.field = field
            self.key = field.name == "MESSAGE" ? "message" : field.name
            self.escapedBytes = JSONLine.escapedCount(field.value)
        }

        var cost: Int { 6 + key.utf8.count + escapedBytes }
    }

    /// Cuts or leaves out one value so that the line loses at least `excess` bytes where it can;
    /// returns the field's name, or `nil` when nothing is left to cut.
    private static func cutOne(_ values: inout [Value], excess: Int) -> String? {
        if let index = values.firstIndex(where: { $0.field.name == StallRecord.Field.stacks }) {
            return values.remove(at: index).field.name
        }
        let marker = FieldLimits.truncationMarker
        let protected: Set<String> = ["MESSAGE_ID", "PRIORITY", StallRecord.Field.id, StallRecord.Field.event]
        if let index = values.firstIndex(where: {
            $0.field.name == StallRecord.Field.backtrace && $0.escapedBytes > excess + 64
        }) {
            // Whole frames from the top, as many as fit.
            let budget = values[index].escapedBytes - excess - marker.utf8.count
            var kept = ""
            var used = 0
            for line in values[index].field.value.split(separator: "\n", omittingEmptySubsequences: false) {
                let cost = escapedCount(line) + 2
                if used + cost > budget { break }
                kept += line
                kept += "\n"
                used += cost
            }
            values[index] = Value(field: JournalField(values[index].field.name, kept + marker))
            return values[index].field.name
        }
        guard
            let index = values.indices.filter({ !protected.contains(values[$0].field.name) })
                .max(by: { values[$0].escapedBytes < values[$1].escapedBytes }),
            values[index].escapedBytes > marker.utf8.count
        else { return nil }
        let budget = max(0, values[index].escapedBytes - excess - marker.utf8.count)
        var kept = ""
        var used = 0
        for scalar in values[index].field.value.unicodeScalars {
            let cost = scalar.value < 0x80 ? escapedWidth(UInt8(scalar.value)) : UTF8.width(scalar)
            if used + cost > budget { break }
            kept.unicodeScalars.append(scalar)
            used += cost
        }
        values[index] = Value(field: JournalField(values[index].field.name, kept + marker))
        return values[index].field.name
    }

    /// Bytes a byte of UTF-8 takes inside a JSON string.
    @inline(__always)
    static func escapedWidth(_ byte: UInt8) -> Int {
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"),
            0x08, 0x0C:
            2
        case 0..<0x20: 6
        default: 1
        }
    }

    static func escapedCount(_ text: Substring) -> Int {
        var count = 0
        for byte in text.utf8 { count += escapedWidth(byte) }
        return count
    }

    static func escapedCount(_ text: String) -> Int {
        var text = text
        return text.withUTF8 { bytes in
            var count = bytes.count
            for byte in bytes where byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                count += escapedWidth(byte) - 1
            }
            return count
        }
    }

    /// `text` inside a JSON string: `"` and `\` escaped, control characters as `\n`, `\t`, … or
    /// `\u00XX`; the rest as its UTF-8, copied a run at a time.
    static func appendEscaped(_ text: String, to line: inout [UInt8]) {
        var text = text
        text.withUTF8 { bytes in
            var run = 0
            for index in bytes.indices {
                let byte = bytes[index]
                guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
                if run < index { line.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[run..<index])) }
                run = index + 1
                line.append(UInt8(ascii: "\\"))
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): line.append(byte)
                case UInt8(ascii: "\n"): line.append(UInt8(ascii: "n"))
                case UInt8(ascii: "\r"): line.append(UInt8(ascii: "r"))
                case UInt8(ascii: "\t"): line.append(UInt8(ascii: "t"))
                case 0x08: line.append(UInt8(ascii: "b"))
                case 0x0C: line.append(UInt8(ascii: "f"))
                default:
                    line.append(UInt8(ascii: "u"))
                    line.append(UInt8(ascii: "0"))
                    line.append(UInt8(ascii: "0"))
                    line.append(hexDigit(byte >> 4))
                    line.append(hexDigit(byte & 0xF))
                }
            }
            if run < bytes.count { line.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[run...])) }
        }
    }

    @inline(__always)
    private static func hexDigit(_ value: UInt8) -> UInt8 {
        value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10
    }

    /// `2026-11-27T05:23:45.123456Z`: 27 bytes.
    static func appendTime(_ time: (seconds: Int, nanoseconds: Int), to line: inout [UInt8]) {
        var seconds = time_t(time.seconds)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func digits(_ value: Int, _ count: Int) {
            var divisor = 1
            for _ in 1..<count { divisor *= 10 }
            var value = value
            for _ in 0..<count {
                line.append(UInt8(ascii: "0") + UInt8(value / divisor % 10))
                value %= divisor
                divisor /= 10
                if divisor == 0 { break }
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        line.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        line.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        line.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        line.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        line.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        line.append(UInt8(ascii: "."))
        digits(time.nanoseconds / 1000, 6)
        line.append(UInt8(ascii: "Z"))
    }
}
