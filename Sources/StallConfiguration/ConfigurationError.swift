/// A configuration value that cannot be used, and where it came from.
public struct ConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The key as written in the configuration file, e.g. `threshold_ms`.
    public var key: String
    /// The offending value as given.
    public var value: String
    /// Why the value cannot be used.
    public var reason: String
    /// Where the value came from: a file path, an environment variable, or `nil` for code.
    public var source: String?

    public init(key: String, value: String, reason: String, source: String? = nil) {
        self.key = key
        self.value = value
        self.reason = reason
        self.source = source
    }

    /// `source: key = value: reason`; ` = value` is left out when there is no value to show
    /// (a file that is not JSON).
    public var description: String {
        let origin = source.map { "\($0): " } ?? ""
        return value.isEmpty ? "\(origin)\(key): \(reason)" : "\(origin)\(key) = \(value): \(reason)"
    }
}
