/// One `NAME=value` field of a journal entry.
package struct JournalField: Sendable, Hashable {
    package var name: String
    package var value: String

    package init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }

    /// Whether journald accepts `name`: `[A-Z0-9_]{1,64}`, not starting with `_` or a digit.
    /// journald silently drops fields with other names.
    package static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...64).contains(bytes.count), let first = bytes.first else { return false }
        guard first != UInt8(ascii: "_"), !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else {
            return false
        }
        return bytes.allSatisfy { byte in
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: "_")
        }
    }
}
