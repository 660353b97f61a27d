import Foundation
import StallCollector
import StallConfiguration
import StallMonitor
import Testing

/// stallmond's configuration: the same reading rules, its own bounds, and one check for
/// `--check-config`, start and reload.
struct CollectorConfigurationTests {
    static func error(json: String? = nil, environment: [String: String] = [:]) -> ConfigurationError? {
        do {
            _ = try CollectorConfiguration.parse(
                json: json.map { Data($0.utf8) }, source: "/etc/stallmon/stallmond.json", environment: environment)
            return nil
        } catch {
            return error
        }
    }

    @Test(arguments: [
        #"{"windows_s": [1e10]}"#, #"{"windows_s": [-1e10]}"#, #"{"windows_s": [300, 1e300]}"#,
        #"{"windows_s": [1e400]}"#, #"{"histogram_buckets_ms": [1e20]}"#, #"{"histogram_buckets_ms": [-5]}"#,
        #"{"histogram_buckets_ms": [250, 1e300]}"#, #"{"metrics_interval_s": 1e300}"#,
        #"{"digest_interval_s": -1e300}"#, #"{"monitor_threshold_ms": 1e300}"#, #"{"max_tracked_stalls": 1e300}"#,
    ])
    func hugeOrNegativeValueInTheFileIsAnErrorNotACrash(_ json: String) throws {
        let error = try #require(Self.error(json: json))
        let key = try #require(json.split(separator: "\"").dropFirst().first.map(String.init))
        #expect(error.key == key)
        #expect(error.source == "/etc/stallmon/stallmond.json")
        #expect(json.contains(error.value), "the value as written: \(error)")
    }

    @Test func hugeOrNegativeValueInTheEnvironmentIsAnErrorNotACrash() throws {
        for (variable, value) in [
            ("STALLMOND_WINDOWS_S", "1e10"), ("STALLMOND_WINDOWS_S", "300,-1e19"),
            ("STALLMOND_HISTOGRAM_BUCKETS_MS", "1e16"), ("STALLMOND_HISTOGRAM_BUCKETS_MS", "-1e300"),
        ] {
            let error = try #require(Self.error(environment: [variable: value]), "\(variable)=\(value)")
            #expect(error.source == variable)
            #expect(error.value == "\"\(value)\"")
        }
    }

    @Test func monitorThresholdThatTheCheckAcceptsAlsoStartsTheMonitor() throws {
        for milliseconds in [10, 15, 19, 20, 250, 3_600_000] {
            let configuration = try CollectorConfiguration.parse(
                json: Data(#"{"monitor_threshold_ms": \#(milliseconds)}"#.utf8), source: "x", environment: [:])
            #expect(configuration.monitorConfiguration.threshold == .milliseconds(milliseconds))
            _ = try StallMonitor(configuration: configuration.monitorConfiguration, sinks: [])
        }
        for (milliseconds, reason) in [(9, "must be at least 10 ms"), (3_600_001, "must be at most 1 hour")] {
            let error = try #require(Self.error(json: #"{"monitor_threshold_ms": \#(milliseconds)}"#))
            #expect(
                error.description == "/etc/stallmon/stallmond.json: monitor_threshold_ms = \(milliseconds): \(reason)")
        }
    }

    @Test func histogramBoundsThatShareAnLeLabelAreRefused() throws {
        let same = try #require(Self.error(json: #"{"histogram_buckets_ms": [1.0001, 1.0002, 5]}"#))
        #expect(same.key == "histogram_buckets_ms")
        #expect(same.reason == "bounds must be strictly increasing, to the microsecond (the precision of le)")
        let tiny = try #require(Self.error(json: #"{"histogram_buckets_ms": [0.0001, 0.0002]}"#))
        #expect(tiny.reason == "each bound must be between 1 ms and 1 day (86400000 ms)")
        // Fractions of a millisecond to the microsecond are kept, and stay distinct.
        let fine = try CollectorConfiguration.parse(
            json: Data(#"{"histogram_buckets_ms": [1.001, 1.002, 12.5]}"#.utf8), source: "x", environment: [:])
        #expect(fine.histogramBuckets == [.microseconds(1001), .microseconds(1002), .microseconds(12500)])
        let windows = try #require(Self.error(json: #"{"windows_s": [300, 300]}"#))
        #expect(windows.reason.hasPrefix("windows must be strictly increasing"))
        #expect(Self.error(json: #"{"windows_s": [300.5]}"#)?.reason == "each window must be a whole number of seconds")
    }

    @Test func looseInputIsRefusedNamingWhatAndWhere() throws {
        let trailing = try #require(Self.error(json: #"{"windows_s": [300, 3600],}"#))
        #expect(
            trailing.description.hasPrefix("/etc/stallmon/stallmond.json: (file): not valid JSON: a trailing comma"))
        let list = try #require(Self.error(environment: ["STALLMOND_WINDOWS_S": "300,,3600"]))
        #expect(
            list.description
                == #"STALLMOND_WINDOWS_S: windows_s = "300,,3600": must be a list of numbers (an element between commas is empty)"#
        )
        let hexadecimal = try #require(Self.error(environment: ["STALLMOND_METRICS_INTERVAL_S": "0x10"]))
        #expect(
            hexadecimal.description
                == #"STALLMOND_METRICS_INTERVAL_S: metrics_interval_s = "0x10": must be a number of seconds"#)
        let typo = try #require(Self.error(environment: ["STALLMOND_WINDOW_S": "60"]))
        #expect(typo.source == "STALLMOND_WINDOW_S")
        #expect(typo.reason.hasPrefix("unknown variable; did you mean STALLMOND_WINDOWS_S?"))
        #expect(Self.error(environment: ["STALLMOND_CONFIG": "/x.json", "STALLMON_THRESHOLD_MS": "5"]) == nil)
        let path = try #require(Self.error(json: #"{"metrics_path": "/a\nb.prom"}"#))
        #expect(path.key == "metrics_path")
    }

    @Test func emptyConfigPathIsAnErrorNamingWhereItWasSet() throws {
        #expect {
            _ = try CollectorConfiguration.Location.resolve(option: nil, environment: ["STALLMOND_CONFIG": ""])
        } throws: { error in
            "\(error)".hasPrefix(#"STALLMOND_CONFIG: (file) = "": is set but empty"#)
        }
        #expect(throws: ConfigurationError.self) {
            _ = try CollectorConfiguration.Location.resolve(option: "", environment: [:])
        }
        #expect(
            try CollectorConfiguration.Location.resolve(option: nil, environment: [:])
                == .init(path: "/etc/stallmon/stallmond.json", required: false))
        #expect(
            try CollectorConfiguration.Location.resolve(option: "/a.json", environment: ["STALLMOND_CONFIG": ""])
                == .init(path: "/a.json", required: true))
    }
}
