/// Text from the journal made safe to print on a terminal.
///
/// Journal fields are written by anyone: a frame or a unit name can carry `ESC[2J` or an OSC
/// title sequence. Human output shows every character a terminal could act on as a visible escape.
package enum DisplayText {
    /// `text` with every control character escaped visibly: C0 and DEL as `\x1b`, C1 (which
    /// includes the 8-bit CSI and OSC) as `\u009b`, the bidirectional overrides and isolates and
    /// the line and paragraph separators as `\u202e`, and the backslash itself as `\\`, so an
    /// escape printed can always be told from the text.
    package static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsEscape) else { return text }
        var result = ""
        result.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            guard needsEscape(scalar) else {
                result.unicodeScalars.append(scalar)
                continue
            }
            let value = scalar.value
            if value == 0x5C {
                result += "\\\\"
            } else if value < 0x80 {
                result += "\\x" + hex(value, digits: 2)
            } else {
                result += "\\u" + hex(value, digits: 4)
            }
        }
        return result
    }

    /// `text` escaped (see ``escaped(_:)``) and cut to at most `limit` Unicode scalars, ending in
    /// `…` when cut. Counting scalars, not characters, bounds a string of combining marks too.
    package static func cell(_ text: String, limit: Int) -> String {
        let shown = escaped(text)
        let scalars = shown.unicodeScalars
        guard scalars.count > limit else { return shown }
        var result = String(String.UnicodeScalarView(scalars.prefix(max(0, limit - 1))))
        result += "…"
        return result
    }

    /// How many columns ``cell(_:limit:)``'s result takes, counted as its Unicode scalars.
    package static func width(_ text: String) -> Int { text.unicodeScalars.count }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        scalar == "\\" || isControl(scalar)
    }

    /// Whether a terminal (or a reader) could take `scalar` for something other than text: C0
    /// (tab and newline too), DEL, C1, the bidirectional marks, embeddings, overrides and
    /// isolates, and the line and paragraph separators. Every output of text from the journal
    /// shows these as visible escapes.
    package static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F: true
        case 0x061C, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    private static func hex(_ value: UInt32, digits: Int) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }
}
