import CStallCapture
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

extension StallMonitor.Configuration {
    /// The environment variable naming a JSON configuration file for ``fromEnvironment(_:)``.
    public static let fileEnvironmentVariable = "STALLMON_CONFIG"

    /// Reads a JSON configuration (the format of `config/stallmon.json`). Keys that are absent keep
    /// their defaults; unknown keys are errors, so a typo never silently falls back to a default.
    /// - Parameters:
    ///   - json: The file's bytes.
    ///   - source: Named in errors, usually the file's path.
    /// - Throws: ``ConfigurationError`` naming the key, the value and why it is invalid.
    public init(json: Data, source: String) throws(ConfigurationError) {
        self.init()
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: json)
        } catch {
            throw ConfigurationError(
                key: "(file)", value: "", reason: "not valid JSON: \(error.localizedDescription)", source: source)
        }
        guard let dictionary = object as? [String: Any] else {
            throw ConfigurationError(
                key: "(file)", value: "", reason: "the top level must be a JSON object", source: source)
        }
        for name in dictionary.keys.sorted() {
            guard let key = ConfigurationKey(rawValue: name) else {
                let known = ConfigurationKey.allCases.map(\.rawValue).joined(separator: ", ")
                throw ConfigurationError(
                    key: name, value: "", reason: "unknown key (known keys: \(known))", source: source)
            }
            try set(key, to: ConfigurationValue(json: dictionary[name]!), source: source)
        }
        try validated(source: source)
    }

    /// Reads a JSON configuration file.
    /// - Throws: ``ConfigurationError`` when the file cannot be read or holds an invalid value.
    public init(contentsOfFile path: String) throws(ConfigurationError) {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw ConfigurationError(
                key: "(file)", value: path, reason: "cannot be read: \(error.localizedDescription)", source: path)
        }
        try self.init(json: data, source: path)
    }

    /// The defaults, overridden by the file named in `STALLMON_CONFIG` (if set), overridden in turn
    /// by `STALLMON_<KEY>` variables such as `STALLMON_THRESHOLD_MS=500`.
    /// - Throws: ``ConfigurationError`` naming the variable or file, the key and the value.
    public static func fromEnvironment(
        _ environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigurationError) -> Self {
        var configuration = Self()
        var origins: [String: String] = [:]
        if let path = environment[fileEnvironmentVariable], !path.isEmpty {
            configuration = try Self(contentsOfFile: path)
            for key in ConfigurationKey.allCases { origins[key.rawValue] = path }
        }
        for key in ConfigurationKey.allCases {
            guard let text = environment[key.environmentVariable] else { continue }
            try configuration.set(key, to: ConfigurationValue(environment: text), source: key.environmentVariable)
            origins[key.rawValue] = key.environmentVariable
        }
        try configuration.validated(source: "defaults", origins: origins)
        return configuration
    }

    /// Validates, naming where the offending value came from.
    private func validated(source: String, origins: [String: String] = [:]) throws(ConfigurationError) {
        do {
            try validate()
        } catch {
            var error = error
            error.source = error.source ?? origins[error.key] ?? source
            throw error
        }
    }

    private mutating func set(_ key: ConfigurationKey, to value: ConfigurationValue, source: String)
        throws(ConfigurationError)
    {
        func fail(_ reason: String) -> ConfigurationError {
            ConfigurationError(key: key.rawValue, value: value.description, reason: reason, source: source)
        }
        func milliseconds() throws(ConfigurationError) -> Duration {
            guard let number = value.number, number.isFinite else { throw fail("must be a number of milliseconds") }
            return .nanoseconds(Int64((number * 1_000_000).rounded()))
        }
        func integer() throws(ConfigurationError) -> Int {
            guard let number = value.number, number.isFinite, number == number.rounded(), abs(number) < 1e15 else {
                throw fail("must be a whole number")
            }
            return Int(number)
        }
        switch key {
        case .threshold: threshold = try milliseconds()
        case .sampleInterval: sampleInterval = try milliseconds()
        case .sampleTimeout: sampleTimeout = try milliseconds()
        case .startupGracePeriod: startupGracePeriod = try milliseconds()
        case .maximumFrames: maximumFrames = try integer()
        case .maximumStacks: maximumStacks = try integer()
        case .reportQueueCapacity: reportQueueCapacity = try integer()
        case .rateLimitBurst: rateLimit.burst = try integer()
        case .rateLimitInterval:
            guard let number = value.number, number.isFinite else { throw fail("must be a number of seconds") }
            rateLimit.interval = .nanoseconds(Int64((number * 1_000_000_000).rounded()))
        case .reportWhileDebuggerAttached:
            guard let flag = value.bool else { throw fail("must be true or false") }
            reportWhileDebuggerAttached = flag
        case .notifyStatus:
            guard let flag = value.bool else { throw fail("must be true or false") }
            notifyStatus = flag
        case .signal:
            guard let text = value.string ?? value.number.map({ String(Int($0)) }) else {
                throw fail("must be \"auto\", a signal name such as \"SIGRTMIN+4\", or a number")
            }
            guard let parsed = SignalName.parse(text) else {
                throw fail("must be \"auto\", a signal name such as \"SIGRTMIN+4\", or a number")
            }
            signal = parsed.number
        case .syslogIdentifier:
            guard let text = value.string else { throw fail("must be a string (or null for the program's name)") }
            syslogIdentifier = text.isEmpty || value.isNull ? nil : text
        case .additionalModes:
            guard let list = value.strings else { throw fail("must be a list of run-loop mode names") }
            additionalModes = list
        }
    }
}

/// A value from a JSON file or an environment variable, before it is checked against its key.
struct ConfigurationValue: CustomStringConvertible {
    var number: Double?
    var bool: Bool?
    var string: String?
    var strings: [String]?
    var isNull = false
    var description: String

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
        strings = trimmed.isEmpty ? [] : trimmed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        description = "\"\(text)\""
    }
}

/// Signal names as written in configuration: `auto`, `SIGUSR2`, `SIGRTMIN+4`, `SIGRTMAX-2` or a number.
enum SignalName {
    struct Parsed {
        /// `nil` for `auto`.
        var number: Int32?
    }

    static func parse(_ text: String) -> Parsed? {
        let name = text.uppercased()
        if name == "AUTO" { return Parsed(number: nil) }
        if let number = Int32(name) { return Parsed(number: number) }
        let fixed: [String: Int32] = ["SIGUSR1": SIGUSR1, "SIGUSR2": SIGUSR2, "SIGPROF": SIGPROF]
        if let number = fixed[name] { return Parsed(number: number) }
        for (prefix, base) in [("SIGRTMIN", stallmon_sigrtmin()), ("SIGRTMAX", stallmon_sigrtmax())]
        where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            if rest.isEmpty { return Parsed(number: base) }
            guard let offset = Int32(rest) else { return nil }  // "+4" and "-2" parse as signed integers
            return Parsed(number: base + offset)
        }
        return nil
    }

    static func name(of signal: Int32) -> String {
        switch signal {
        case SIGUSR1: return "SIGUSR1"
        case SIGUSR2: return "SIGUSR2"
        case SIGPROF: return "SIGPROF"
        default:
            let low = stallmon_sigrtmin(), high = stallmon_sigrtmax()
            guard (low...high).contains(signal) else { return "\(signal)" }
            return signal - low <= high - signal ? "SIGRTMIN+\(signal - low)" : "SIGRTMAX-\(high - signal)"
        }
    }
}

extension StallMonitor.Configuration {
    /// Every value as `key=value`, space-separated, in the file's key names.
    public var summary: String {
        ConfigurationKey.allCases.map { "\($0.rawValue)=\(text(for: $0))" }.joined(separator: " ")
    }

    private func text(for key: ConfigurationKey) -> String {
        func milliseconds(_ duration: Duration) -> String {
            let nanoseconds = duration.nanoseconds
            return nanoseconds % 1_000_000 == 0 ? "\(nanoseconds / 1_000_000)" : "\(Double(nanoseconds) / 1_000_000)"
        }
        switch key {
        case .threshold: return milliseconds(threshold)
        case .sampleInterval: return milliseconds(sampleInterval)
        case .sampleTimeout: return milliseconds(sampleTimeout)
        case .startupGracePeriod: return milliseconds(startupGracePeriod)
        case .maximumFrames: return "\(maximumFrames)"
        case .maximumStacks: return "\(maximumStacks)"
        case .reportQueueCapacity: return "\(reportQueueCapacity)"
        case .rateLimitBurst: return "\(rateLimit.burst)"
        case .rateLimitInterval: return "\(Double(rateLimit.interval.nanoseconds) / 1e9)"
        case .reportWhileDebuggerAttached: return "\(reportWhileDebuggerAttached)"
        case .notifyStatus: return "\(notifyStatus)"
        case .signal: return signal.map(SignalName.name(of:)) ?? "auto"
        case .syslogIdentifier: return syslogIdentifier ?? ProgramName.current
        case .additionalModes: return additionalModes.joined(separator: ",")
        }
    }
}
