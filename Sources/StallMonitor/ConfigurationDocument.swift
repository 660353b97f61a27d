import Foundation

/// Reads configuration values from a JSON file and from environment variables, and names the
/// key, the value, the reason and the source whenever one cannot be used. Shared by the monitor's
/// configuration and the collector's.
public enum ConfigurationDocument {
    /// One value and where it came from (a file path or an environment variable).
    public struct Entry: Sendable {
        public var key: String
        public var value: ConfigurationValue
        public var source: String
    }

    /// Reads a file's bytes.
    /// - Throws: ``ConfigurationError`` when it cannot be read.
    public static func read(_ path: String) throws(ConfigurationError) -> Data {
        do {
            return try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw ConfigurationError(
                key: "(file)", value: path, reason: "cannot be read: \(error.localizedDescription)", source: path)
        }
    }

    /// The entries of a JSON object whose keys must all be among `knownKeys`, sorted by key.
    /// - Throws: ``ConfigurationError`` for invalid JSON, a top level that is not an object, or an unknown key.
    public static func parseJSON(_ data: Data, source: String, knownKeys: [String]) throws(ConfigurationError)
        -> [Entry]
    {
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: data)
        } catch {
            throw ConfigurationError(
                key: "(file)", value: "", reason: "not valid JSON: \(error.localizedDescription)", source: source)
        }
        guard let dictionary = object as? [String: Any] else {
            throw ConfigurationError(
                key: "(file)", value: "", reason: "the top level must be a JSON object", source: source)
        }
        var entries: [Entry] = []
        for name in dictionary.keys.sorted() {
            guard knownKeys.contains(name) else {
                throw ConfigurationError(
                    key: name, value: "", reason: "unknown key (known keys: \(knownKeys.joined(separator: ", ")))",
                    source: source)
            }
            entries.append(Entry(key: name, value: ConfigurationValue(json: dictionary[name]!), source: source))
        }
        return entries
    }

    /// Overrides from variables named `prefix` + the upper-cased key, e.g. `STALLMON_THRESHOLD_MS`.
    public static func environment(_ environment: [String: String], prefix: String, knownKeys: [String]) -> [Entry] {
        knownKeys.compactMap { key in
            let variable = prefix + key.uppercased()
            return environment[variable].map {
                Entry(key: key, value: ConfigurationValue(environment: $0), source: variable)
            }
        }
    }
}

/// A value from a JSON file or an environment variable, before it is checked against its key.
public struct ConfigurationValue: Sendable, CustomStringConvertible {
    var number: Double?
    var bool: Bool?
    var string: String?
    var strings: [String]?
    var numbers: [Double]?
    var isNull = false
    /// The value as written, for messages.
    public var description: String

    init(json: Any) {
        switch json {
        case let value as NSNumber where String(cString: value.objCType) == "c":
            bool = value.boolValue
            description = value.boolValue ? "true" : "false"
        case let value as NSNumber:
            number = value.doubleValue
            description = "\(value)"
        case let value as String:
            string = value
            description = "\"\(value)\""
        case let value as [Any]:
            let list = value.compactMap { $0 as? String }
            strings = list.count == value.count ? list : nil
            let numbers = value.compactMap { ($0 as? NSNumber).map(\.doubleValue) }
            self.numbers = numbers.count == value.count ? numbers : nil
            description = "[\(value.map { "\($0)" }.joined(separator: ", "))]"
        case is NSNull:
            isNull = true
            string = ""
            description = "null"
        default:
            description = "\(json)"
        }
    }

    init(environment text: String) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        number = Double(trimmed)
        switch trimmed.lowercased() {
        case "1", "true", "yes", "on": bool = true
        case "0", "false", "no", "off": bool = false
        default: bool = nil
        }
        string = trimmed
        let parts = trimmed.isEmpty ? [] : trimmed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        strings = parts
        let numbers = parts.compactMap(Double.init)
        self.numbers = numbers.count == parts.count ? numbers : nil
        description = "\"\(text)\""
    }

    private func fail(_ key: String, _ source: String, _ reason: String) -> ConfigurationError {
        ConfigurationError(key: key, value: description, reason: reason, source: source)
    }

    /// A number of milliseconds as a `Duration`.
    public func milliseconds(key: String, source: String) throws(ConfigurationError) -> Duration {
        guard let number, number.isFinite, abs(number) < 1e12 else {
            throw fail(key, source, "must be a number of milliseconds")
        }
        return .nanoseconds(Int64((number * 1_000_000).rounded()))
    }

    /// A number of seconds as a `Duration`.
    public func seconds(key: String, source: String) throws(ConfigurationError) -> Duration {
        guard let number, number.isFinite, abs(number) < 1e9 else {
            throw fail(key, source, "must be a number of seconds")
        }
        return .nanoseconds(Int64((number * 1_000_000_000).rounded()))
    }

    public func integer(key: String, source: String) throws(ConfigurationError) -> Int {
        guard let number, number.isFinite, number == number.rounded(), abs(number) < 1e15 else {
            throw fail(key, source, "must be a whole number")
        }
        return Int(number)
    }

    public func flag(key: String, source: String) throws(ConfigurationError) -> Bool {
        guard let bool else { throw fail(key, source, "must be true or false") }
        return bool
    }

    /// A string; `null` gives `nil`.
    public func text(key: String, source: String) throws(ConfigurationError) -> String? {
        if isNull { return nil }
        guard let string else { throw fail(key, source, "must be a string") }
        return string
    }

    public func list(key: String, source: String) throws(ConfigurationError) -> [String] {
        guard let strings else { throw fail(key, source, "must be a list of strings") }
        return strings
    }

    public func numberList(key: String, source: String) throws(ConfigurationError) -> [Double] {
        guard let numbers, numbers.allSatisfy(\.isFinite) else { throw fail(key, source, "must be a list of numbers") }
        return numbers
    }
}
