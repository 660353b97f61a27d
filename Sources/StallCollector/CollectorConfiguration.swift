import Foundation
import StallConfiguration

/// stallmond's configuration. `config/stallmond.json` holds every knob with its default, and
/// `config/README.md` documents each one; `STALLMOND_<KEY>` variables override the file.
package struct CollectorConfiguration: Sendable, Hashable {
    /// Where the Prometheus textfile is written (atomically); empty disables metrics.
    package var metricsPath: String = "/var/lib/prometheus/node-exporter/stallmon.prom"
    /// How often the metrics file is rewritten when something changed.
    package var metricsInterval: Duration = .seconds(15)
    /// The windows the digest, the status line and the per-window gauges cover.
    package var windows: [Duration] = [.seconds(300), .seconds(3600), .seconds(86400)]
    /// Fingerprints per unit that get their own metric series; later ones count as `other`.
    package var maximumFingerprintsPerUnit: Int = 10
    /// Endpoints (routes, gRPC methods, span names) per unit that get their own metric series;
    /// later ones count as `(other endpoints)`.
    package var maximumEndpointsPerUnit: Int = 20
    /// Endpoints with their own series in all the units of one user (`_UID`, outside system units)
    /// together: with ``maximumUsers``, the bound on the host's endpoint series that users can make.
    package var maximumEndpointsPerUser: Int = 100
    /// Upper bounds of the stall duration histogram.
    package var histogramBuckets: [Duration] = [250, 500, 1000, 2500, 5000, 10000, 30000].map { .milliseconds($0) }
    /// How often a digest entry goes to the journal; zero disables it.
    package var digestInterval: Duration = .seconds(3600)
    /// Where the cursor and aggregates are kept; `nil` uses `$STATE_DIRECTORY`, then `/var/lib/stallmond`.
    package var stateDirectory: String? = nil
    /// The threshold of stallmond's own stall monitor (it watches its own main run loop).
    package var monitorThreshold: Duration = .milliseconds(250)
    /// Individual stalls remembered for the windows (memory bound); the oldest go first.
    package var maximumTrackedStalls: Int = 100_000
    /// Series per user (`_UID`) outside system units: a user's later series take the place of
    /// its least recent one that has not stalled for the longest window, or count under
    /// `(other units)`. System units always have their own series.
    package var maximumUnits: Int = 50
    /// Users (`_UID`s) with series of their own outside system units; a later user takes the
    /// place of the one whose latest stall is older than the longest window, or counts under
    /// `(other units)`.
    package var maximumUsers: Int = 20
    /// Hosts (machine ids) counted on their own; stalls of later hosts count under `(other hosts)`.
    package var maximumHosts: Int = 1000
    /// The journal directories read (`sd_journal_open_directory` each, with their machine-id
    /// subdirectories); empty reads the local journal. ``remoteJournalDirectory`` is where
    /// `systemd-journal-remote` writes what the fleet's hosts upload.
    package var journalDirectories: [String] = []
    /// At most this many of a machine's latest entries are read back when it has no saved position
    /// (a first start, a deleted `state.json`, a new machine), and none older than the longest
    /// window; the ones before are counted (`stallmond_skipped_entries_total`), not read.
    package var coldStartEntries: Int = 10_000
    /// The services stallmond watches from outside (its tick watcher): executable paths and systemd
    /// unit names or globs (see ``WatchPattern``); empty watches nothing.
    package var watch: [WatchPattern] = []
    /// A thread of a watched process out of its wait this long is stalled.
    package var watchThreshold: Duration = .milliseconds(250)

    /// `systemd-journal-remote`'s output directory (its unit's `--output=`).
    package static let remoteJournalDirectory = "/var/log/journal/remote"

    package init() {}

    /// The names in `config/stallmond.json`.
    package enum Key: String, CaseIterable, Sendable {
        case metricsPath = "metrics_path"
        case metricsInterval = "metrics_interval_s"
        case windows = "windows_s"
        case maximumFingerprintsPerUnit = "max_fingerprints_per_unit"
        case maximumEndpointsPerUnit = "max_endpoints_per_unit"
        case maximumEndpointsPerUser = "max_endpoints_per_user"
        case histogramBuckets = "histogram_buckets_ms"
        case digestInterval = "digest_interval_s"
        case stateDirectory = "state_directory"
        case monitorThreshold = "monitor_threshold_ms"
        case maximumTrackedStalls = "max_tracked_stalls"
        case maximumUnits = "max_units"
        case maximumUsers = "max_users"
        case maximumHosts = "max_hosts"
        case journalDirectories = "journal_directories"
        case coldStartEntries = "cold_start_entries"
        case watch = "watch"
        case watchThreshold = "watch_threshold_ms"
    }

    /// The default configuration file.
    package static let defaultPath = "/etc/stallmon/stallmond.json"
    /// The variable naming the configuration file when `--config` does not.
    package static let fileEnvironmentVariable = "STALLMOND_CONFIG"

    /// Which file to read, and whether it must exist.
    package struct Location: Sendable, Hashable {
        package var path: String
        /// `false` only for the default path: a missing default file means the defaults.
        package var required: Bool

        package init(path: String, required: Bool) {
            self.path = path
            self.required = required
        }

        /// `--config PATH`, else `$STALLMOND_CONFIG`, else the default path (which may be absent).
        /// - Throws: ``ConfigurationError`` when either names an empty path: an empty value is a
        ///   mistake (`STALLMOND_CONFIG=$UNSET`), never a request for the default file.
        package static func resolve(
            option: String?, environment: [String: String] = ProcessInfo.processInfo.environment
        ) throws(ConfigurationError) -> Self {
            if let option {
                guard !option.isEmpty else {
                    throw ConfigurationError(
                        key: "(file)", value: "\"\"", reason: "names no file (the path is empty)", source: "--config")
                }
                return Self(path: option, required: true)
            }
            if let path = environment[CollectorConfiguration.fileEnvironmentVariable] {
                guard !path.isEmpty else {
                    throw ConfigurationError(
                        key: "(file)", value: "\"\"",
                        reason: "is set but empty: name a configuration file, or unset it to use "
                            + CollectorConfiguration.defaultPath,
                        source: CollectorConfiguration.fileEnvironmentVariable)
                }
                return Self(path: path, required: true)
            }
            return Self(path: CollectorConfiguration.defaultPath, required: false)
        }
    }

    /// The one way stallmond reads its configuration, at `--check-config`, at start and on
    /// reload alike: where the file is, the file, then the `STALLMOND_<KEY>` overrides, validated.
    /// - Throws: ``ConfigurationError`` naming the key, the value, why, and the file or variable.
    package static func load(
        option: String?, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigurationError) -> (configuration: Self, location: Location) {
        let location = try Location.resolve(option: option, environment: environment)
        return (try load(path: location.path, required: location.required, environment: environment), location)
    }

    /// Reads the file at `path` (a missing file at the default path means the defaults), then the
    /// `STALLMOND_<KEY>` overrides, and validates the result.
    /// - Throws: ``ConfigurationError`` naming the key, the value, why, and the file or variable.
    package static func load(
        path: String, required: Bool, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigurationError) -> Self {
        let json = required || FileManager.default.fileExists(atPath: path) ? try ConfigurationDocument.read(path) : nil
        return try parse(json: json, source: path, environment: environment)
    }

    /// The defaults, then the JSON document `json` (named `source` in errors) if any, then the
    /// `STALLMOND_<KEY>` overrides in `environment`, validated.
    /// - Throws: ``ConfigurationError`` naming the key, the value, why, and the file or variable.
    package static func parse(json: Data?, source: String, environment: [String: String]) throws(ConfigurationError)
        -> Self
    {
        let keys = Key.allCases.map(\.rawValue)
        var entries: [ConfigurationDocument.Entry] = []
        if let json {
            entries = try ConfigurationDocument.parseJSON(json, source: source, knownKeys: keys)
        }
        entries += try ConfigurationDocument.environment(
            environment, prefix: "STALLMOND_", knownKeys: keys, otherVariables: [fileEnvironmentVariable])
        var configuration = Self()
        for entry in entries {
            try configuration.set(Key(rawValue: entry.key)!, to: entry.value, source: entry.source)
        }
        try ConfigurationDocument.validate(entries, defaultSource: "defaults") { () throws(ConfigurationError) in
            try configuration.validate()
        }
        return configuration
    }

    private mutating func set(_ key: Key, to value: ConfigurationValue, source: String) throws(ConfigurationError) {
        let name = key.rawValue
        switch key {
        case .metricsPath: metricsPath = try value.text(key: name, source: source) ?? ""
        case .metricsInterval: metricsInterval = try value.seconds(key: name, source: source)
        case .windows: windows = try value.durationList(key: name, source: source, unit: 1e9)
        case .maximumFingerprintsPerUnit: maximumFingerprintsPerUnit = try value.integer(key: name, source: source)
        case .maximumEndpointsPerUnit: maximumEndpointsPerUnit = try value.integer(key: name, source: source)
        case .maximumEndpointsPerUser: maximumEndpointsPerUser = try value.integer(key: name, source: source)
        case .histogramBuckets:
            // To the microsecond, the precision of the metrics' `le` label.
            histogramBuckets = try value.durationList(key: name, source: source, unit: 1e6).map {
                .microseconds(($0.nanoseconds + 500) / 1000)
            }
        case .digestInterval: digestInterval = try value.seconds(key: name, source: source)
        case .stateDirectory:
            let text = try value.text(key: name, source: source)
            stateDirectory = text?.isEmpty == false ? text : nil
        case .monitorThreshold: monitorThreshold = try value.milliseconds(key: name, source: source)
        case .maximumTrackedStalls: maximumTrackedStalls = try value.integer(key: name, source: source)
        case .maximumUnits: maximumUnits = try value.integer(key: name, source: source)
        case .maximumUsers: maximumUsers = try value.integer(key: name, source: source)
        case .maximumHosts: maximumHosts = try value.integer(key: name, source: source)
        case .journalDirectories: journalDirectories = try value.list(key: name, source: source)
        case .coldStartEntries: coldStartEntries = try value.integer(key: name, source: source)
        case .watch:
            watch = try value.list(key: name, source: source).map { (text) throws(ConfigurationError) in
                guard let pattern = WatchPattern(text) else {
                    throw ConfigurationError(
                        key: name, value: ConfigurationValue.shown(text), reason: WatchPattern.requirement,
                        source: source)
                }
                return pattern
            }
        case .watchThreshold: watchThreshold = try value.milliseconds(key: name, source: source)
        }
    }

    /// The configuration of stallmond's own stall monitor, which watches its main run loop.
    /// ``validate()`` checks it, so that a configuration `--check-config` accepts also starts.
    package var monitorConfiguration: StallMonitoring.Configuration {
        var configuration = StallMonitoring.Configuration()
        configuration.threshold = monitorThreshold
        // A threshold under the default sampling interval samples at the threshold.
        configuration.sampleInterval = min(configuration.sampleInterval, max(monitorThreshold, .milliseconds(1)))
        configuration.syslogIdentifier = "stallmond"
        return configuration
    }

    /// Checks every value, stallmond's own monitor's included: `--check-config`, start and reload
    /// all run this one check.
    /// - Throws: ``ConfigurationError`` naming the first invalid value and why.
    package func validate() throws(ConfigurationError) {
        func check(_ condition: Bool, _ key: Key, _ value: String, _ reason: String) throws(ConfigurationError) {
            guard condition else {
                throw ConfigurationError(key: key.rawValue, value: ConfigurationValue.shown(value), reason: reason)
            }
        }
        func seconds(_ duration: Duration) -> String {
            let value = duration.totalSeconds
            return value == value.rounded() && abs(value) < 1e15 ? "\(Int64(value))" : "\(value)"
        }
        func isPath(_ path: String) -> Bool {
            path.hasPrefix("/") && path.utf8.count <= 4096
                && !path.unicodeScalars.contains { $0.properties.generalCategory == .control }
        }
        try check(
            metricsPath.isEmpty || (isPath(metricsPath) && metricsPath.hasSuffix(".prom")), .metricsPath,
            metricsPath,
            "must be an absolute path ending in .prom (node_exporter's textfile collector reads only those), "
                + "at most 4096 bytes without control characters, or empty")
        try check(metricsInterval >= .seconds(1), .metricsInterval, seconds(metricsInterval), "must be at least 1 s")
        try check(
            metricsInterval <= .seconds(86400), .metricsInterval, seconds(metricsInterval), "must be at most 1 day")
        let windowList = "[\(windows.map(seconds).joined(separator: ", "))]"
        try check(!windows.isEmpty && windows.count <= 8, .windows, windowList, "must list 1 to 8 windows")
        try check(
            windows.allSatisfy { $0 >= .seconds(10) && $0 <= .seconds(30 * 86400) }, .windows, windowList,
            "each window must be between 10 s and 30 days")
        try check(
            windows.allSatisfy { $0 == .seconds($0.components.seconds) }, .windows, windowList,
            "each window must be a whole number of seconds")
        try check(
            zip(windows, windows.dropFirst()).allSatisfy { $0 < $1 }, .windows, windowList,
            "windows must be strictly increasing (each is one series of stallmon_window_stalls)")
        try check(
            (1...1000).contains(maximumFingerprintsPerUnit), .maximumFingerprintsPerUnit,
            "\(maximumFingerprintsPerUnit)", "must be between 1 and 1000")
        try check(
            (1...1000).contains(maximumEndpointsPerUnit), .maximumEndpointsPerUnit, "\(maximumEndpointsPerUnit)",
            "must be between 1 and 1000")
        try check(
            (1...100_000).contains(maximumEndpointsPerUser), .maximumEndpointsPerUser, "\(maximumEndpointsPerUser)",
            "must be between 1 and 100000")
        func milliseconds(_ duration: Duration) -> String {
            let nanoseconds = duration.nanoseconds
            return nanoseconds % 1_000_000 == 0 ? "\(nanoseconds / 1_000_000)" : "\(Double(nanoseconds) / 1e6)"
        }
        let bucketList = "[\(histogramBuckets.map(milliseconds).joined(separator: ", "))]"
        try check(
            !histogramBuckets.isEmpty && histogramBuckets.count <= 30, .histogramBuckets,
            "\(histogramBuckets.count) buckets", "must list 1 to 30 bucket bounds")
        try check(
            histogramBuckets.allSatisfy { $0 >= .milliseconds(1) && $0 <= .seconds(86400) }, .histogramBuckets,
            bucketList, "each bound must be between 1 ms and 1 day (86400000 ms)")
        // The `le` label shows whole microseconds: two bounds within one microsecond would be
        // two series with one label. (The file's values are rounded to the microsecond when read.)
        let microseconds = histogramBuckets.map(\.microseconds)
        try check(
            zip(microseconds, microseconds.dropFirst()).allSatisfy { $0 < $1 }, .histogramBuckets, bucketList,
            "bounds must be strictly increasing, to the microsecond (the precision of le)")
        try check(
            digestInterval == .zero || digestInterval >= .seconds(10), .digestInterval, seconds(digestInterval),
            "must be 0 (off) or at least 10 s")
        try check(
            digestInterval <= .seconds(30 * 86400), .digestInterval, seconds(digestInterval), "must be at most 30 days")
        if let stateDirectory {
            try check(
                isPath(stateDirectory), .stateDirectory, stateDirectory,
                "must be an absolute path of at most 4096 bytes without control characters")
        }
        // stallmond's own monitor: the library's own check, under the collector's key.
        do {
            try monitorConfiguration.validate()
        } catch {
            throw ConfigurationError(
                key: Key.monitorThreshold.rawValue, value: milliseconds(monitorThreshold),
                reason: error.key == "threshold_ms" ? error.reason : "stallmond's own monitor refuses it: \(error)")
        }
        try check(
            (100...10_000_000).contains(maximumTrackedStalls), .maximumTrackedStalls, "\(maximumTrackedStalls)",
            "must be between 100 and 10000000")
        try check(
            (1...100_000).contains(maximumUnits), .maximumUnits, "\(maximumUnits)", "must be between 1 and 100000")
        try check(
            (1...10_000).contains(maximumUsers), .maximumUsers, "\(maximumUsers)", "must be between 1 and 10000")
        try check(
            (1...10_000).contains(maximumHosts), .maximumHosts, "\(maximumHosts)", "must be between 1 and 10000")
        let directoryList = "[\(journalDirectories.joined(separator: ", "))]"
        try check(
            journalDirectories.count <= 64, .journalDirectories, directoryList, "must list at most 64 directories")
        for directory in journalDirectories {
            try check(
                isPath(directory), .journalDirectories, directory,
                "each directory must be an absolute path of at most 4096 bytes without control characters")
        }
        try check(
            Set(journalDirectories).count == journalDirectories.count, .journalDirectories, directoryList,
            "must not list a directory twice (its entries would be read twice)")
        try check(
            (0...10_000_000).contains(coldStartEntries), .coldStartEntries, "\(coldStartEntries)",
            "must be between 0 and 10000000")
        let watchList = "[\(watch.map(\.description).joined(separator: ", "))]"
        try check(watch.count <= 64, .watch, watchList, "must list at most 64 executables and units")
        try check(
            Set(watch).count == watch.count, .watch, watchList, "must not list an executable or a unit twice")
        try check(
            watchThreshold >= .milliseconds(10) && watchThreshold <= .seconds(3600), .watchThreshold,
            milliseconds(watchThreshold), "must be between 10 ms and 1 h (3600000 ms)")
    }

    /// The state directory in force: the configured one, `$STATE_DIRECTORY` (set by systemd's
    /// `StateDirectory=`), or `/var/lib/stallmond`.
    package func resolvedStateDirectory(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> String
    {
        if let stateDirectory { return stateDirectory }
        if let fromSystemd = environment["STATE_DIRECTORY"]?.split(separator: ":").first { return String(fromSystemd) }
        return "/var/lib/stallmond"
    }

    /// Every value as `key=value`, space-separated.
    package var summary: String {
        func seconds(_ duration: Duration) -> String {
            let value = duration.totalSeconds
            return value == value.rounded() ? "\(Int(value))" : "\(value)"
        }
        return [
            "metrics_path=\(metricsPath)", "metrics_interval_s=\(seconds(metricsInterval))",
            "windows_s=\(windows.map(seconds).joined(separator: ","))",
            "max_fingerprints_per_unit=\(maximumFingerprintsPerUnit)",
            "max_endpoints_per_unit=\(maximumEndpointsPerUnit)", "max_endpoints_per_user=\(maximumEndpointsPerUser)",
            "histogram_buckets_ms=\(histogramBuckets.map { String($0.milliseconds) }.joined(separator: ","))",
            "digest_interval_s=\(seconds(digestInterval))", "state_directory=\(stateDirectory ?? "")",
            "monitor_threshold_ms=\(monitorThreshold.milliseconds)",
            "max_tracked_stalls=\(maximumTrackedStalls)", "max_units=\(maximumUnits)", "max_users=\(maximumUsers)",
            "max_hosts=\(maximumHosts)",
            "journal_directories=\(journalDirectories.isEmpty ? "(local journal)" : journalDirectories.joined(separator: ","))",
            "cold_start_entries=\(coldStartEntries)",
            "watch=\(watch.isEmpty ? "(nothing)" : watch.map(\.description).joined(separator: ","))",
            "watch_threshold_ms=\(watchThreshold.milliseconds)",
        ].joined(separator: " ")
    }
}
