import Foundation
import StallCollector
import StallConfiguration
import Testing

/// stallmond's `watch` and `watch_threshold_ms`: what the tick watcher watches from outside.
struct WatchConfigurationTests {
    static func parse(_ json: String) throws(ConfigurationError) -> CollectorConfiguration {
        try CollectorConfiguration.parse(
            json: Data(json.utf8), source: "/etc/stallmon/stallmond.json", environment: [:])
    }

    @Test func executablePathsAndUnitGlobsAreRead() throws {
        let configuration = try Self.parse(
            #"{"watch": ["/usr/bin/web", "web.service", "worker-*.service"], "watch_threshold_ms": 100}"#)
        #expect(configuration.watch == [.executable("/usr/bin/web"), .unit("web.service"), .unit("worker-*.service")])
        #expect(configuration.watchThreshold == .milliseconds(100))
        #expect(configuration.summary.contains("watch=/usr/bin/web,web.service,worker-*.service"))
        #expect(try Self.parse("{}").watch.isEmpty)
    }

    @Test func anEntryThatIsNeitherAPathNorAUnitIsRefusedNamingItAndWhere() throws {
        for entry in ["web service", "", "bin/web", "web;rm"] {
            let error = try #require(throws: ConfigurationError.self) {
                try Self.parse(#"{"watch": ["\#(entry)"]}"#)
            }
            #expect(error.key == "watch")
            #expect(error.source == "/etc/stallmon/stallmond.json")
            #expect(error.reason == WatchPattern.requirement)
        }
    }

    @Test func aThresholdOutOfRangeOrAnEntryTwiceIsRefused() throws {
        for milliseconds in [9, 3_600_001] {
            let error = try #require(throws: ConfigurationError.self) {
                try Self.parse(#"{"watch_threshold_ms": \#(milliseconds)}"#)
            }
            #expect(error.key == "watch_threshold_ms")
            #expect(error.reason == "must be between 10 ms and 1 h (3600000 ms)")
        }
        let twice = try #require(throws: ConfigurationError.self) {
            try Self.parse(#"{"watch": ["web.service", "web.service"]}"#)
        }
        #expect(twice.key == "watch")
    }

    @Test func aUnitGlobMatchesAnyComponentOfTheCgroupAndAPathTheExecutable() {
        let glob = WatchPattern.unit("web-*.service")
        #expect(glob.matches(executable: "/usr/bin/x", cgroup: "/system.slice/web-1.service"))
        #expect(glob.matches(executable: "/usr/bin/x", cgroup: "/system.slice/web-1.service/workers"))
        #expect(!glob.matches(executable: "/usr/bin/x", cgroup: "/system.slice/api.service"))
        #expect(!glob.matches(executable: "/usr/bin/x", cgroup: ""))
        let path = WatchPattern.executable("/usr/bin/web")
        #expect(path.matches(executable: "/usr/bin/web", cgroup: "/"))
        #expect(!path.matches(executable: "/usr/bin/web2", cgroup: "/"))
    }
}

/// The tick watcher's scans turned into stall events.
struct ExternalStallTrackerTests {
    static let threshold: UInt64 = 100_000_000
    static let millisecond: UInt64 = 1_000_000

    static func tracker() -> ExternalStallTracker {
        let counter = Counter()
        return ExternalStallTracker(makeStallID: { counter.next() })
    }

    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var value = 0
        func next() -> String {
            lock.withLock {
                value += 1
                return String(repeating: "0", count: 31) + String(value, radix: 16)
            }
        }
    }

    static func tick(start: UInt64, wait: UInt64, long: (UInt64, UInt64) = (0, 0)) -> LoopTick {
        LoopTick(pid: 10, tid: 11, tickStart: start, waitStart: wait, longTickStart: long.0, longTickEnd: long.1)
    }

    @Test func aLongTickIsDetectedOnceAndEndsWithTheKernelsDuration() {
        var tracker = Self.tracker()
        let ms = Self.millisecond
        #expect(
            tracker.update([Self.tick(start: 1000 * ms, wait: 999 * ms)], now: 1050 * ms, threshold: Self.threshold)
                .isEmpty)
        let detected = tracker.update(
            [Self.tick(start: 1000 * ms, wait: 999 * ms)], now: 1101 * ms, threshold: Self.threshold)
        #expect(detected.map(\.kind) == [.detected])
        #expect(detected.first?.duration == 101 * ms)
        #expect(
            tracker.update([Self.tick(start: 1000 * ms, wait: 999 * ms)], now: 1200 * ms, threshold: Self.threshold)
                .isEmpty)
        let ended = tracker.update(
            [Self.tick(start: 1000 * ms, wait: 1250 * ms, long: (1000 * ms, 1250 * ms))], now: 1260 * ms,
            threshold: Self.threshold)
        #expect(ended.map(\.kind) == [.ended])
        #expect(ended.first?.stallID == detected.first?.stallID)
        #expect(ended.first?.duration == 250 * ms)
        #expect(tracker.openStallIDs.isEmpty)
        #expect(
            tracker.update(
                [Self.tick(start: 1300 * ms, wait: 1250 * ms, long: (1000 * ms, 1250 * ms))], now: 1310 * ms,
                threshold: Self.threshold
            ).isEmpty)
    }

    @Test func aLongTickBetweenTwoScansIsReportedEndedOnly() {
        var tracker = Self.tracker()
        let ms = Self.millisecond
        _ = tracker.update([Self.tick(start: 0, wait: 10 * ms)], now: 11 * ms, threshold: Self.threshold)
        let events = tracker.update(
            [Self.tick(start: 500 * ms, wait: 490 * ms, long: (20 * ms, 490 * ms))], now: 501 * ms,
            threshold: Self.threshold)
        #expect(events.map(\.kind) == [.ended])
        #expect(events.first?.duration == 470 * ms)
    }

    @Test func waitingIsNeverAStallAndAThreadSeenFirstKeepsItsHistory() {
        var tracker = Self.tracker()
        let ms = Self.millisecond
        // Seen first with a long tick of the past, and in a wait for a long time: nothing.
        #expect(
            tracker.update(
                [Self.tick(start: 10 * ms, wait: 500 * ms, long: (10 * ms, 500 * ms))], now: 5000 * ms,
                threshold: Self.threshold
            ).isEmpty)
    }

    @Test func aThreadThatEndsInsideALongTickEndsItsStall() {
        var tracker = Self.tracker()
        let ms = Self.millisecond
        _ = tracker.update([Self.tick(start: 0, wait: 10 * ms)], now: 11 * ms, threshold: Self.threshold)
        let detected = tracker.update(
            [Self.tick(start: 20 * ms, wait: 10 * ms)], now: 200 * ms, threshold: Self.threshold)
        var exited = Self.tick(start: 20 * ms, wait: 10 * ms, long: (20 * ms, 260 * ms))
        exited.exited = true
        let ended = tracker.update([exited], now: 270 * ms, threshold: Self.threshold)
        #expect(ended.map(\.kind) == [.ended])
        #expect(ended.first?.threadExited == true)
        #expect(ended.first?.stallID == detected.first?.stallID)
        #expect(ended.first?.duration == 240 * ms)
        // Seen for the first time already ended (it began and ended between two scans): reported.
        var fresh = Self.tracker()
        var gone = Self.tick(start: 20 * ms, wait: 10 * ms, long: (20 * ms, 150 * ms))
        gone.exited = true
        #expect(fresh.update([gone], now: 160 * ms, threshold: Self.threshold).map(\.kind) == [.ended])
    }

    @Test func aThreadThatVanishesTakesItsStallAlong() {
        var tracker = Self.tracker()
        let ms = Self.millisecond
        _ = tracker.update([Self.tick(start: 0, wait: 10 * ms)], now: 11 * ms, threshold: Self.threshold)
        #expect(
            tracker.update([Self.tick(start: 20 * ms, wait: 10 * ms)], now: 200 * ms, threshold: Self.threshold).count
                == 1)
        #expect(tracker.openStallIDs.count == 1)
        #expect(tracker.update([], now: 300 * ms, threshold: Self.threshold).isEmpty)
        #expect(tracker.openStallIDs.isEmpty)
    }
}

/// Whose a stall seen from outside is: the watched process's, by the fields journald adds for
/// `OBJECT_PID=` to a root writer's entry; never by fields a user writes.
struct ExternalAttributionTests {
    static let external: [String: String] = [
        "STALL_SOURCE": "external", "OBJECT_PID": "4211", "_UID": "0", "_SYSTEMD_UNIT": "stallmond.service",
        "SYSLOG_IDENTIFIER": "legacy-server", "OBJECT_SYSTEMD_UNIT": "legacy.service", "OBJECT_UID": "998",
        "OBJECT_COMM": "legacy-server",
    ]

    @Test func aStallSeenFromOutsideCountsUnderTheWatchedUnit() {
        #expect(StallObservation.unit(of: Self.external) == "legacy.service")
        #expect(StallObservation.owner(of: Self.external) == nil, "a system unit")
    }

    @Test func aWatchedProcessOutsideAUnitCountsAsItsOwnUser() {
        var fields = Self.external
        fields["OBJECT_SYSTEMD_UNIT"] = nil
        #expect(StallObservation.unit(of: fields) == "(legacy-server) (uid 998)")
    }

    @Test func aWriterThatIsNotRootCannotPassItsEntriesOffAsAnotherUnits() {
        var fields = Self.external
        fields["_UID"] = "1000"
        fields["_SYSTEMD_UNIT"] = nil
        #expect(StallObservation.unit(of: fields) == "(legacy-server) (uid 1000)")
        var linked = Self.external
        linked["STALL_SOURCE"] = nil
        #expect(StallObservation.unit(of: linked) == "stallmond.service", "only external entries")
    }
}
