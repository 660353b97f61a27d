import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension StallMonitoring.Configuration {
    /// The environment variable naming a JSON configuration file for ``fromEnvironment(_:)``.
    public static let fileEnvironmentVariable = "STALLMON_CONFIG"

    /// Reads a JSON configuration (the format of `config/stallmon.json`). Keys that are absent keep
    /// their defaults; unknown keys are errors, so a typo never silently falls back to a default.
    /// - Parameters:
    ///   - json: The file's bytes.
    ///   - source: Named in errors, usually the file's path.
    /// - Throws: ``ConfigurationError`` naming the key, the value and why it is invalid.
    public init(json: Data, source: String) throws(ConfigurationError) {
        self = try Self(
            entries: ConfigurationDocument.parseJSON(json, source: source, knownKeys: Self.keys),
            defaultSource: source)
    }

    /// Reads a JSON configuration file.
    /// - Throws: ``ConfigurationError`` when the file cannot be read or holds an invalid value.
    public init(contentsOfFile path: String) throws(ConfigurationError) {
        try self.init(json: ConfigurationDocument.read(path), source: path)
    }

    /// The defaults, overridden by the file named in `STALLMON_CONFIG` (if set), overridden in turn
    /// by `STALLMON_<KEY>` variables such as `STALLMON_THRESHOLD_MS=500`. `STALLMON_CONFIG` set
    /// to an empty string, and any other `STALLMON_` variable that is not a key, are errors.
    /// - Throws: ``ConfigurationError`` naming the variable or file, the key and the value.
    public static func fromEnvironment(
        _ environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigurationError) -> Self {
        var entries: [ConfigurationDocument.Entry] = []
        var defaultSource = "defaults"
        if let path = environment[fileEnvironmentVariable] {
            guard !path.isEmpty else {
                throw ConfigurationError(
                    key: "(file)", value: "\"\"",
                    reason: "is set but empty: name a configuration file, or unset it for the defaults",
                    source: fileEnvironmentVariable)
            }
            entries = try ConfigurationDocument.parseJSON(
                ConfigurationDocument.read(path), source: path, knownKeys: keys)
            defaultSource = path
        }
        entries += try ConfigurationDocument.environment(
            environment, prefix: "STALLMON_", knownKeys: keys, otherVariables: otherEnvironmentVariables)
        return try Self(entries: entries, defaultSource: defaultSource)
    }

    /// `STALLMON_` variables that are not configuration keys.
    static let otherEnvironmentVariables = [
        fileEnvironmentVariable,
        // stallmon-bench's children print their measurements with it.
        "STALLMON_BENCH_DEBUG",
    ]

    private static var keys: [String] { ConfigurationKey.allCases.map(\.rawValue) }

    /// The defaults with `entries` applied in order, validated; errors name the entry's value and source.
    private init(entries: [ConfigurationDocument.Entry], defaultSource: String) throws(ConfigurationError) {
        self.init()
        for entry in entries {
            try set(ConfigurationKey(rawValue: entry.key)!, to: entry.value, source: entry.source)
        }
        let configuration = self
        try ConfigurationDocument.validate(entries, defaultSource: defaultSource) { () throws(ConfigurationError) in
            try configuration.validate()
        }
    }

    private mutating func set(_ key: ConfigurationKey, to value: ConfigurationValue, source: String)
        throws(ConfigurationError)
    {
        func fail(_ reason: String) -> ConfigurationError {
            ConfigurationError(key: key.rawValue, value: value.description, reason: reason, source: source)
        }
        func milliseconds() throws(ConfigurationError) -> Duration {
            try value.milliseconds(key: key.rawValue, source: source)
        }
        func integer() throws(ConfigurationError) -> Int {
            try value.integer(key: key.rawValue, source: source)
        }
        switch key {
        case .threshold: threshold = try milliseconds()
        case .sampleInterval: sampleInterval = try milliseconds()
        case .sampleTimeout: sampleTimeout = try milliseconds()
        case .startupGracePeriod: startupGracePeriod = try milliseconds()
        case .loopStartTimeout: loopStartTimeout = try milliseconds()
        case .maximumFrames: maximumFrames = try integer()
        case .maximumStacks: maximumStacks = try integer()
        case .reportQueueCapacity: reportQueueCapacity = try integer()
        case .rateLimitBurst: rateLimit.burst = try integer()
        case .rateLimitInterval: rateLimit.interval = try value.seconds(key: key.rawValue, source: source)
        case .reportWhileDebuggerAttached:
            reportWhileDebuggerAttached = try value.flag(key: key.rawValue, source: source)
        case .notifyStatus: notifyStatus = try value.flag(key: key.rawValue, source: source)
        case .loopLatency: loopLatency = try value.flag(key: key.rawValue, source: source)
        case .cooperativePool:
            if value.string == "auto" {
                cooperativePool = nil
            } else {
                guard let flag = value.bool else { throw fail("must be true, false or \"auto\"") }
                cooperativePool = flag
            }
        case .cooperativePoolThreshold: cooperativePoolThreshold = try milliseconds()
        case .interruptBlockedThreads:
            interruptBlockedThreads = try value.flag(key: key.rawValue, source: source)
        case .stackSource:
            guard let text = value.string, let parsed = StackSource(rawValue: text) else {
                throw fail("must be \"auto\", \"perf\" or \"signal\"")
            }
            stackSource = parsed
        case .signal:
            let reason = "must be \"auto\", a signal name such as \"SIGRTMIN+4\", or a signal number"
            if let number = value.number {
                guard number == number.rounded(), abs(number) <= 1_000_000 else { throw fail(reason) }
                signal = Int32(number)
            } else {
                guard let text = value.string, let parsed = SignalName.parse(text) else { throw fail(reason) }
                signal = parsed.number
            }
        case .syslogIdentifier:
            guard !value.isNull else {
                syslogIdentifier = nil
                break
            }
            guard let text = value.string else { throw fail("must be a string (or null for the program's name)") }
            syslogIdentifier = text.isEmpty ? nil : text
        case .sink:
            let reason = "must be one of " + ReportDestination.names.map { "\"\($0)\"" }.joined(separator: ", ")
            guard let text = value.string else { throw fail(reason) }
            if text == "auto" {
                sink = nil
            } else {
                guard let destination = ReportDestination(named: text) else { throw fail(reason) }
                sink = destination
            }
        case .additionalModes:
            guard let list = value.strings else {
                throw fail("must be a list of run-loop mode names" + (value.listProblem.map { " (\($0))" } ?? ""))
            }
            additionalModes = list
        }
    }
}

/// Signal names as written in configuration: `auto`, `SIGUSR2`, `SIGRTMIN+4`, `SIGRTMAX-2` or a number.
package enum SignalName {
    package struct Parsed {
        /// `nil` for `auto`.
        package var number: Int32?
    }

    /// `nil` when the text is none of these. Numbers are not range-checked here (``StallMonitoring/Configuration/validate()`` does).
    package static func parse(_ text: String) -> Parsed? {
        let name = text.uppercased()
        func isNumber(_ digits: Substring) -> Bool {
            (1...9).contains(digits.count) && digits.allSatisfy { $0.isASCII && $0.isNumber }
        }
        if name == "AUTO" { return Parsed(number: nil) }
        if isNumber(Substring(name)) { return Parsed(number: Int32(name)) }
        let fixed: [String: Int32] = ["SIGUSR1": SIGUSR1, "SIGUSR2": SIGUSR2, "SIGPROF": SIGPROF]
        if let number = fixed[name] { return Parsed(number: number) }
        // SIGRTMIN+N counts up from SIGRTMIN, SIGRTMAX-N down from SIGRTMAX.
        for (prefix, sign, base, direction) in [
            ("SIGRTMIN", "+", realTimeMinimum, Int32(1)), ("SIGRTMAX", "-", realTimeMaximum, Int32(-1)),
        ] where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            if rest.isEmpty { return Parsed(number: base) }
            guard rest.hasPrefix(sign), isNumber(rest.dropFirst()), let offset = Int32(rest.dropFirst()) else {
                return nil
            }
            return Parsed(number: base + direction * offset)  // at most 9 digits: no overflow
        }
        return nil
    }

    #if canImport(Glibc)
    /// `SIGRTMIN` and `SIGRTMAX`: glibc reserves real-time signals for itself and computes them
    /// at run time, in macros Swift cannot import.
    package static var realTimeMinimum: Int32 { __libc_current_sigrtmin() }
    package static var realTimeMaximum: Int32 { __libc_current_sigrtmax() }
    #else
    // No real-time signals here: glibc's numbers on Linux, which the configuration is written for.
    package static var realTimeMinimum: Int32 { 34 }
    package static var realTimeMaximum: Int32 { 64 }
    #endif

    package static func name(of signal: Int32) -> String {
        switch signal {
        case SIGUSR1: return "SIGUSR1"
        case SIGUSR2: return "SIGUSR2"
        case SIGPROF: return "SIGPROF"
        default:
            let low = realTimeMinimum, high = realTimeMaximum
            guard (low...high).contains(signal) else { return "\(signal)" }
            return signal - low <= high - signal ? "SIGRTMIN+\(signal - low)" : "SIGRTMAX-\(high - signal)"
        }
    }
}

extension StallMonitoring.Configuration {
    /// Every value as `key=value`, space-separated, in the file's key names.
    package var summary: String {
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
        case .loopStartTimeout: return milliseconds(loopStartTimeout)
        case .maximumFrames: return "\(maximumFrames)"
        case .maximumStacks: return "\(maximumStacks)"
        case .reportQueueCapacity: return "\(reportQueueCapacity)"
        case .rateLimitBurst: return "\(rateLimit.burst)"
        case .rateLimitInterval: return "\(Double(rateLimit.interval.nanoseconds) / 1e9)"
        case .reportWhileDebuggerAttached: return "\(reportWhileDebuggerAttached)"
        case .notifyStatus: return "\(notifyStatus)"
        case .loopLatency: return "\(loopLatency)"
        case .cooperativePool: return cooperativePool.map { "\($0)" } ?? "auto"
        case .cooperativePoolThreshold: return milliseconds(cooperativePoolThreshold)
        case .signal: return signal.map(SignalName.name(of:)) ?? "auto"
        case .interruptBlockedThreads: return "\(interruptBlockedThreads)"
        case .stackSource: return stackSource.rawValue
        case .syslogIdentifier: return syslogIdentifier ?? ProgramName.current
        case .additionalModes: return additionalModes.joined(separator: ",")
        case .sink: return sink?.description ?? "auto"
        }
    }
}
