import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The collector against hostile journal entries and a hostile file system: every local user can
/// write entries with our MESSAGE_IDs, and whoever may write the metrics directory can plant links.
struct CollectorHardeningTests {
    static func suppression(count: String, unit: String = "foo.service", cursor: String) -> JournalEntry {
        let record = SuppressionRecord(
            message: "m", loop: "main", threadID: 1, fingerprint: "aaaaaaaaaaaaaaaa", frame: "x", count: 1,
            totalDurationMicroseconds: 1, worstDurationMicroseconds: 1, rateLimitBurst: 5,
            rateLimitIntervalMicroseconds: 60_000_000, priority: 5, syslogIdentifier: "foo")
        var fields: [String: String] = ["_SYSTEMD_UNIT": unit]
        for field in record.fields { fields[field.name] = field.value }
        fields["STALL_SUPPRESSED_COUNT"] = count
        return JournalEntry(fields: fields, cursor: cursor, realtimeMicroseconds: 1_000_000_000)
    }

    static func stall(duration: String, cursor: String) -> JournalEntry {
        var entry = Entries.entry(cursor: cursor)
        entry.fields["STALL_DURATION_USEC"] = duration
        return entry
    }

    /// Two suppression entries summing past `Int.max`, and durations summing past `UInt64.max`,
    /// once trapped the aggregator (a crash loop: every restart re-read them). Now each is either
    /// refused as malformed or counted with saturation; no counter ever goes down.
    @Test func overflowingValuesNeitherTrapNorMakeCountersShrink() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        var previous = (suppressed: 0, stalls: 0, total: UInt64(0))
        let entries = [
            Self.suppression(count: "9223372036854775807", cursor: "1"),
            Self.suppression(count: "1", cursor: "2"),
            Self.suppression(count: "-1000", cursor: "3"),
            Self.stall(duration: "18446744073709551615", cursor: "4"),
            Self.stall(duration: "18446744073709551000", cursor: "5"),
            Self.stall(duration: "300000", cursor: "6"),
        ]
        for entry in entries {
            aggregator.ingest(entry)
            #expect(aggregator.state.cursor == entry.cursor, "every entry moves the cursor on")
            let unit = aggregator.state.units["foo.service"]
            let now = (unit?.suppressedReports ?? 0, unit?.stalls ?? 0, unit?.totalMicroseconds ?? 0)
            #expect(now.0 >= previous.suppressed)
            #expect(now.1 >= previous.stalls)
            #expect(now.2 >= previous.total)
            previous = now
        }
        #expect(previous.suppressed >= 1)
        #expect(previous.stalls >= 1)
    }

    /// 20,000 distinct fingerprints in one unit and 2,000 distinct identifiers of one user once
    /// grew the state without bound (44.6 MB for 10,000 fingerprints). Now the state holds at most
    /// the configured fingerprints per unit, series per user and recent stalls, and every stall is
    /// still counted.
    @Test func distinctFingerprintsAndUnitsAreFoldedAndTheStateStaysBounded() throws {
        var configuration = CollectorConfiguration()
        configuration.maximumFingerprintsPerUnit = 10
        configuration.maximumUnits = 100
        configuration.maximumTrackedStalls = 1000
        var aggregator = StallAggregator(configuration: configuration)
        for index in 0..<20_000 {
            let fingerprint = String(format: "%016llx", UInt64(index) &* 0x9E37_79B9_7F4A_7C15)
            aggregator.ingest(
                Entries.entry(
                    fingerprint: fingerprint, time: 1_000_000_000 + UInt64(index), cursor: "f\(index)"))
        }
        for index in 0..<2000 {
            var entry = Entries.entry(unit: nil, uid: "65534", time: 2_000_000_000, cursor: "u\(index)")
            entry.fields["SYSLOG_IDENTIFIER"] = "flood-\(index)"
            aggregator.ingest(entry)
        }
        let state = aggregator.snapshot()
        let foo = try #require(state.units["foo.service"])
        #expect(foo.stalls == 20_000)
        #expect(foo.fingerprints.count == 11, "10 of its own and other")
        #expect(foo.otherStalls == 19_990)
        #expect(foo.fingerprints[CollectorState.otherFingerprint]?.stalls == 19_990)
        #expect(state.foldedFingerprintStalls == 19_990)
        #expect(state.units.count == 102, "foo.service, the user's 100 series and (other units)")
        #expect(state.units["(flood-0) (uid 65534)"]?.owner == "65534")
        #expect(state.units[CollectorState.otherUnits]?.stalls == 1900)
        #expect(state.foldedUnitStalls == 1900)
        #expect(state.users["65534"]?.foldedStalls == 1900)
        #expect(state.units.values.reduce(0) { $0 + $1.stalls } == 22_000)
        #expect(state.recent.count == 1000)

        let encoded = try JSONEncoder().encode(state)
        #expect(encoded.count < 400_000, "state.json of \(encoded.count) bytes")

        let text = PrometheusTextfile.render(
            state, windows: [.seconds(300)], now: 2_000_000_000, aggregator: aggregator)
        let series = text.split(separator: "\n").filter { $0.hasPrefix("stallmon_fingerprint_stalls_total{") }
        #expect(series.count == 10 + 1 + 100 + 1, "bounded label cardinality")
        #expect(text.contains(#"stallmond_folded_stalls_total{what="fingerprint"} 19990"#))
        #expect(text.contains(#"stallmond_folded_stalls_total{what="unit"} 1900"#))
        #expect(text.contains(#"stallmond_user_folded_stalls_total{uid="65534"} 1900"#))
    }

    /// A state file from before the bounds (every fingerprint on its own, recent stalls per
    /// fingerprint, no newer fields) still loads; its fingerprints past the limit are folded.
    @Test func stateOfTheEarlierFormatLoadsAndIsFolded() throws {
        let earlier = """
            {"cursor":"c9","bucketBounds":[250000],"malformedEntries":2,"lastEntryMicroseconds":5,
             "watchdogStallIDs":[],
             "units":{"foo.service":{"stalls":3,"totalMicroseconds":900000,"buckets":[0,3],"suppressedReports":0,
              "watchdogStalls":0,"otherStalls":2,"fingerprints":{
               "aaaaaaaaaaaaaaaa":{"stalls":1,"totalMicroseconds":300000,"worstMicroseconds":300000,
                "lastSeenMicroseconds":5,"frame":"A","callout":"timer","heaviestBacktrace":"","labeled":true,
                "recent":[{"time":5,"duration":300000}]},
               "bbbbbbbbbbbbbbbb":{"stalls":1,"totalMicroseconds":300000,"worstMicroseconds":300000,
                "lastSeenMicroseconds":5,"frame":"B","callout":"timer","heaviestBacktrace":"","labeled":false,
                "recent":[]},
               "cccccccccccccccc":{"stalls":1,"totalMicroseconds":300000,"worstMicroseconds":400000,
                "lastSeenMicroseconds":5,"frame":"C","callout":"timer","heaviestBacktrace":"","labeled":false,
                "recent":[]}}}}}
            """
        let state = try JSONDecoder().decode(CollectorState.self, from: Data(earlier.utf8))
        #expect(state.cursor == "c9")
        #expect(state.malformedEntries == 2)
        var configuration = CollectorConfiguration()
        configuration.histogramBuckets = [.milliseconds(250)]
        let aggregator = StallAggregator(state: state, configuration: configuration)
        let foo = try #require(aggregator.state.units["foo.service"])
        #expect(Set(foo.fingerprints.keys) == ["aaaaaaaaaaaaaaaa", CollectorState.otherFingerprint])
        #expect(foo.fingerprints[CollectorState.otherFingerprint]?.stalls == 2)
        #expect(foo.fingerprints[CollectorState.otherFingerprint]?.frame == "C")
        #expect(foo.otherStalls == 2)
    }

    /// The type and permission bits of `path` itself (a link is not followed).
    static func kind(_ path: String) -> (type: FileAttributeType?, mode: Int?) {
        let attributes = try? FileManager.default.attributesOfItem(atPath: path)
        return (attributes?[.type] as? FileAttributeType, (attributes?[.posixPermissions] as? NSNumber)?.intValue)
    }

    /// A root-owned 0600 file, and links to it planted where the metrics writer once put its
    /// temporary file (`.<name>.<pid>.tmp`) and at the target: after a write the file is untouched.
    @Test func metricsWriteFollowsNoPlantedLink() throws {
        let directory = try ScratchDirectory.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let victim = directory + "/secret"
        try "secret\n".write(toFile: victim, atomically: false, encoding: .utf8)
        chmod(victim, 0o600)
        let target = directory + "/stallmon.prom"
        symlink(victim, directory + "/.stallmon.prom.\(getpid()).tmp")
        symlink(victim, target)

        try PrometheusTextfile.write("stallmon_stalls_total 1\n", to: target)

        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "secret\n")
        #expect(Self.kind(victim).mode == 0o600)
        #expect(Self.kind(target).type == .typeRegular, "the link was replaced")
        #expect(Self.kind(target).mode == 0o644)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "stallmon_stalls_total 1\n")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory).filter {
            $0.hasSuffix(".tmp") && $0 != ".stallmon.prom.\(getpid()).tmp"
        }
        #expect(leftovers.isEmpty)
    }

    /// A dangling link as the state file once meant "no state": counting restarted from the
    /// journal's head and every stall was counted again. A link of any kind is refused, and why.
    @Test func stateFileThatIsALinkIsRefusedAndSaysWhy() throws {
        let directory = try ScratchDirectory.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = StateStore(directory: directory)
        symlink(directory + "/nowhere.json", store.path)
        #expect {
            _ = try store.load()
        } throws: { error in
            "\(error)".contains("state.json: is a symbolic link; refusing to use it")
        }
        var state = CollectorState()
        state.cursor = "x"
        try StateStore(directory: directory + "/real").save(state)
        unlink(store.path)
        symlink(directory + "/real/state.json", store.path)
        #expect(throws: StateStore.StateError.self) { _ = try store.load() }
        unlink(store.path)
        #expect(try store.load() == CollectorState(), "no file at all is a fresh start")
    }

    /// install.sh once wrote the unit through `stallmond.service.tmp` in the unit directory, so a
    /// link planted there redirected a root-owned write.
    @Test func installScriptFollowsNoPlantedLink() throws {
        let directory = try ScratchDirectory.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let scratch = directory + "/build"
        try FileManager.default.createDirectory(atPath: scratch + "/release", withIntermediateDirectories: true)
        for name in ["stallmon", "stallmond", "stallmond-daemon"] {
            try FileManager.default.copyItem(
                atPath: Executable(name: name).url.path, toPath: scratch + "/release/" + name)
        }
        let destination = directory + "/root"
        let unitDirectory = destination + "/usr/local/lib/systemd/system"
        try FileManager.default.createDirectory(atPath: unitDirectory, withIntermediateDirectories: true)
        let victim = directory + "/victim"
        try "victim\n".write(toFile: victim, atomically: false, encoding: .utf8)
        chmod(victim, 0o600)
        symlink(victim, unitDirectory + "/stallmond.service.tmp")
        symlink(victim, unitDirectory + "/stallmond.service")

        let script = Repository.root.appendingPathComponent("Scripts/install.sh").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script, "--no-build", "--destdir", destination]
        process.environment = ProcessInfo.processInfo.environment.merging(["SCRATCH_PATH": scratch]) { $1 }
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)

        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "victim\n")
        #expect(Self.kind(victim).mode == 0o600)
        #expect(Self.kind(unitDirectory + "/stallmond.service").type == .typeRegular)
        #expect(Self.kind(unitDirectory + "/stallmond.service").mode == 0o644)
        let unit = try String(contentsOfFile: unitDirectory + "/stallmond.service", encoding: .utf8)
        #expect(unit.contains("ExecStart=/usr/local/bin/stallmond"))
    }
}
