import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads configuration values from a JSON file and from environment variables, and names the
/// key, the value, the reason and the source whenever one cannot be used. Shared by the monitor's
/// configuration and the collector's, so that both read files, variables and numbers the same way.
package enum ConfigurationDocument {
    /// One value and where it came from (a file path or an environment variable).
    package struct Entry: Sendable {
        package var key: String
        package var value: ConfigurationValue
        package var source: String
    }

    /// Largest configuration file read: 1 MiB (the shipped ones are under 1 KiB).
    package static let maximumFileSize = 1 << 20

    /// Reads a file's bytes.
    /// - Throws: ``ConfigurationError`` when it cannot be read or is larger than ``maximumFileSize``.
    package static func read(_ path: String) throws(ConfigurationError) -> Data {
        func fail(_ reason: String) -> ConfigurationError {
            ConfigurationError(key: "(file)", value: ConfigurationValue.shown(path), reason: reason, source: path)
        }
        guard !path.isEmpty else { throw fail("no file named (the path is empty)") }
        // Opened without waiting (a FIFO's open would wait for a writer), then held to a regular
        // file: a FIFO, a device or a socket could make the read wait for ever or never end.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard descriptor >= 0 else { throw fail("cannot be read: \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else {
            throw fail("cannot be examined: \(String(cString: strerror(errno)))")
        }
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw fail("is not a regular file (\(fileKind(status.st_mode))); name a JSON file")
        }
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) & ~O_NONBLOCK)
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            #if canImport(Glibc)
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            #else
            let count = buffer.withUnsafeMutableBytes { Darwin.read(descriptor, $0.baseAddress, $0.count) }
            #endif
            if count < 0 {
                if errno == EINTR { continue }
                throw fail("cannot be read: \(String(cString: strerror(errno)))")
            }
            if count == 0 { return data }
            data.append(contentsOf: buffer[..<count])
            guard data.count <= maximumFileSize else {
                throw fail("is larger than \(maximumFileSize / 1024) KiB; is it the right file?")
            }
        }
    }

    /// What a file that is not a regular file is, in words.
    private static func fileKind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFDIR: return "a directory"
        case S_IFIFO: return "a FIFO"
        case S_IFSOCK: return "a socket"
        case S_IFCHR: return "a character device"
        case S_IFBLK: return "a block device"
        default: return "not a regular file"
        }
    }

    /// The entries of a JSON object whose keys must all be among `knownKeys`, in the file's order.
    /// - Throws: ``ConfigurationError`` for invalid JSON (with the line and column), a top level
    ///   that is not an object, a key given twice, or an unknown key.
    package static func parseJSON(_ data: Data, source: String, knownKeys: [String]) throws(ConfigurationError)
        -> [Entry]
    {
        let document: StrictJSON
        do {
            document = try StrictJSON.parse(Array(data))
        } catch {
            throw ConfigurationError(key: "(file)", value: "", reason: "not valid JSON: \(error)", source: source)
        }
        guard case .object(let members) = document else {
            throw ConfigurationError(
                key: "(file)", value: "", reason: "the top level must be a JSON object", source: source)
        }
        var entries: [Entry] = []
        for (name, value) in members {
            let value = ConfigurationValue(json: value)
            guard knownKeys.contains(name) else {
                throw ConfigurationError(
                    key: ConfigurationValue.shown(name), value: value.description,
                    reason: unknownReason(name, knownKeys.map { ($0, $0) }, noun: "key"), source: source)
            }
            entries.append(Entry(key: name, value: value, source: source))
        }
        return entries
    }

    /// Overrides from variables named `prefix` + the upper-cased key, e.g. `STALLMON_THRESHOLD_MS`.
    /// - Parameter otherVariables: Variables with the prefix that are not keys (e.g. `STALLMON_CONFIG`).
    /// - Throws: ``ConfigurationError`` for a variable with the prefix (in any case) that is neither
    ///   a key nor one of `otherVariables`: a misspelled variable must never be silently ignored.
    package static func environment(
        _ environment: [String: String], prefix: String, knownKeys: [String], otherVariables: [String] = []
    ) throws(ConfigurationError) -> [Entry] {
        let variables = knownKeys.map { (prefix + $0.uppercased(), $0) }
        let known = Set(variables.map(\.0) + otherVariables)
        for name in environment.keys.sorted() where name.uppercased().hasPrefix(prefix) && !known.contains(name) {
            throw ConfigurationError(
                key: ConfigurationValue.shown(String(name.dropFirst(prefix.count)).lowercased()),
                value: ConfigurationValue(environment: environment[name]!).description,
                reason: unknownReason(
                    name, variables.map { ($0.0, $0.0) } + otherVariables.map { ($0, $0) },
                    noun: "variable"),
                source: ConfigurationValue.shown(name))
        }
        return variables.compactMap { variable, key in
            environment[variable].map { Entry(key: key, value: ConfigurationValue(environment: $0), source: variable) }
        }
    }

    /// Runs `validate`, then names in its error the value as the operator wrote it and where:
    /// the last entry for the key, else `defaultSource`.
    package static func validate(
        _ entries: [Entry], defaultSource: String, _ validate: () throws(ConfigurationError) -> Void
    ) throws(ConfigurationError) {
        do {
            try validate()
        } catch {
            var error = error
            if let entry = entries.last(where: { $0.key == error.key }) {
                error.value = entry.value.description
                error.source = entry.source
            } else {
                error.source = error.source ?? defaultSource
            }
            throw error
        }
    }

    /// `unknown key; did you mean "threshold_ms"? (known keys: …)`.
    static func unknownReason(_ name: String, _ candidates: [(name: String, shown: String)], noun: String)
        -> String
    {
        let known = candidates.map(\.shown).joined(separator: ", ")
        let lowered = name.lowercased()
        let closest = candidates.map { (candidate: $0.shown, distance: editDistance(lowered, $0.name.lowercased())) }
            .min { $0.distance < $1.distance }
        if let closest, closest.distance <= max(2, closest.candidate.count / 4) {
            return "unknown \(noun); did you mean \(closest.candidate)? (known: \(known))"
        }
        return "unknown \(noun) (known: \(known))"
    }

    /// Levenshtein distance, for suggestions; long inputs are not worth comparing.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a.utf8.prefix(256))
        let b = Array(b.utf8.prefix(256))
        guard !a.isEmpty else { return b.count }
        var previous = Array(0...b.count)
        for i in 1...a.count {
            var row = [i] + Array(repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                row[j] = Swift.min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = row
        }
        return previous[b.count]
    }
}

/// A value from a JSON file or an environment variable, before it is checked against its key.
///
/// Numbers are read with JSON's grammar in both places (no `0x10`, `+5`, `.5`, `inf` or `1_000`).
/// Durations and integers outside what any key allows are clamped to a bound far beyond every
/// key's range, so that the key's own check refuses them with its range, never a crash.
package struct ConfigurationValue: Sendable, CustomStringConvertible {
    var number: Double?
    var bool: Bool?
    var string: String?
    var strings: [String]?
    var numbers: [Double]?
    var isNull = false
    /// Why a list from the environment is not one, e.g. an empty element in `300,,3600`.
    var listProblem: String?
    /// The value as written, for messages (shortened when long).
    package var description: String

    init(json: StrictJSON) {
        description = Self.shown(json.text)
        switch json {
        case .null:
            isNull = true
        case .bool(let value):
            bool = value
        case .number(let text):
            number = Double(text)
        case .string(let value):
            string = value
        case .array(let values):
            let list = values.compactMap { value -> String? in
                if case .string(let text) = value { return text }
                return nil
            }
            strings = list.count == values.count ? list : nil
            let numbers = values.compactMap { value -> Double? in
                if case .number(let text) = value { return Double(text) }
                return nil
            }
            self.numbers = numbers.count == values.count ? numbers : nil
        case .object:
            break
        }
    }

    init(environment text: String) {
        description = Self.shownQuoted(text)
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        number = Self.number(trimmed)
        switch trimmed.lowercased() {
        case "1", "true", "yes", "on": bool = true
        case "0", "false", "no", "off": bool = false
        default: bool = nil
        }
        string = trimmed
        guard !trimmed.isEmpty else {
            strings = []
            numbers = []
            return
        }
        let parts = trimmed.split(separator: ",", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        if parts.contains(where: \.isEmpty) {
            listProblem = "an element between commas is empty"
            return
        }
        strings = parts
        let numbers = parts.compactMap { Self.number($0) }
        self.numbers = numbers.count == parts.count ? numbers : nil
    }

    /// A number written with JSON's grammar (`-12`, `0.5`, `1e3`), else `nil`.
    static func number(_ text: String) -> Double? {
        var bytes = Substring(text).utf8[...]
        func digits() -> Int {
            let count = bytes.prefix { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }.count
            bytes = bytes.dropFirst(count)
            return count
        }
        if bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
        if bytes.first == UInt8(ascii: "0") {
            bytes = bytes.dropFirst()
        } else if digits() == 0 {
            return nil
        }
        if bytes.first == UInt8(ascii: ".") {
            bytes = bytes.dropFirst()
            guard digits() > 0 else { return nil }
        }
        if bytes.first == UInt8(ascii: "e") || bytes.first == UInt8(ascii: "E") {
            bytes = bytes.dropFirst()
            if bytes.first == UInt8(ascii: "+") || bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
            guard digits() > 0 else { return nil }
        }
        guard bytes.isEmpty, let value = Double(text), !value.isNaN else { return nil }
        return value
    }

    /// A value as shown in messages: long ones are cut, with their length.
    package static func shown(_ text: String) -> String {
        guard text.utf8.count > 120, text.count > 120 else { return text }
        return String(text.prefix(100)) + "… (\(text.count) characters)"
    }

    /// A string in double quotes as shown in messages: long ones are cut, with their length.
    static func shownQuoted(_ text: String) -> String {
        guard text.utf8.count > 60, text.count > 60 else { return StrictJSON.quoted(text) }
        return String(StrictJSON.quoted(String(text.prefix(60))).dropLast()) + "… (\(text.count) characters)"
    }

    private func fail(_ key: String, _ source: String, _ reason: String) -> ConfigurationError {
        ConfigurationError(key: key, value: description, reason: reason, source: source)
    }

    /// `value` in `unit`s as a `Duration`, clamped to ±1e18 ns (about 31 years).
    static func duration(_ value: Double, unit: Double) -> Duration {
        let nanoseconds = (value * unit).rounded()
        let limit = 1e18
        return .nanoseconds(Int64(Swift.max(-limit, Swift.min(limit, nanoseconds))))
    }

    /// A number of milliseconds as a `Duration`.
    package func milliseconds(key: String, source: String) throws(ConfigurationError) -> Duration {
        guard let number else { throw fail(key, source, "must be a number of milliseconds") }
        return Self.duration(number, unit: 1e6)
    }

    /// A number of seconds as a `Duration`.
    package func seconds(key: String, source: String) throws(ConfigurationError) -> Duration {
        guard let number else { throw fail(key, source, "must be a number of seconds") }
        return Self.duration(number, unit: 1e9)
    }

    /// A whole number, clamped to ±1e15.
    package func integer(key: String, source: String) throws(ConfigurationError) -> Int {
        guard let number, number == number.rounded() else { throw fail(key, source, "must be a whole number") }
        return Int(Swift.max(-1e15, Swift.min(1e15, number)))
    }

    package func flag(key: String, source: String) throws(ConfigurationError) -> Bool {
        guard let bool else { throw fail(key, source, "must be true or false") }
        return bool
    }

    /// A string; `null` gives `nil`.
    package func text(key: String, source: String) throws(ConfigurationError) -> String? {
        if isNull { return nil }
        guard let string else { throw fail(key, source, "must be a string") }
        return string
    }

    package func list(key: String, source: String) throws(ConfigurationError) -> [String] {
        guard let strings else { throw fail(key, source, "must be a list of strings" + problem) }
        return strings
    }

    package func numberList(key: String, source: String) throws(ConfigurationError) -> [Double] {
        guard let numbers else { throw fail(key, source, "must be a list of numbers" + problem) }
        return numbers
    }

    /// A list of numbers of `unit` (nanoseconds per unit, e.g. 1e9 for seconds) as `Duration`s,
    /// each clamped like ``seconds(key:source:)``.
    package func durationList(key: String, source: String, unit: Double) throws(ConfigurationError) -> [Duration] {
        try numberList(key: key, source: source).map { Self.duration($0, unit: unit) }
    }

    private var problem: String { listProblem.map { " (\($0))" } ?? "" }
}
