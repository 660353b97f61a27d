import Foundation
import StallCollector
import StallJournal
import StallMonitor
import StallmonTestSupport
import Testing

/// The collector's aggregation, state and metrics, on entries built with the journal schema.
struct CollectorTests {
    @Test func shippedFileHoldsTheDefaults() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .appendingPathComponent("config/stallmond.json").path
        #expect(
            try CollectorConfiguration.load(path: path, required: true, environment: [:]) == CollectorConfiguration())
    }

    @Test func invalidConfigurationNamesKeyValueReasonAndSource() throws {
        let path = NSTemporaryDirectory() + "stallmond-\(UUID().uuidString).json"
        try #"{"metrics_interval_s": 0, "windows_s": [60]}"#.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect {
            _ = try CollectorConfiguration.load(path: path, required: true, environment: [:])
        } throws: { error in
            "\(error)" == "\(path): metrics_interval_s = 0: must be at least 1 s"
        }
        #expect {
            _ = try CollectorConfiguration.load(
                path: path, required: true,
                environment: ["STALLMOND_METRICS_INTERVAL_S": "5", "STALLMOND_HISTOGRAM_BUCKETS_MS": "500,250"])
        } throws: { error in
            (error as? ConfigurationError)?.key == "histogram_buckets_ms"
                && (error as? ConfigurationError)?.source == "STALLMOND_HISTOGRAM_BUCKETS_MS"
        }
        #expect {
            _ = try CollectorConfiguration.load(path: path + ".missing", required: true, environment: [:])
        } throws: { error in
            (error as? ConfigurationError)?.reason.hasPrefix("cannot be read") == true
        }
        // A missing file at the default path means the defaults.
        #expect(
            try CollectorConfiguration.load(path: path + ".missing", required: false, environment: [:])
                == CollectorConfiguration())
    }

    @Test func stallsAreCountedPerUnitAndFingerprintWithHistogram() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        aggregator.ingest(Entries.entry(milliseconds: 300, cursor: "1"))
        aggregator.ingest(Entries.entry(milliseconds: 1200, cursor: "2"))
        aggregator.ingest(
            Entries.entry(unit: "bar.service", fingerprint: "bbbbbbbbbbbbbbbb", milliseconds: 40_000, cursor: "3"))
        let state = aggregator.state
        #expect(state.cursor == "3")
        #expect(state.units["foo.service"]?.stalls == 2)
        #expect(state.units["foo.service"]?.totalMicroseconds == 1_500_000)
        // Buckets 250, 500, 1000, 2500, …, +Inf (non-cumulative in the state).
        #expect(state.units["foo.service"]?.buckets == [0, 1, 0, 1, 0, 0, 0, 0])
        #expect(state.units["bar.service"]?.buckets.last == 1)
        #expect(state.units["foo.service"]?.fingerprints["aaaaaaaaaaaaaaaa"]?.worstMicroseconds == 1_200_000)

        let text = PrometheusTextfile.render(
            state, windows: [.seconds(300)], now: 1_000_000_000, aggregator: aggregator)
        #expect(text.contains(#"stallmon_stalls_total{unit="foo.service"} 2"#))
        #expect(text.contains(#"stallmon_stall_duration_seconds_bucket{unit="foo.service",le="0.5"} 1"#))
        #expect(text.contains(#"stallmon_stall_duration_seconds_bucket{unit="foo.service",le="2.5"} 2"#))
        #expect(text.contains(#"stallmon_stall_duration_seconds_bucket{unit="foo.service",le="+Inf"} 2"#))
        #expect(text.contains(#"stallmon_stall_duration_seconds_sum{unit="foo.service"} 1.5"#))
        #expect(
            text.contains(
                #"stallmon_fingerprint_stalls_total{unit="foo.service",fingerprint="aaaaaaaaaaaaaaaa",frame="Foo.bar() (Foo.swift:16)"} 2"#
            ))
        #expect(text.contains(#"stallmon_window_stalls{unit="bar.service",window="5m"} 1"#))
    }

    @Test func windowGaugesKnowWhenTheirOldestStallLeaves() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        let windows: [Duration] = [.seconds(60), .seconds(600)]
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_000_000_000) == nil)
        aggregator.ingest(Entries.entry(time: 1_000_000_000, cursor: "1"))
        aggregator.ingest(Entries.entry(time: 1_030_000_000, cursor: "2"))
        // Both stalls count in both windows: the first leaves the 60 s window first.
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_040_000_000) == 1_060_000_001)
        // Once it has left, the second is next, then the 600 s window's first.
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_060_000_001) == 1_090_000_001)
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_090_000_001) == 1_600_000_001)
        let later = PrometheusTextfile.render(
            aggregator.state, windows: windows, now: 1_090_000_001, aggregator: aggregator)
        #expect(later.contains(#"stallmon_window_stalls{unit="foo.service",window="1m"} 0"#))
        #expect(later.contains(#"stallmon_window_stalls{unit="foo.service",window="10m"} 2"#))
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_630_000_001) == nil)
        // A hostile timestamp at the end of the clock counts in every window and never leaves.
        aggregator.ingest(Entries.entry(time: .max - 5, cursor: "3"))
        #expect(aggregator.stallsPerUnit(windows: windows, now: 1_630_000_001)[0]["foo.service"] == 1)
        #expect(aggregator.nextWindowExpiry(windows: windows, now: 1_630_000_001) == nil)
    }

    @Test func fingerprintCardinalityIsBoundedAndCountersNeverShrink() {
        var configuration = CollectorConfiguration()
        configuration.maximumFingerprintsPerUnit = 2
        var aggregator = StallAggregator(configuration: configuration)
        for (index, fingerprint) in [
            "00000000000000f1", "00000000000000f2", "00000000000000f3", "00000000000000f4", "00000000000000f1",
        ].enumerated() {
            aggregator.ingest(Entries.entry(fingerprint: fingerprint, cursor: "\(index)"))
        }
        let text = PrometheusTextfile.render(aggregator.state, windows: [], now: 1_000_000_000, aggregator: aggregator)
        let series = text.split(separator: "\n").filter { $0.hasPrefix("stallmon_fingerprint_stalls_total{") }
        #expect(series.count == 3)
        #expect(series.contains { $0.contains(#"fingerprint="00000000000000f1""#) && $0.hasSuffix(" 2") })
        #expect(series.contains { $0.contains(#"fingerprint="other""#) && $0.hasSuffix(" 2") })
    }

    @Test func watchdogAndEndedReportsOfOneStallCountOnce() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        aggregator.ingest(Entries.entry(.watchdog, milliseconds: 1500, stallID: String(repeating: "1", count: 32)))
        aggregator.ingest(Entries.entry(.ended, milliseconds: 2100, stallID: String(repeating: "1", count: 32)))
        aggregator.ingest(Entries.entry(.ended, milliseconds: 300, stallID: String(repeating: "2", count: 32)))
        #expect(aggregator.state.units["foo.service"]?.stalls == 2)
        #expect(aggregator.state.units["foo.service"]?.watchdogStalls == 1)
        #expect(aggregator.state.units["foo.service"]?.fingerprints["aaaaaaaaaaaaaaaa"]?.worstMicroseconds == 2_100_000)
    }

    @Test func malformedAndSuppressedEntriesAreCountedNotFatal() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        var broken = Entries.entry()
        broken.fields["STALL_DURATION_USEC"] = "long"
        guard case .malformed(let error) = aggregator.ingest(broken) else {
            Issue.record("a malformed entry was counted")
            return
        }
        #expect(error.field == "STALL_DURATION_USEC")
        let suppression = SuppressionRecord(
            message: "m", loop: "main", threadID: 1, fingerprint: "ffffffffffffffff", frame: "x", count: 4,
            totalDurationMicroseconds: 1,
            worstDurationMicroseconds: 1, rateLimitBurst: 5, rateLimitIntervalMicroseconds: 60_000_000, priority: 5,
            syslogIdentifier: "foo")
        var fields: [String: String] = ["_SYSTEMD_UNIT": "foo.service"]
        for field in suppression.fields { fields[field.name] = field.value }
        aggregator.ingest(JournalEntry(fields: fields, cursor: "s", realtimeMicroseconds: 1))
        #expect(aggregator.state.malformedEntries == 1)
        #expect(aggregator.state.units["foo.service"]?.suppressedReports == 4)
        #expect(aggregator.state.units["foo.service"]?.stalls == 0)
    }

    @Test func stateRoundTripsThroughItsFile() throws {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        aggregator.ingest(Entries.entry(cursor: "cursor-1"))
        let directory = NSTemporaryDirectory() + "stallmond-state-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = StateStore(directory: directory)
        try store.save(aggregator.state)
        #expect(try store.load() == aggregator.state)
        try "{not json".write(toFile: store.path, atomically: true, encoding: .utf8)
        #expect(throws: StateStore.StateError.self) { _ = try store.load() }
    }

    @Test func reportGroupsByUnitAndFingerprintWithMedianAndMaximum() {
        let stalls =
            [300, 500, 700, 2000].enumerated().map { index, milliseconds in
                StallObservation(
                    unit: "foo.service", stallID: "s\(index)", fingerprint: "f", frame: "Foo.bar()", callout: "timer",
                    durationMicroseconds: UInt64(milliseconds) * 1000, realtimeMicroseconds: 0, backtrace: "",
                    isWatchdog: false)
            } + [
                StallObservation(
                    unit: "foo.service", stallID: "s3", fingerprint: "f", frame: "Foo.bar()", callout: "timer",
                    durationMicroseconds: 1_500_000, realtimeMicroseconds: 0, backtrace: "", isWatchdog: true)
            ]
        let groups = StallGroup.group(stalls)
        #expect(groups.count == 1)
        #expect(groups[0].count == 4)
        #expect(groups[0].p50Microseconds == 500_000)
        #expect(groups[0].maxMicroseconds == 2_000_000)
        #expect(groups[0].watchdogKills == 1)
    }
}
