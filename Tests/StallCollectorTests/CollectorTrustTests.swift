import Foundation
import StallCollector
import StallConfiguration
import StallJournal
import StallMonitor
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Whom the collector trusts: journald's trusted fields. A system unit's stalls always have their
/// own series; every other writer is a user, budgeted by its `_UID`, whose flood folds only its
/// own series; series that stop stalling give way, and a replay comes to the same series.
struct CollectorTrustTests {
    /// An ended stall written by `uid` outside any unit under `identifier`.
    static func userEntry(
        _ identifier: String, uid: String = "65534", fingerprint: String = "aaaaaaaaaaaaaaaa", time: UInt64,
        cursor: String
    ) -> JournalEntry {
        var entry = Entries.entry(unit: nil, uid: uid, fingerprint: fingerprint, time: time, cursor: cursor)
        entry.fields["SYSLOG_IDENTIFIER"] = identifier
        return entry
    }

    @Test func trustedFieldsNameTheWriter() {
        #expect(StallObservation.owner(of: ["_SYSTEMD_UNIT": "foo.service", "_UID": "65534"]) == nil)
        #expect(StallObservation.unit(of: ["_SYSTEMD_UNIT": "foo.service", "_UID": "65534"]) == "foo.service")
        // A user's session, user manager and user units are the user's.
        for fields in [
            ["_SYSTEMD_UNIT": "session-3.scope", "_UID": "1000"],
            ["_SYSTEMD_UNIT": "user@1000.service", "_SYSTEMD_USER_UNIT": "tool.service", "_UID": "1000"],
            ["_SYSTEMD_UNIT": "run-u7.scope", "_SYSTEMD_OWNER_UID": "1000", "_UID": "1000"],
            ["_SYSTEMD_UNIT": "x.service", "_SYSTEMD_SLICE": "user-1000.slice", "_UID": "1000"],
        ] {
            #expect(StallObservation.owner(of: fields) == "1000", "\(fields)")
        }
        #expect(StallObservation.unit(of: ["SYSLOG_IDENTIFIER": "tool", "_UID": "1000"]) == "(tool) (uid 1000)")
        #expect(StallObservation.unit(of: ["SYSLOG_IDENTIFIER": "tool", "_UID": "0"]) == "(tool)")
        #expect(StallObservation.owner(of: ["SYSLOG_IDENTIFIER": "tool"]) == "")
        #expect(StallObservation.owner(of: ["SYSLOG_IDENTIFIER": "tool", "_UID": "1;2"]) == "")
    }

    /// `nobody` writes 520 made-up identifiers and 10 fingerprints under another program's name:
    /// a system unit's stall and another user's program keep their series, its own flood is
    /// folded, the metrics and the notes for the log say so.
    @Test func aUsersFloodFoldsOnlyItsOwnSeries() throws {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        var time: UInt64 = 1_800_000_000_000_000
        for index in 0..<520 {
            time += 1000
            aggregator.ingest(Self.userEntry("fake-\(index)", time: time, cursor: "f\(index)"))
        }
        for index in 0..<10 {
            time += 1000
            aggregator.ingest(
                Self.userEntry("tool", fingerprint: Entries.fingerprint(index + 1), time: time, cursor: "t\(index)"))
        }
        time += 1000
        aggregator.ingest(Entries.entry(unit: "real.service", uid: "998", time: time, cursor: "r"))
        time += 1000
        aggregator.ingest(
            Self.userEntry("tool", uid: "1000", fingerprint: Entries.fingerprint(99 + 1), time: time, cursor: "u"))
        let state = aggregator.snapshot()
        #expect(state.units["real.service"]?.stalls == 1)
        #expect(state.units["real.service"]?.owner == nil)
        let tool = try #require(state.units["(tool) (uid 1000)"])
        #expect(tool.fingerprints[Entries.fingerprint(99 + 1)]?.labeled == true, "its own fingerprint series")
        #expect(state.units.values.filter { $0.owner == "65534" }.count == 50)
        #expect(state.units[CollectorState.otherUnits]?.stalls == 480)
        #expect(state.users["65534"]?.foldedStalls == 480)
        #expect(state.users["1000"]?.foldedStalls == 0)
        let notes = aggregator.takeFoldNotes()
        #expect(
            notes.contains {
                $0.note.what == "unit" && $0.note.owner == "65534" && $0.note.reason.contains("max_units")
            })
        #expect(!notes.contains { $0.note.owner != "65534" })
        let text = PrometheusTextfile.render(state, windows: [.seconds(300)], now: time, aggregator: aggregator)
        #expect(text.contains(#"stallmon_stalls_total{unit="real.service"} 1"#))
        #expect(text.contains(#"stallmond_user_folded_stalls_total{uid="65534"} 480"#))
        #expect(text.contains(#"stallmond_user_folded_stalls_total{uid="1000"} 0"#))
    }

    /// A user's series that stop stalling for the longest window give way to its new ones, by
    /// recency; their counts go on under `(other units)`. The same entries read again from the
    /// start, or after a restart from a saved state, come to the same series.
    @Test func seriesThatStopStallingGiveWayAndAReplayComesToTheSameSeries() throws {
        var configuration = CollectorConfiguration()
        configuration.windows = [.seconds(60)]
        configuration.maximumUnits = 3
        configuration.maximumFingerprintsPerUnit = 2
        var entries: [JournalEntry] = []
        var time: UInt64 = 1_800_000_000_000_000
        for index in 0..<3 {
            time += 1_000_000
            entries.append(Self.userEntry("old-\(index)", time: time, cursor: "o\(index)"))
        }
        time += 1_000_000
        entries.append(Self.userEntry("new-0", time: time, cursor: "n0"))  // all three still stall: folded
        time += 61_000_000
        entries.append(Self.userEntry("old-2", time: time, cursor: "o2b"))  // old-2 stalls again
        time += 1_000_000
        entries.append(Self.userEntry("new-1", time: time, cursor: "n1"))  // old-0 gives way
        for index in 0..<3 {
            time += 1_000_000
            entries.append(Entries.entry(fingerprint: Entries.fingerprint(index + 1), time: time, cursor: "s\(index)"))
        }
        time += 61_000_000
        entries.append(Entries.entry(fingerprint: Entries.fingerprint(7 + 1), time: time, cursor: "s7"))

        var aggregator = StallAggregator(configuration: configuration)
        for entry in entries { aggregator.ingest(entry) }
        let state = aggregator.snapshot()
        let users = Set(state.units.filter { $0.value.owner == "65534" }.keys)
        #expect(users == ["(old-1) (uid 65534)", "(old-2) (uid 65534)", "(new-1) (uid 65534)"])
        #expect(state.evictedSeries == 1)
        #expect(state.units[CollectorState.otherUnits]?.stalls == 2, "new-0 folded, old-0 moved")
        #expect(state.units.values.reduce(0) { $0 + $1.stalls } == entries.count)
        let foo = try #require(state.units["foo.service"])
        #expect(
            Set(foo.fingerprints.filter(\.value.labeled).keys) == [
                Entries.fingerprint(1 + 1), Entries.fingerprint(7 + 1),
            ])
        #expect(state.evictedFingerprints == 1)
        #expect(foo.otherStalls == 2)

        // A replay from the journal's head, and a restart half-way from the saved state.
        var replay = StallAggregator(configuration: configuration)
        for entry in entries { replay.ingest(entry) }
        #expect(replay.snapshot() == state)
        var first = StallAggregator(configuration: configuration)
        for entry in entries.prefix(5) { first.ingest(entry) }
        let saved = try JSONDecoder().decode(CollectorState.self, from: JSONEncoder().encode(first.snapshot()))
        var restarted = StallAggregator(state: saved, configuration: configuration)
        for entry in entries.dropFirst(5) { restarted.ingest(entry) }
        #expect(restarted.snapshot() == state)
    }

    /// `{}` was taken for a fresh state, and negative counts were exported as they were: a state
    /// that cannot be is refused with the reason, and stallmond does not start on it.
    @Test func emptyOrImpossibleStatesAreRefused() throws {
        let directory = try ScratchDirectory.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = StateStore(directory: directory)
        var state = CollectorState()
        state.units["foo.service"] = CollectorState.UnitStats()
        state.units["foo.service"]!.stalls = 2
        try store.save(state)
        #expect(try store.load() == state)
        for (text, reason) in [
            ("{}", "not a stallmond state file"),
            (#"{"units":{},"malformedEntries":-1}"#, "malformedEntries is -1, below zero"),
            (
                #"{"units":{"a":{"stalls":-5,"totalMicroseconds":0,"buckets":[],"suppressedReports":0,"watchdogStalls":0,"otherStalls":0,"fingerprints":{}}}}"#,
                "units[a].stalls is -5, below zero"
            ),
            (
                #"{"units":{"a":{"stalls":1,"totalMicroseconds":0,"buckets":[],"suppressedReports":0,"watchdogStalls":0,"otherStalls":3,"fingerprints":{}}}}"#,
                "fewer than its watchdog (0) or other (3) stalls"
            ),
        ] {
            try text.write(toFile: store.path, atomically: true, encoding: .utf8)
            #expect {
                _ = try store.load()
            } throws: { error in
                "\(error)".contains(reason)
            }
        }
    }

    /// A FIFO or a directory given as the configuration once hung `--check-config`, `demo
    /// --config` and `STALLMON_CONFIG` until killed: each is refused at once, naming what it is.
    @Test func configurationPathThatIsNotARegularFileIsRefused() throws {
        let directory = try ScratchDirectory.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let fifo = directory + "/config.json"
        #expect(mkfifo(fifo, 0o600) == 0)
        #expect {
            _ = try CollectorConfiguration.load(path: fifo, required: true, environment: [:])
        } throws: { error in
            "\(error)".contains("is not a regular file (a FIFO)")
        }
        #expect {
            _ = try StallMonitor.Configuration(contentsOfFile: fifo)
        } throws: { error in
            "\(error)".contains("is not a regular file (a FIFO)")
        }
        #expect {
            _ = try StallMonitor.Configuration.fromEnvironment(["STALLMON_CONFIG": directory])
        } throws: { error in
            "\(error)".contains("is not a regular file (a directory)")
        }
    }
}
