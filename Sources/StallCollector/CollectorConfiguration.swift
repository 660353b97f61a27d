import Foundation
import StallMonitor

/// stallmond's configuration. `config/stallmond.json` holds every knob with its default, and
/// `config/README.md` documents each one; `STALLMOND_<KEY>` variables override the file.
public struct CollectorConfiguration: Sendable, Hashable {
    /// Where the Prometheus textfile is written (atomically); empty disables metrics.
    public var metricsPath: String = "/var/lib/prometheus/node-exporter/stallmon.prom"
    /// How often the metrics file is rewritten when something changed.
    public var metricsInterval: Duration = .seconds(15)
    /// The windows the digest, the status line and the per-window gauges cover.
    public var windows: [Duration] = [.seconds(300), .seconds(3600), .seconds(86400)]
    /// Fingerprints per unit that get their own metric series; later ones count as `other`.
    public var maximumFingerprintsPerUnit: Int = 10
    /// Upper bounds of the stall duration histogram.
    public var histogramBuckets: [Duration] = [250, 500, 1000, 2500, 5000, 10000, 30000].map { .milliseconds($0) }
    /// How often a digest entry goes to the journal; zero disables it.
    public var digestInterval: Duration = .seconds(3600)
    /// Where the cursor and aggregates are kept; `nil` uses `$STATE_DIRECTORY`, then `/var/lib/stallmond`.
    public var stateDirectory: String? = nil
    /// The threshold of stallmond's own stall monitor (it watches its own main run loop).
    public var monitorThreshold: Duration = .milliseconds(250)
    /// Individual stalls remembered for the windows (memory bound); the oldest go first.
    public var maximumTrackedStalls: Int = 100_000
    /// Units counted on their own (memory and state bound); stalls of later units count under
    /// `(other units)`.
    public var maximumUnits: Int = 500

    public init() {}

    /// The names in `config/stallmond.json`.
    public enum Key: String, CaseIterable, Sendable {
        case metricsPath = "metrics_path"
        case metricsInterval = "metrics_interval_s"
        case windows = "windows_s"
        case maximumFingerprintsPerUnit = "max_fingerprints_per_unit"
        case histogramBuckets = "histogram_buckets_ms"
        case digestInterval = "digest_interval_s"
        case stateDirectory = "state_directory"
        case monitorThreshold = "monitor_threshold_ms"
        case maximumTrackedStalls = "max_tracked_stalls"
        case maximumUnits = "max_units"
    }

    /// The file's path when none is given: `$STALLMOND_CONFIG`, then `/etc/stallmon/stallmond.json`.
    public static func defaultPath(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        environment["STALLMOND_CONFIG"].flatMap { $0.isEmpty ? nil : $0 } ?? "/etc/stallmon/stallmond.json"
    }

    /// Reads the file at `path` (a missing file at the default path means the defaults), then the
    /// `STALLMOND_<KEY>` overrides, and validates the result.
    /// - Throws: ``ConfigurationError`` naming the key, the value, why, and the file or variable.
    public static func load(
        path: String, required: Bool, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigurationError) -> Self {
        let keys = Key.allCases.map(\.rawValue)
        var entries: [ConfigurationDocument.Entry] = []
        if required || FileManager.default.fileExists(atPath: path) {
            entries = try ConfigurationDocument.parseJSON(
                ConfigurationDocument.read(path), source: path, knownKeys: keys)
        }
        entries += ConfigurationDocument.environment(environment, prefix: "STALLMOND_", knownKeys: keys)
        var configuration = Self()
        var origins: [String: ConfigurationDocument.Entry] = [:]
        for entry in entries {
            try configuration.set(Key(rawValue: entry.key)!, to: entry.value, source: entry.source)
            origins[entry.key] = entry
        }
        do {
            try configuration.validate()
        } catch {
            // Name the value as the operator wrote it, and where.
            var error = error
            error.source = origins[error.key]?.source ?? "defaults"
            error.value = origins[error.key]?.value.description ?? error.value
            throw error
        }
        return configuration
    }

    private mutating func set(_ key: Key, to value: ConfigurationValue, source: String) throws(ConfigurationError) {
        let name = key.rawValue
        switch key {
        case .metricsPath: metricsPath = try value.text(key: name, source: source) ?? ""
        case .metricsInterval: metricsInterval = try value.seconds(key: name, source: source)
        case .windows: windows = try value.numberList(key: name, source: source).map { .nanoseconds(Int64($0 * 1e9)) }
        case .maximumFingerprintsPerUnit: maximumFingerprintsPerUnit = try value.integer(key: name, source: source)
        case .histogramBuckets:
            histogramBuckets = try value.numberList(key: name, source: source).map { .nanoseconds(Int64($0 * 1e6)) }
        case .digestInterval: digestInterval = try value.seconds(key: name, source: source)
        case .stateDirectory:
            let text = try value.text(key: name, source: source)
            stateDirectory = text?.isEmpty == false ? text : nil
        case .monitorThreshold: monitorThreshold = try value.milliseconds(key: name, source: source)
        case .maximumTrackedStalls: maximumTrackedStalls = try value.integer(key: name, source: source)
        case .maximumUnits: maximumUnits = try value.integer(key: name, source: source)
        }
    }

    /// Checks every value.
    /// - Throws: ``ConfigurationError`` naming the first invalid value and why.
    public func validate() throws(ConfigurationError) {
        func check(_ condition: Bool, _ key: Key, _ value: String, _ reason: String) throws(ConfigurationError) {
            guard condition else { throw ConfigurationError(key: key.rawValue, value: value, reason: reason) }
        }
        func seconds(_ duration: Duration) -> String { "\(duration.totalSeconds)" }
        try check(
            metricsPath.isEmpty || (metricsPath.hasPrefix("/") && metricsPath.hasSuffix(".prom")), .metricsPath,
            metricsPath,
            "must be an absolute path ending in .prom (node_exporter's textfile collector reads only those), or empty")
        try check(metricsInterval >= .seconds(1), .metricsInterval, seconds(metricsInterval), "must be at least 1 s")
        try check(
            !windows.isEmpty && windows.count <= 8, .windows, "\(windows.map(seconds))", "must list 1 to 8 windows")
        try check(
            windows.allSatisfy { $0 >= .seconds(10) && $0 <= .seconds(30 * 86400) }, .windows,
            "\(windows.map(seconds))", "each window must be between 10 s and 30 days")
        try check(
            (1...1000).contains(maximumFingerprintsPerUnit), .maximumFingerprintsPerUnit,
            "\(maximumFingerprintsPerUnit)", "must be between 1 and 1000")
        try check(
            !histogramBuckets.isEmpty && histogramBuckets.count <= 30, .histogramBuckets,
            "\(histogramBuckets.count) buckets", "must list 1 to 30 bucket bounds")
        try check(
            zip(histogramBuckets, histogramBuckets.dropFirst()).allSatisfy { $0 < $1 } && histogramBuckets[0] > .zero,
            .histogramBuckets,
            "\(histogramBuckets.map(\.milliseconds))",
            "bounds must be positive and strictly increasing")
        try check(
            digestInterval == .zero || digestInterval >= .seconds(10), .digestInterval, seconds(digestInterval),
            "must be 0 (off) or at least 10 s")
        if let stateDirectory {
            try check(stateDirectory.hasPrefix("/"), .stateDirectory, stateDirectory, "must be an absolute path")
        }
        try check(
            monitorThreshold >= .milliseconds(10), .monitorThreshold, "\(monitorThreshold)", "must be at least 10 ms")
        try check(
            (100...10_000_000).contains(maximumTrackedStalls), .maximumTrackedStalls, "\(maximumTrackedStalls)",
            "must be between 100 and 10000000")
        try check(
            (1...100_000).contains(maximumUnits), .maximumUnits, "\(maximumUnits)", "must be between 1 and 100000")
    }

    /// The state directory in force: the configured one, `$STATE_DIRECTORY` (set by systemd's
    /// `StateDirectory=`), or `/var/lib/stallmond`.
    public func resolvedStateDirectory(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> String
    {
        if let stateDirectory { return stateDirectory }
        if let fromSystemd = environment["STATE_DIRECTORY"]?.split(separator: ":").first { return String(fromSystemd) }
        return "/var/lib/stallmond"
    }

    /// Every value as `key=value`, space-separated.
    public var summary: String {
        func seconds(_ duration: Duration) -> String {
            let value = duration.totalSeconds
            return value == value.rounded() ? "\(Int(value))" : "\(value)"
        }
        return [
            "metrics_path=\(metricsPath)", "metrics_interval_s=\(seconds(metricsInterval))",
            "windows_s=\(windows.map(seconds).joined(separator: ","))",
            "max_fingerprints_per_unit=\(maximumFingerprintsPerUnit)",
            "histogram_buckets_ms=\(histogramBuckets.map { String($0.milliseconds) }.joined(separator: ","))",
            "digest_interval_s=\(seconds(digestInterval))", "state_directory=\(stateDirectory ?? "")",
            "monitor_threshold_ms=\(monitorThreshold.milliseconds)",
            "max_tracked_stalls=\(maximumTrackedStalls)", "max_units=\(maximumUnits)",
        ].joined(separator: " ")
    }
}
