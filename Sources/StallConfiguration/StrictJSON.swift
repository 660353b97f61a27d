/// A JSON value exactly as RFC 8259 allows it, with numbers kept as written.
///
/// Configuration files are read with this parser rather than `JSONSerialization`, which accepts
/// trailing commas, lets a repeated key silently win, and reads `true` and `1` alike: a
/// configuration file must mean exactly what it says, or be refused with the line and column.
enum StrictJSON: Sendable {
    case null
    case bool(Bool)
    /// The number's text, e.g. `1e10`; it matches JSON's number grammar.
    case number(String)
    case string(String)
    case array([StrictJSON])
    /// Members in the file's order; keys are unique.
    case object([(key: String, value: StrictJSON)])

    /// Deepest nesting accepted; configuration files need two levels.
    static let maximumDepth = 32

    /// Where and why a text is not JSON.
    struct SyntaxError: Error, Sendable, CustomStringConvertible {
        var reason: String
        var line: Int
        var column: Int
        var description: String { "\(reason) at line \(line), column \(column)" }
    }

    /// Parses one JSON value (surrounded by optional whitespace) from UTF-8 bytes.
    static func parse(_ bytes: [UInt8]) throws(SyntaxError) -> StrictJSON {
        var parser = Parser(bytes: bytes)
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { parser.index = 3 }  // a UTF-8 byte order mark
        parser.skipWhitespace()
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw parser.error("unexpected text after the value") }
        return value
    }

    /// The value as JSON text, for messages: `"a"`, `[1, 2]`.
    var text: String {
        switch self {
        case .null: return "null"
        case .bool(let value): return value ? "true" : "false"
        case .number(let text): return text
        case .string(let value): return ConfigurationValue.shownQuoted(value)
        case .array(let values): return "[" + values.map(\.text).joined(separator: ", ") + "]"
        case .object(let members):
            return "{" + members.map { "\(Self.quoted($0.key)): \($0.value.text)" }.joined(separator: ", ") + "}"
        }
    }

    static func quoted(_ value: String) -> String {
        var result = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\t": result += "\\t"
            case "\r": result += "\\r"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                let hex = String(scalar.value, radix: 16)
                result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result + "\""
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0

        func error(_ reason: String) -> SyntaxError {
            var line = 1
            var column = 1
            for byte in bytes[..<min(index, bytes.count)] {
                if byte == UInt8(ascii: "\n") {
                    line += 1
                    column = 1
                } else if byte & 0xC0 != 0x80 {  // count characters, not UTF-8 continuation bytes
                    column += 1
                }
            }
            return SyntaxError(reason: reason, line: line, column: column)
        }

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        mutating func skipWhitespace() {
            while let byte = current,
                byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\n")
                    || byte == UInt8(ascii: "\r")
            {
                index += 1
            }
        }

        mutating func value(depth: Int) throws(SyntaxError) -> StrictJSON {
            guard let byte = current else { throw error("unexpected end of file, a value was expected") }
            switch byte {
            case UInt8(ascii: "{"):
                guard depth < StrictJSON.maximumDepth else { throw error("nested too deeply") }
                return try object(depth: depth + 1)
            case UInt8(ascii: "["):
                guard depth < StrictJSON.maximumDepth else { throw error("nested too deeply") }
                return try array(depth: depth + 1)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): return try literal("true", .bool(true))
            case UInt8(ascii: "f"): return try literal("false", .bool(false))
            case UInt8(ascii: "n"): return try literal("null", .null)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
            default: throw error("unexpected character \(describe(byte)), a value was expected")
            }
        }

        func describe(_ byte: UInt8) -> String {
            (0x21...0x7E).contains(byte) ? "'\(Character(Unicode.Scalar(byte)))'" : "byte 0x\(String(byte, radix: 16))"
        }

        mutating func literal(_ word: String, _ value: StrictJSON) throws(SyntaxError) -> StrictJSON {
            let expected = Array(word.utf8)
            guard bytes[index...].starts(with: expected) else { throw error("unknown word, a value was expected") }
            index += expected.count
            return value
        }

        mutating func object(depth: Int) throws(SyntaxError) -> StrictJSON {
            index += 1  // {
            var members: [(key: String, value: StrictJSON)] = []
            var keys: Set<String> = []
            skipWhitespace()
            if current == UInt8(ascii: "}") {
                index += 1
                return .object(members)
            }
            while true {
                skipWhitespace()
                guard current == UInt8(ascii: "\"") else {
                    throw error(
                        current == UInt8(ascii: "}")
                            ? "a trailing comma before '}'" : "a key in double quotes was expected")
                }
                let keyStart = index
                let key = try string()
                guard keys.insert(key).inserted else {
                    index = keyStart
                    throw error("the key \(StrictJSON.quoted(key)) appears more than once")
                }
                skipWhitespace()
                guard current == UInt8(ascii: ":") else { throw error("':' was expected after the key") }
                index += 1
                skipWhitespace()
                members.append((key, try value(depth: depth)))
                skipWhitespace()
                switch current {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "}"):
                    index += 1
                    return .object(members)
                case nil: throw error("unexpected end of file, '}' was expected")
                default: throw error("',' or '}' was expected")
                }
            }
        }

        mutating func array(depth: Int) throws(SyntaxError) -> StrictJSON {
            index += 1  // [
            var values: [StrictJSON] = []
            skipWhitespace()
            if current == UInt8(ascii: "]") {
                index += 1
                return .array(values)
            }
            while true {
                skipWhitespace()
                if current == UInt8(ascii: "]") { throw error("a trailing comma before ']'") }
                values.append(try value(depth: depth))
                skipWhitespace()
                switch current {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "]"):
                    index += 1
                    return .array(values)
                case nil: throw error("unexpected end of file, ']' was expected")
                default: throw error("',' or ']' was expected")
                }
            }
        }

        mutating func digits() -> Int {
            let start = index
            while let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { index += 1 }
            return index - start
        }

        mutating func number() throws(SyntaxError) -> String {
            let start = index
            if current == UInt8(ascii: "-") { index += 1 }
            if current == UInt8(ascii: "0") {
                index += 1
                if let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                    throw error("a number must not start with 0")
                }
            } else if digits() == 0 {
                throw error("a digit was expected")
            }
            if current == UInt8(ascii: ".") {
                index += 1
                guard digits() > 0 else { throw error("a digit was expected after '.'") }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                index += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { throw error("a digit was expected in the exponent") }
            }
            return String(decoding: bytes[start..<index], as: UTF8.self)
        }

        mutating func hex4() throws(SyntaxError) -> UInt32 {
            guard index + 4 <= bytes.count else { throw error("four hexadecimal digits were expected after \\u") }
            var value: UInt32 = 0
            for byte in bytes[index..<index + 4] {
                guard let digit = UInt32(String(Unicode.Scalar(byte)), radix: 16) else {
                    throw error("four hexadecimal digits were expected after \\u")
                }
                value = value * 16 + digit
            }
            index += 4
            return value
        }

        mutating func string() throws(SyntaxError) -> String {
            index += 1  // "
            var scalars = String.UnicodeScalarView()
            var run = index  // start of bytes copied as they are
            func flush(_ parser: Parser, to end: Int) throws(SyntaxError) {
                guard let text = String(validating: parser.bytes[run..<end], as: UTF8.self) else {
                    throw parser.error("a string holds invalid UTF-8")
                }
                scalars.append(contentsOf: text.unicodeScalars)
            }
            while true {
                guard let byte = current else { throw error("unexpected end of file inside a string") }
                switch byte {
                case UInt8(ascii: "\""):
                    try flush(self, to: index)
                    index += 1
                    return String(scalars)
                case UInt8(ascii: "\\"):
                    try flush(self, to: index)
                    index += 1
                    guard let escaped = current else { throw error("unexpected end of file inside a string") }
                    index += 1
                    switch escaped {
                    case UInt8(ascii: "\""): scalars.append("\"")
                    case UInt8(ascii: "\\"): scalars.append("\\")
                    case UInt8(ascii: "/"): scalars.append("/")
                    case UInt8(ascii: "b"): scalars.append("\u{08}")
                    case UInt8(ascii: "f"): scalars.append("\u{0C}")
                    case UInt8(ascii: "n"): scalars.append("\n")
                    case UInt8(ascii: "r"): scalars.append("\r")
                    case UInt8(ascii: "t"): scalars.append("\t")
                    case UInt8(ascii: "u"):
                        var code = try hex4()
                        if (0xD800...0xDBFF).contains(code) {
                            guard bytes[index...].starts(with: [UInt8(ascii: "\\"), UInt8(ascii: "u")]) else {
                                throw error("a lone UTF-16 surrogate in \\u escapes")
                            }
                            index += 2
                            let low = try hex4()
                            guard (0xDC00...0xDFFF).contains(low) else {
                                throw error("a lone UTF-16 surrogate in \\u escapes")
                            }
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let scalar = Unicode.Scalar(code) else {
                            throw error("a lone UTF-16 surrogate in \\u escapes")
                        }
                        scalars.append(scalar)
                    default:
                        index -= 1
                        throw error("unknown escape \\\(Character(Unicode.Scalar(escaped)))")
                    }
                    run = index
                case 0..<0x20: throw error("a control character inside a string (write it as an escape)")
                default: index += 1
                }
            }
        }
    }
}
