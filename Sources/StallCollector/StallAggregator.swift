import StallJournal
import StallMonitor

/// One stall as the collector counts it, from an ended (or watchdog) journal entry.
public struct StallObservation: Sendable, Hashable {
    /// `_SYSTEMD_UNIT`, or `SYSLOG_IDENTIFIER` for processes outside a unit.
    public var unit: String
    public var stallID: String
    public var fingerprint: String
    public var frame: String
    public var callout: String
    public var durationMicroseconds: UInt64
    /// When journald received the entry (microseconds since the epoch).
    public var realtimeMicroseconds: UInt64
    public var backtrace: String
    /// A stall that outlasted `WatchdogSec=` (systemd killed the service).
    public var isWatchdog: Bool

    public init(
        unit: String, stallID: String, fingerprint: String, frame: String, callout: String,
        durationMicroseconds: UInt64, realtimeMicroseconds: UInt64, backtrace: String, isWatchdog: Bool
    ) {
        self.unit = unit
        self.stallID = stallID
        self.fingerprint = fingerprint
        self.frame = frame
        self.callout = callout
        self.durationMicroseconds = durationMicroseconds
        self.realtimeMicroseconds = realtimeMicroseconds
        self.backtrace = backtrace
        self.isWatchdog = isWatchdog
    }

    /// The unit an entry came from.
    public static func unit(of fields: [String: String]) -> String {
        fields["_SYSTEMD_UNIT"] ?? fields["_SYSTEMD_USER_UNIT"] ?? fields["SYSLOG_IDENTIFIER"].map { "(\($0))" }
            ?? "(unknown)"
    }

    public init(record: StallRecord, unit: String, realtimeMicroseconds: UInt64) {
        self.init(
            unit: unit, stallID: record.stallID, fingerprint: record.fingerprint, frame: record.frame,
            callout: record.callout, durationMicroseconds: record.durationMicroseconds,
            realtimeMicroseconds: realtimeMicroseconds, backtrace: record.backtrace,
            isWatchdog: record.event == .watchdog
        )
    }
}

/// What the collector knows, persisted as one document so that the cursor and the counts it
/// reflects always agree: a restart neither loses nor double-counts.
public struct CollectorState: Codable, Sendable, Hashable {
    /// The journal cursor of the last entry counted.
    public var cursor: String?
    public var units: [String: UnitStats] = [:]
    /// Histogram bounds (microseconds) the unit histograms were counted with.
    public var bucketBounds: [UInt64] = []
    /// STALL_IDs of watchdog reports, so that a later ended report of the same stall is not counted twice.
    public var watchdogStallIDs: [String] = []
    /// Entries that did not match the schema.
    public var malformedEntries: Int = 0
    /// When the latest counted entry was received (microseconds since the epoch).
    public var lastEntryMicroseconds: UInt64 = 0

    public init() {}

    public struct UnitStats: Codable, Sendable, Hashable {
        public var stalls: Int = 0
        public var totalMicroseconds: UInt64 = 0
        /// Lifetime counts per histogram bucket (the last one is +Inf).
        public var buckets: [Int] = []
        public var suppressedReports: Int = 0
        public var watchdogStalls: Int = 0
        public var fingerprints: [String: FingerprintStats] = [:]
        /// Stalls counted under fingerprint `other` (fingerprints past the per-unit limit).
        public var otherStalls: Int = 0
    }

    public struct FingerprintStats: Codable, Sendable, Hashable {
        public var stalls: Int = 0
        public var totalMicroseconds: UInt64 = 0
        public var worstMicroseconds: UInt64 = 0
        public var lastSeenMicroseconds: UInt64 = 0
        public var frame: String = ""
        public var callout: String = ""
        /// The backtrace of the longest stall.
        public var heaviestBacktrace: String = ""
        /// Whether it has its own metric series (the first fingerprints of a unit do, for good).
        public var labeled: Bool = false
        /// Recent stalls (receive time, duration) for the windows.
        public var recent: [Recent] = []
    }

    public struct Recent: Codable, Sendable, Hashable {
        public var time: UInt64
        public var duration: UInt64
    }
}

/// Counts stalls per unit × fingerprint over the collector's lifetime and its windows.
public struct StallAggregator: Sendable {
    public private(set) var state: CollectorState
    private var configuration: CollectorConfiguration

    public init(state: CollectorState = CollectorState(), configuration: CollectorConfiguration) {
        self.state = state
        self.configuration = configuration
        apply(configuration)
    }

    /// Takes a new configuration; histograms counted with other bounds start again.
    public mutating func apply(_ configuration: CollectorConfiguration) {
        self.configuration = configuration
        let bounds = configuration.histogramBuckets.map {
            UInt64($0.microseconds)
        }
        if state.bucketBounds != bounds {
            state.bucketBounds = bounds
            for unit in state.units.keys { state.units[unit]?.buckets = Array(repeating: 0, count: bounds.count + 1) }
        }
    }

    /// What an entry did to the counts.
    public enum Outcome: Sendable, Equatable {
        case stall(StallObservation)
        case stallUpdated(StallObservation)
        case suppressed(unit: String, count: Int)
        case ignored
        case malformed(JournalDecodingError)
    }

    /// Counts one journal entry (an ended, watchdog or suppression entry) and moves the cursor past it.
    @discardableResult
    public mutating func ingest(_ entry: JournalEntry) -> Outcome {
        state.cursor = entry.cursor
        state.lastEntryMicroseconds = max(state.lastEntryMicroseconds, entry.realtimeMicroseconds)
        let unit = StallObservation.unit(of: entry.fields)
        switch entry["MESSAGE_ID"] {
        case MessageID.reportsSuppressed:
            do {
                let record = try SuppressionRecord(journalFields: entry.fields)
                var stats = state.units[unit] ?? newUnit()
                stats.suppressedReports += record.count
                state.units[unit] = stats
                return .suppressed(unit: unit, count: record.count)
            } catch {
                state.malformedEntries += 1
                return .malformed(error)
            }
        case MessageID.stallEnded, MessageID.watchdogStall:
            do {
                let record = try StallRecord(journalFields: entry.fields)
                return count(
                    StallObservation(record: record, unit: unit, realtimeMicroseconds: entry.realtimeMicroseconds))
            } catch {
                state.malformedEntries += 1
                return .malformed(error)
            }
        default:
            return .ignored
        }
    }

    private func newUnit() -> CollectorState.UnitStats {
        var stats = CollectorState.UnitStats()
        stats.buckets = Array(repeating: 0, count: state.bucketBounds.count + 1)
        return stats
    }

    private mutating func count(_ stall: StallObservation) -> Outcome {
        var unit = state.units[stall.unit] ?? newUnit()
        // A stall that outlasted the watchdog is counted once, from whichever report comes first.
        if !stall.isWatchdog, state.watchdogStallIDs.contains(stall.stallID) {
            state.watchdogStallIDs.removeAll { $0 == stall.stallID }
            var fingerprint = unit.fingerprints[stall.fingerprint] ?? CollectorState.FingerprintStats()
            fingerprint.worstMicroseconds = max(fingerprint.worstMicroseconds, stall.durationMicroseconds)
            unit.fingerprints[stall.fingerprint] = fingerprint
            state.units[stall.unit] = unit
            return .stallUpdated(stall)
        }
        if stall.isWatchdog {
            state.watchdogStallIDs.append(stall.stallID)
            if state.watchdogStallIDs.count > 1000 { state.watchdogStallIDs.removeFirst() }
            unit.watchdogStalls += 1
        }
        unit.stalls += 1
        unit.totalMicroseconds += stall.durationMicroseconds
        let bucket = state.bucketBounds.firstIndex { stall.durationMicroseconds <= $0 } ?? state.bucketBounds.count
        unit.buckets[bucket] += 1

        var fingerprint = unit.fingerprints[stall.fingerprint] ?? CollectorState.FingerprintStats()
        if fingerprint.stalls == 0 {
            fingerprint.labeled =
                unit.fingerprints.values.filter(\.labeled).count < configuration.maximumFingerprintsPerUnit
        }
        if !fingerprint.labeled { unit.otherStalls += 1 }
        fingerprint.stalls += 1
        fingerprint.totalMicroseconds += stall.durationMicroseconds
        fingerprint.lastSeenMicroseconds = max(fingerprint.lastSeenMicroseconds, stall.realtimeMicroseconds)
        fingerprint.frame = stall.frame
        fingerprint.callout = stall.callout
        if stall.durationMicroseconds >= fingerprint.worstMicroseconds {
            fingerprint.worstMicroseconds = stall.durationMicroseconds
            fingerprint.heaviestBacktrace = stall.backtrace
        }
        fingerprint.recent.append(
            CollectorState.Recent(time: stall.realtimeMicroseconds, duration: stall.durationMicroseconds))
        unit.fingerprints[stall.fingerprint] = fingerprint
        state.units[stall.unit] = unit
        trim(now: stall.realtimeMicroseconds)
        return .stall(stall)
    }

    /// Forgets stalls older than the longest window, and the oldest past the tracking limit.
    public mutating func trim(now: UInt64) {
        let longest = configuration.windows.map { UInt64($0.microseconds) }.max() ?? 0
        let horizon = now > longest ? now - longest : 0
        var tracked = 0
        for (unitName, unit) in state.units {
            for (key, fingerprint) in unit.fingerprints
            where fingerprint.recent.first.map({ $0.time < horizon }) == true {
                state.units[unitName]?.fingerprints[key]?.recent.removeAll { $0.time < horizon }
            }
            tracked += unit.fingerprints.values.reduce(0) { $0 + $1.recent.count }
        }
        while tracked > configuration.maximumTrackedStalls {
            // Drop the single oldest stall.
            var oldest: (unit: String, key: String, time: UInt64)?
            for (unitName, unit) in state.units {
                for (key, fingerprint) in unit.fingerprints {
                    if let first = fingerprint.recent.first, first.time < oldest?.time ?? .max {
                        oldest = (unitName, key, first.time)
                    }
                }
            }
            guard let oldest else { break }
            state.units[oldest.unit]?.fingerprints[oldest.key]?.recent.removeFirst()
            tracked -= 1
        }
    }

    /// One unit × fingerprint over a window.
    public struct WindowGroup: Sendable, Hashable {
        public var unit: String
        public var fingerprint: String
        public var stalls: Int
        public var totalMicroseconds: UInt64
        public var worstMicroseconds: UInt64
        public var frame: String
        public var callout: String
    }

    /// The groups with stalls received in the last `window` before `now` (epoch microseconds), worst first.
    public func groups(window: Duration, now: UInt64) -> [WindowGroup] {
        let length = UInt64(window.microseconds)
        let since = now > length ? now - length : 0
        var groups: [WindowGroup] = []
        for (unitName, unit) in state.units {
            for (key, fingerprint) in unit.fingerprints {
                let recent = fingerprint.recent.filter { $0.time >= since }
                guard !recent.isEmpty else { continue }
                groups.append(
                    WindowGroup(
                        unit: unitName, fingerprint: key, stalls: recent.count,
                        totalMicroseconds: recent.reduce(0) { $0 + $1.duration },
                        worstMicroseconds: recent.map(\.duration).max() ?? 0, frame: fingerprint.frame,
                        callout: fingerprint.callout))
            }
        }
        return groups.sorted {
            ($0.worstMicroseconds, $0.unit, $0.fingerprint) > ($1.worstMicroseconds, $1.unit, $1.fingerprint)
        }
    }

    /// The digest of the last `window`.
    public func digest(window: Duration, now: UInt64) -> DigestRecord {
        let groups = groups(window: window, now: now)
        let stalls = groups.reduce(0) { $0 + $1.stalls }
        let units = Set(groups.map(\.unit)).count
        let worst = groups.first
        let windowText = Self.describe(window)
        var message =
            "stall digest for the last \(windowText): \(stalls) stall\(stalls == 1 ? "" : "s") in \(units) unit\(units == 1 ? "" : "s")"
        if let worst {
            message += "; worst \(worst.worstMicroseconds / 1000) ms in \(worst.unit) at \(worst.frame)"
        }
        return DigestRecord(
            message: message, stalls: stalls, units: units,
            windowMicroseconds: UInt64(window.microseconds),
            worstMicroseconds: worst?.worstMicroseconds ?? 0, worstUnit: worst?.unit ?? "",
            worstFrame: worst?.frame ?? "")
    }

    static func describe(_ window: Duration) -> String {
        let seconds = window.components.seconds
        if seconds % 86400 == 0 { return "\(seconds / 86400)d" }
        if seconds % 3600 == 0 { return "\(seconds / 3600)h" }
        if seconds % 60 == 0 { return "\(seconds / 60)m" }
        return "\(seconds)s"
    }
}
