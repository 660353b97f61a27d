import StallConfiguration
import StallJournal

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
    /// The machine it happened on (`_MACHINE_ID`; empty where the entry has none)…
    public var machineID: String
    /// …and that machine's name (`_HOSTNAME`, cut like other identities; empty where none).
    public var host: String

    public init(
        unit: String, stallID: String, fingerprint: String, frame: String, callout: String,
        durationMicroseconds: UInt64, realtimeMicroseconds: UInt64, backtrace: String, isWatchdog: Bool,
        machineID: String = "", host: String = ""
    ) {
        self.machineID = machineID
        self.host = host
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

    public init(
        record: StallRecord, unit: String, realtimeMicroseconds: UInt64, machineID: String = "", host: String = ""
    ) {
        self.init(
            unit: unit, stallID: record.stallID, fingerprint: record.fingerprint, frame: record.frame,
            callout: record.callout, durationMicroseconds: record.durationMicroseconds,
            realtimeMicroseconds: realtimeMicroseconds, backtrace: record.backtrace,
            isWatchdog: record.event == .watchdog, machineID: machineID, host: host
        )
    }

    /// A stall read from `entry`, with its unit, time and host.
    public init(record: StallRecord, entry: JournalEntry) {
        self.init(
            record: record, unit: Self.unit(of: entry.fields), realtimeMicroseconds: entry.realtimeMicroseconds,
            machineID: entry.machineID ?? "", host: entry["_HOSTNAME"] ?? "")
    }
}

/// What the collector knows, persisted as one document so that the cursor and the counts it
/// reflects always agree: a restart neither loses nor double-counts.
///
/// Everything in it is bounded, whatever the journal holds: at most ``CollectorConfiguration/maximumUnits``
/// units (later ones count under ``CollectorState/otherUnits``), at most
/// ``CollectorConfiguration/maximumFingerprintsPerUnit`` fingerprints per unit (later ones count
/// under ``CollectorState/otherFingerprint``), at most ``CollectorConfiguration/maximumHosts`` hosts
/// (later ones count under ``CollectorState/otherHosts``), ``CollectorConfiguration/maximumTrackedStalls``
/// recent stalls, 1000 watchdog stall IDs, and strings as long as the journal schema allows. One
/// position per source machine (``sources``): as many as the journal files read hold.
public struct CollectorState: Codable, Sendable, Hashable {
    /// The journal cursor of the last entry counted.
    public var cursor: String?
    /// Where reading stands for each machine whose entries were read, by `_MACHINE_ID` (`""` for
    /// entries without one): one journal over several machines' files has one order across them,
    /// and a machine whose entries arrive late (an uploader that was down) sorts behind the others.
    public var sources: [String: Source] = [:]
    /// Hosts by machine id; hosts past the limit count under ``otherHosts``.
    public var hosts: [String: HostStats] = [:]
    /// Stalls of hosts past the host limit, counted under ``otherHosts``.
    public var foldedHostStalls: Int = 0
    /// Entries received twice (an uploader that died sends again what it had not yet confirmed),
    /// skipped.
    public var duplicateEntries: Int = 0
    public var units: [String: UnitStats] = [:]
    /// Histogram bounds (microseconds) the unit histograms were counted with.
    public var bucketBounds: [UInt64] = []
    /// STALL_IDs of watchdog reports, so that a later ended report of the same stall is not counted twice.
    public var watchdogStallIDs: [String] = []
    /// Entries that did not match the schema.
    public var malformedEntries: Int = 0
    /// Stalls of units past the unit limit, counted under ``otherUnits``.
    public var foldedUnitStalls: Int = 0
    /// Stalls of fingerprints past a unit's fingerprint limit, counted under ``otherFingerprint``.
    public var foldedFingerprintStalls: Int = 0
    /// When the latest counted entry was received (microseconds since the epoch).
    public var lastEntryMicroseconds: UInt64 = 0
    /// The stalls of the longest window, oldest first, for the windows and the digest.
    public var recent: [Recent] = []

    /// The unit that stalls of units past the unit limit count under.
    public static let otherUnits = "(other units)"
    /// The fingerprint that stalls past a unit's fingerprint limit count under.
    public static let otherFingerprint = "other"
    /// The machine id key that stalls of hosts past the host limit count under.
    public static let otherHosts = "(other hosts)"

    public init() {}

    /// Reads state files of earlier versions too: fields they lack take their defaults, and their
    /// per-fingerprint recent stalls (now kept in one list) are left behind.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        cursor = try container.decodeIfPresent(String.self, forKey: .cursor)
        units = try container.decodeIfPresent([String: UnitStats].self, forKey: .units) ?? [:]
        bucketBounds = try container.decodeIfPresent([UInt64].self, forKey: .bucketBounds) ?? []
        watchdogStallIDs = try container.decodeIfPresent([String].self, forKey: .watchdogStallIDs) ?? []
        malformedEntries = try container.decodeIfPresent(Int.self, forKey: .malformedEntries) ?? 0
        foldedUnitStalls = try container.decodeIfPresent(Int.self, forKey: .foldedUnitStalls) ?? 0
        foldedFingerprintStalls = try container.decodeIfPresent(Int.self, forKey: .foldedFingerprintStalls) ?? 0
        lastEntryMicroseconds = try container.decodeIfPresent(UInt64.self, forKey: .lastEntryMicroseconds) ?? 0
        recent = try container.decodeIfPresent([Recent].self, forKey: .recent) ?? []
        sources = try container.decodeIfPresent([String: Source].self, forKey: .sources) ?? [:]
        hosts = try container.decodeIfPresent([String: HostStats].self, forKey: .hosts) ?? [:]
        foldedHostStalls = try container.decodeIfPresent(Int.self, forKey: .foldedHostStalls) ?? 0
        duplicateEntries = try container.decodeIfPresent(Int.self, forKey: .duplicateEntries) ?? 0
    }

    /// Where reading stands for one source machine: the cursor of its last entry read, and where
    /// that entry stands in the machine's own order (its boot and monotonic time), so that an
    /// entry received a second time is recognized.
    public struct Source: Codable, Sendable, Hashable {
        public var cursor: String
        public var bootID: String
        public var monotonicMicroseconds: UInt64
    }

    /// One host (machine).
    public struct HostStats: Codable, Sendable, Hashable {
        /// Its latest `_HOSTNAME`.
        public var name: String = ""
        /// Its bit in ``FingerprintStats/hostBits``.
        public var index: Int = 0
        public var stalls: Int = 0
        public var lastSeenMicroseconds: UInt64 = 0
    }

    public struct UnitStats: Codable, Sendable, Hashable {
        public var stalls: Int = 0
        public var totalMicroseconds: UInt64 = 0
        /// Lifetime counts per histogram bucket (the last one is +Inf).
        public var buckets: [Int] = []
        public var suppressedReports: Int = 0
        public var watchdogStalls: Int = 0
        /// The unit's first fingerprints (they keep their own series for good), and ``otherFingerprint``.
        public var fingerprints: [String: FingerprintStats] = [:]
        /// Stalls counted under ``otherFingerprint``.
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
        /// Whether it has its own metric series: every fingerprint but ``otherFingerprint``.
        public var labeled: Bool = false
        /// The hosts it occurred on, one bit per ``HostStats/index`` (bounded by the host limit).
        public var hostBits: [UInt64] = []

        /// On how many hosts it occurred.
        public var hostCount: Int { hostBits.reduce(0) { $0 + $1.nonzeroBitCount } }

        public init() {}

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            stalls = try container.decode(Int.self, forKey: .stalls)
            totalMicroseconds = try container.decode(UInt64.self, forKey: .totalMicroseconds)
            worstMicroseconds = try container.decode(UInt64.self, forKey: .worstMicroseconds)
            lastSeenMicroseconds = try container.decode(UInt64.self, forKey: .lastSeenMicroseconds)
            frame = try container.decode(String.self, forKey: .frame)
            callout = try container.decode(String.self, forKey: .callout)
            heaviestBacktrace = try container.decode(String.self, forKey: .heaviestBacktrace)
            labeled = try container.decode(Bool.self, forKey: .labeled)
            hostBits = try container.decodeIfPresent([UInt64].self, forKey: .hostBits) ?? []
        }
    }

    /// One stall remembered for the windows.
    public struct Recent: Codable, Sendable, Hashable {
        public var unit: String
        public var fingerprint: String
        public var time: UInt64
        public var duration: UInt64
    }
}

extension UInt64 {
    /// `self + other`, or `.max` where that overflows: hostile or absurd journal values must never trap.
    func saturatingAdd(_ other: UInt64) -> UInt64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }
}

extension Int {
    /// `self + other` for a non-negative `other`, or `.max` where that overflows.
    func saturatingAdd(_ other: Int) -> Int {
        let (sum, overflow) = addingReportingOverflow(Swift.max(other, 0))
        return overflow ? .max : sum
    }
}

/// Counts stalls per unit × fingerprint over the collector's lifetime and its windows.
///
/// Ingesting one entry costs the same whatever the state holds: a few dictionary look-ups, an
/// append to ``CollectorState/recent`` and a trim of its oldest end.
public struct StallAggregator: Sendable {
    public private(set) var state: CollectorState
    private var configuration: CollectorConfiguration
    /// Index of the oldest live element of `state.recent`; the dead prefix is dropped in batches.
    private var recentStart = 0

    public init(state: CollectorState = CollectorState(), configuration: CollectorConfiguration) {
        self.state = state
        self.configuration = configuration
        foldUnlabeledFingerprints()
        apply(configuration)
    }

    /// State files of earlier versions kept every fingerprint past the per-unit limit on its own
    /// (unlabeled): they are folded into ``CollectorState/otherFingerprint``, as new ones are.
    private mutating func foldUnlabeledFingerprints() {
        for (unit, stats) in state.units {
            let unlabeled = stats.fingerprints.filter { !$0.value.labeled && $0.key != CollectorState.otherFingerprint }
            guard !unlabeled.isEmpty else { continue }
            var other = stats.fingerprints[CollectorState.otherFingerprint] ?? CollectorState.FingerprintStats()
            for fingerprint in unlabeled.values {
                other.stalls.saturatingIncrease(by: fingerprint.stalls)
                other.totalMicroseconds = other.totalMicroseconds.saturatingAdd(fingerprint.totalMicroseconds)
                other.lastSeenMicroseconds = max(other.lastSeenMicroseconds, fingerprint.lastSeenMicroseconds)
                if fingerprint.worstMicroseconds >= other.worstMicroseconds {
                    other.worstMicroseconds = fingerprint.worstMicroseconds
                    other.frame = fingerprint.frame
                    other.callout = fingerprint.callout
                    other.heaviestBacktrace = fingerprint.heaviestBacktrace
                }
            }
            for key in unlabeled.keys { state.units[unit]!.fingerprints[key] = nil }
            state.units[unit]!.fingerprints[CollectorState.otherFingerprint] = other
        }
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
        compactRecent()
        if state.recent.count > configuration.maximumTrackedStalls {
            state.recent.removeFirst(state.recent.count - configuration.maximumTrackedStalls)
        }
    }

    /// Reads `machine` from `cursor` on, where nothing was read from it yet: for a state saved
    /// when one cursor stood for every machine.
    public mutating func adopt(cursor: String, for machine: String) {
        guard state.sources[machine] == nil else { return }
        state.sources[machine] = CollectorState.Source(cursor: cursor, bootID: "", monotonicMicroseconds: 0)
    }

    /// What an entry did to the counts.
    public enum Outcome: Sendable, Equatable {
        case stall(StallObservation)
        case stallUpdated(StallObservation)
        case suppressed(unit: String, count: Int)
        case ignored
        /// An entry counted before, received again (see ``CollectorState/duplicateEntries``).
        case duplicate
        case malformed(JournalDecodingError)
    }

    /// Counts one journal entry (an ended, watchdog or suppression entry) and moves the cursor past it,
    /// whatever the entry holds: one that cannot be counted is counted as malformed.
    @discardableResult
    public mutating func ingest(_ entry: JournalEntry) -> Outcome {
        state.cursor = entry.cursor
        // One position per machine. An entry of a machine's boot at or before the last one read
        // from it was received twice: systemd-journal-upload sends again, after a restart, what
        // the receiver had not yet confirmed.
        let machine = entry.machineID ?? ""
        if let source = state.sources[machine], !entry.bootID.isEmpty, source.bootID == entry.bootID,
            entry.monotonicMicroseconds <= source.monotonicMicroseconds
        {
            state.sources[machine]!.cursor = entry.cursor
            state.duplicateEntries.saturatingIncrease(by: 1)
            return .duplicate
        }
        state.sources[machine] = CollectorState.Source(
            cursor: entry.cursor, bootID: entry.bootID, monotonicMicroseconds: entry.monotonicMicroseconds)
        state.lastEntryMicroseconds = max(state.lastEntryMicroseconds, entry.realtimeMicroseconds)
        switch entry["MESSAGE_ID"] {
        case MessageID.reportsSuppressed:
            do {
                let record = try SuppressionRecord(journalFields: entry.fields)
                let unit = admittedUnit(StallObservation.unit(of: entry.fields))
                state.units[unit]!.suppressedReports.saturatingIncrease(by: record.count)
                return .suppressed(unit: unit, count: record.count)
            } catch {
                state.malformedEntries.saturatingIncrease(by: 1)
                return .malformed(error)
            }
        case MessageID.stallEnded, MessageID.watchdogStall:
            do {
                let record = try StallRecord(journalFields: entry.fields)
                return count(StallObservation(record: record, entry: entry))
            } catch {
                state.malformedEntries.saturatingIncrease(by: 1)
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

    /// The unit an entry counts under, present in the state: its own while the unit limit allows,
    /// else ``CollectorState/otherUnits``.
    private mutating func admittedUnit(_ unit: String) -> String {
        if state.units[unit] != nil { return unit }
        let admitted = state.units.count < configuration.maximumUnits ? unit : CollectorState.otherUnits
        if admitted != unit { state.foldedUnitStalls.saturatingIncrease(by: 1) }
        if state.units[admitted] == nil { state.units[admitted] = newUnit() }
        return admitted
    }

    /// The host a stall counts under, present in the state: its own while the host limit allows,
    /// else ``CollectorState/otherHosts``; its latest name kept.
    private mutating func admittedHost(_ stall: StallObservation) -> String {
        let name = stall.host.isEmpty ? "(unknown)" : stall.host
        if state.hosts[stall.machineID] != nil {
            if state.hosts[stall.machineID]!.name != name { state.hosts[stall.machineID]!.name = name }
            return stall.machineID
        }
        let others = state.hosts[CollectorState.otherHosts] == nil ? 0 : 1
        if state.hosts.count - others < configuration.maximumHosts {
            state.hosts[stall.machineID] = CollectorState.HostStats(name: name, index: state.hosts.count)
            return stall.machineID
        }
        state.foldedHostStalls.saturatingIncrease(by: 1)
        if state.hosts[CollectorState.otherHosts] == nil {
            state.hosts[CollectorState.otherHosts] = CollectorState.HostStats(
                name: CollectorState.otherHosts, index: state.hosts.count)
        }
        return CollectorState.otherHosts
    }

    private mutating func count(_ observation: StallObservation) -> Outcome {
        var stall = observation
        stall.unit = admittedUnit(stall.unit)
        // Mutated in place (`state.units[unit]!…`): copying a unit out and back would copy its
        // fingerprint table on every entry.
        let key: String
        if state.units[stall.unit]!.fingerprints[stall.fingerprint] != nil {
            key = stall.fingerprint
        } else if state.units[stall.unit]!.labeledFingerprints < configuration.maximumFingerprintsPerUnit {
            key = stall.fingerprint
            state.units[stall.unit]!.fingerprints[key] = CollectorState.FingerprintStats(labeled: true)
        } else {
            key = CollectorState.otherFingerprint
            state.foldedFingerprintStalls.saturatingIncrease(by: 1)
        }

        // A stall that outlasted the watchdog is counted once, from whichever report comes first.
        if !stall.isWatchdog, let index = state.watchdogStallIDs.firstIndex(of: stall.stallID) {
            state.watchdogStallIDs.remove(at: index)
            state.units[stall.unit]!.fingerprints[key, default: CollectorState.FingerprintStats()].raiseWorst(
                to: stall.durationMicroseconds)
            return .stallUpdated(stall)
        }
        if stall.isWatchdog {
            state.watchdogStallIDs.append(stall.stallID)
            if state.watchdogStallIDs.count > 1000 { state.watchdogStallIDs.removeFirst() }
            state.units[stall.unit]!.watchdogStalls.saturatingIncrease(by: 1)
        }
        let host = admittedHost(stall)
        state.hosts[host]!.stalls.saturatingIncrease(by: 1)
        state.hosts[host]!.lastSeenMicroseconds = max(
            state.hosts[host]!.lastSeenMicroseconds, stall.realtimeMicroseconds)
        state.units[stall.unit]!.fingerprints[key, default: CollectorState.FingerprintStats()].markHost(
            state.hosts[host]!.index)
        let bucket = state.bucketBounds.firstIndex { stall.durationMicroseconds <= $0 } ?? state.bucketBounds.count
        state.units[stall.unit]!.stalls.saturatingIncrease(by: 1)
        state.units[stall.unit]!.totalMicroseconds = state.units[stall.unit]!.totalMicroseconds.saturatingAdd(
            stall.durationMicroseconds)
        state.units[stall.unit]!.buckets[bucket].saturatingIncrease(by: 1)
        if key == CollectorState.otherFingerprint { state.units[stall.unit]!.otherStalls.saturatingIncrease(by: 1) }
        state.units[stall.unit]!.fingerprints[key, default: CollectorState.FingerprintStats()].record(stall)
        stall.fingerprint = key
        remember(stall)
        return .stall(stall)
    }

    private mutating func remember(_ stall: StallObservation) {
        state.recent.append(
            CollectorState.Recent(
                unit: stall.unit, fingerprint: stall.fingerprint, time: stall.realtimeMicroseconds,
                duration: stall.durationMicroseconds))
        trim(now: stall.realtimeMicroseconds)
    }

    /// Forgets stalls older than the longest window, and the oldest past the tracking limit. Costs
    /// as many steps as stalls it forgets (the recent stalls are in the order they were received).
    public mutating func trim(now: UInt64) {
        let longest = configuration.windows.map { UInt64($0.microseconds) }.max() ?? 0
        let horizon = now > longest ? now - longest : 0
        while recentStart < state.recent.count,
            state.recent.count - recentStart > configuration.maximumTrackedStalls
                || state.recent[recentStart].time < horizon
        {
            recentStart += 1
        }
        // Drop the forgotten prefix once it is as long as what is kept: amortized O(1) per stall.
        if recentStart > 0, recentStart >= state.recent.count - recentStart { compactRecent() }
    }

    /// Drops the forgotten prefix of the recent stalls.
    private mutating func compactRecent() {
        guard recentStart > 0 else { return }
        state.recent.removeFirst(min(recentStart, state.recent.count))
        recentStart = 0
    }

    /// The state to save: without the forgotten stalls.
    public mutating func snapshot() -> CollectorState {
        compactRecent()
        return state
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
        struct Key: Hashable {
            var unit: String
            var fingerprint: String
        }
        let since = Self.start(of: window, now: now)
        var groups: [Key: WindowGroup] = [:]
        for stall in state.recent[recentStart...] where stall.time >= since {
            let key = Key(unit: stall.unit, fingerprint: stall.fingerprint)
            if groups[key] == nil {
                let fingerprint = state.units[stall.unit]?.fingerprints[stall.fingerprint]
                groups[key] = WindowGroup(
                    unit: stall.unit, fingerprint: stall.fingerprint, stalls: 0, totalMicroseconds: 0,
                    worstMicroseconds: 0, frame: fingerprint?.frame ?? "", callout: fingerprint?.callout ?? "")
            }
            groups[key]!.stalls += 1
            groups[key]!.totalMicroseconds = groups[key]!.totalMicroseconds.saturatingAdd(stall.duration)
            groups[key]!.worstMicroseconds = max(groups[key]!.worstMicroseconds, stall.duration)
        }
        return groups.values.sorted {
            ($0.worstMicroseconds, $0.unit, $0.fingerprint) > ($1.worstMicroseconds, $1.unit, $1.fingerprint)
        }
    }

    /// Stalls per unit received in each of `windows` before `now`, in one pass over the recent stalls.
    public func stallsPerUnit(windows: [Duration], now: UInt64) -> [[String: Int]] {
        let starts = windows.map { Self.start(of: $0, now: now) }
        var counts = Array(repeating: [String: Int](), count: windows.count)
        for stall in state.recent[recentStart...] {
            for (index, start) in starts.enumerated() where stall.time >= start {
                counts[index][stall.unit, default: 0] += 1
            }
        }
        return counts
    }

    /// When a count of ``stallsPerUnit(windows:now:)`` next changes with time alone: the moment
    /// the earliest stall counted in one of `windows` at `now` leaves it (`nil` when none is
    /// counted). A gauge rendered at `now` is stale from then on, even if no stall comes.
    public func nextWindowExpiry(windows: [Duration], now: UInt64) -> UInt64? {
        let lengths = windows.map { UInt64($0.microseconds) }
        var earliest: UInt64?
        for stall in state.recent[recentStart...] {
            for length in lengths where stall.time >= (now > length ? now - length : 0) {
                // Counted while it is at most `length` old. A time near the end of the clock (a
                // hostile journal's) never leaves: it must not overflow.
                let (leaves, overflow) = stall.time.addingReportingOverflow(length + 1)
                if !overflow, leaves < earliest ?? .max { earliest = leaves }
            }
        }
        return earliest
    }

    private static func start(of window: Duration, now: UInt64) -> UInt64 {
        let length = UInt64(window.microseconds)
        return now > length ? now - length : 0
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

extension CollectorState.UnitStats {
    /// Fingerprints with their own series (all but ``CollectorState/otherFingerprint``).
    var labeledFingerprints: Int {
        fingerprints.count - (fingerprints[CollectorState.otherFingerprint] == nil ? 0 : 1)
    }
}

extension CollectorState.FingerprintStats {
    mutating func raiseWorst(to duration: UInt64) { worstMicroseconds = max(worstMicroseconds, duration) }

    /// Sets the bit of host `index`.
    mutating func markHost(_ index: Int) {
        let word = index / 64
        if hostBits.count <= word { hostBits += Array(repeating: 0, count: word + 1 - hostBits.count) }
        hostBits[word] |= 1 << UInt64(index % 64)
    }

    init(labeled: Bool) {
        self.init()
        self.labeled = labeled
    }

    /// Counts one stall: the worst one keeps its frame and backtrace.
    mutating func record(_ stall: StallObservation) {
        stalls.saturatingIncrease(by: 1)
        totalMicroseconds = totalMicroseconds.saturatingAdd(stall.durationMicroseconds)
        lastSeenMicroseconds = max(lastSeenMicroseconds, stall.realtimeMicroseconds)
        if stall.durationMicroseconds >= worstMicroseconds || frame.isEmpty {
            worstMicroseconds = max(worstMicroseconds, stall.durationMicroseconds)
            frame = stall.frame
            callout = stall.callout
            heaviestBacktrace = stall.backtrace
        }
    }
}

extension Int {
    /// Adds a non-negative amount, stopping at `.max`.
    mutating func saturatingIncrease(by amount: Int) { self = saturatingAdd(amount) }
}
