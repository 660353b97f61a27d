import StallConfiguration
import StallJournal

/// One stall as the collector counts it, from an ended (or watchdog) journal entry.
package struct StallObservation: Sendable, Hashable {
    /// `_SYSTEMD_UNIT`, or `SYSLOG_IDENTIFIER` for processes outside a unit.
    package var unit: String
    package var stallID: String
    package var fingerprint: String
    package var frame: String
    package var callout: String
    package var durationMicroseconds: UInt64
    /// When journald received the entry (microseconds since the epoch).
    package var realtimeMicroseconds: UInt64
    package var backtrace: String
    /// A stall that outlasted `WatchdogSec=` (systemd killed the service).
    package var isWatchdog: Bool
    /// The machine it happened on (`_MACHINE_ID`; empty where the entry has none)…
    package var machineID: String
    /// …and that machine's name (`_HOSTNAME`, cut like other identities; empty where none).
    package var host: String
    /// Who wrote it, by journald's trusted fields: `nil` for a system unit, else the writer's
    /// `_UID` (`""` where the entry has none). See ``owner(of:)``.
    package var owner: String?
    /// The request the stall served (`STALL_REQUEST_*`, `STALL_TRACE_ID`), `nil` outside any.
    package var request: StallRecord.Request?

    package init(
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

    /// The unit an entry came from: `_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`, or `(SYSLOG_IDENTIFIER)`
    /// outside any unit. Outside a system unit and written by a user other than root, the
    /// writer's `_UID` follows, `(tool) (uid 1000)`: anyone may write any identifier, so two
    /// users' entries are never one series.
    package static func unit(of fields: [String: String]) -> String {
        unit(named: name(of: fields), owner: owner(of: fields))
    }

    /// The unit an entry names, before its writer's uid: `_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`, or
    /// `(SYSLOG_IDENTIFIER)`. See ``unit(of:)``.
    package static func name(of fields: [String: String]) -> String {
        fields["_SYSTEMD_UNIT"] ?? fields["_SYSTEMD_USER_UNIT"] ?? fields["SYSLOG_IDENTIFIER"].map { "(\($0))" }
            ?? "(unknown)"
    }

    /// `name` as ``unit(of:)`` shows it for a writer (``owner(of:)``): ` (uid N)` after it, unless a
    /// system unit or root wrote it. A caller that cuts the name for its output (`stallmon follow`)
    /// cuts it before, so that the uid is always seen.
    package static func unit(named name: String, owner: String?) -> String {
        guard let owner, !owner.isEmpty, owner != "0" else { return name }
        return name + " (uid \(owner))"
    }

    /// Who wrote an entry, by the fields journald sets itself and no writer can forge: `nil` when
    /// a system unit did (`_SYSTEMD_UNIT`, outside any user's slice, session or user manager:
    /// no `_SYSTEMD_USER_UNIT` and no `_SYSTEMD_OWNER_UID`), else the writer's `_UID` (`""`
    /// where the entry has none, as in an exported journal without it).
    package static func owner(of fields: [String: String]) -> String? {
        if let unit = fields["_SYSTEMD_UNIT"], fields["_SYSTEMD_USER_UNIT"] == nil,
            fields["_SYSTEMD_OWNER_UID"] == nil, !(fields["_SYSTEMD_SLICE"]?.hasPrefix("user") ?? false),
            !(unit.hasPrefix("session-") && unit.hasSuffix(".scope")), !unit.hasPrefix("user@"),
            !unit.hasPrefix("user-runtime-dir@")
        {
            return nil
        }
        guard let uid = fields["_UID"], (1...10).contains(uid.utf8.count),
            uid.utf8.allSatisfy({ (48...57).contains($0) })
        else { return "" }
        return uid
    }

    package init(
        record: StallRecord, unit: String, realtimeMicroseconds: UInt64, machineID: String = "", host: String = ""
    ) {
        self.init(
            unit: unit, stallID: record.stallID, fingerprint: record.fingerprint, frame: record.frame,
            callout: record.callout, durationMicroseconds: record.durationMicroseconds,
            realtimeMicroseconds: realtimeMicroseconds, backtrace: record.backtrace,
            isWatchdog: record.event == .watchdog, machineID: machineID, host: host
        )
        request = record.request
    }

    /// A stall read from `entry`, with its unit, writer, time and host.
    package init(record: StallRecord, entry: JournalEntry) {
        self.init(
            record: record, unit: Self.unit(of: entry.fields), realtimeMicroseconds: entry.realtimeMicroseconds,
            machineID: entry.machineID ?? "", host: entry["_HOSTNAME"] ?? "")
        owner = Self.owner(of: entry.fields)
    }
}

/// What the collector knows, persisted as one document so that the cursor and the counts it
/// reflects always agree: a restart neither loses nor double-counts.
///
/// Everything in it is bounded, whatever the journal holds: at most ``CollectorConfiguration/maximumUnits``
/// units (later ones count under ``CollectorState/otherUnits``), at most
/// ``CollectorConfiguration/maximumFingerprintsPerUnit`` fingerprints per unit (later ones count
/// under ``CollectorState/otherFingerprint``), at most ``CollectorConfiguration/maximumEndpointsPerUnit``
/// endpoints per unit (later ones count under ``Endpoint/other``), at most ``CollectorConfiguration/maximumHosts`` hosts
/// (later ones count under ``CollectorState/otherHosts``), ``CollectorConfiguration/maximumTrackedStalls``
/// recent stalls, 1000 watchdog stall IDs, and strings as long as the journal schema allows. One
/// position per source machine (``sources``): as many as the journal files read hold.
package struct CollectorState: Codable, Sendable, Hashable {
    /// The journal cursor of the last entry counted.
    package var cursor: String?
    /// Where reading stands for each machine whose entries were read, by `_MACHINE_ID` (`""` for
    /// entries without one): one journal over several machines' files has one order across them,
    /// and a machine whose entries arrive late (an uploader that was down) sorts behind the others.
    package var sources: [String: Source] = [:]
    /// Hosts by machine id; hosts past the limit count under ``otherHosts``.
    package var hosts: [String: HostStats] = [:]
    /// Stalls of hosts past the host limit, counted under ``otherHosts``.
    package var foldedHostStalls: Int = 0
    /// Entries received twice (an uploader that died sends again what it had not yet confirmed),
    /// skipped.
    package var duplicateEntries: Int = 0
    package var units: [String: UnitStats] = [:]
    /// Histogram bounds (microseconds) the unit histograms were counted with.
    package var bucketBounds: [UInt64] = []
    /// STALL_IDs of watchdog reports, so that a later ended report of the same stall is not counted twice.
    package var watchdogStallIDs: [String] = []
    /// Entries that did not match the schema.
    package var malformedEntries: Int = 0
    /// Stalls of units past the unit limit, counted under ``otherUnits``.
    package var foldedUnitStalls: Int = 0
    /// Stalls of fingerprints past a unit's fingerprint limit, counted under ``otherFingerprint``.
    package var foldedFingerprintStalls: Int = 0
    /// Saved positions the journal refused (a cursor it cannot parse): reading resumed after the
    /// machine's last entry by its boot and monotonic time instead.
    package var rejectedCursors: Int = 0
    /// Saved positions whose entry the journal no longer holds (vacuumed): reading resumed at the
    /// first entry after it.
    package var vanishedCursors: Int = 0
    /// Series that gave way to a newer one after they stopped stalling (see ``StallAggregator``):
    /// units of users, and fingerprints.
    package var evictedSeries: Int = 0
    package var evictedFingerprints: Int = 0
    /// Endpoints that gave way to a newer one of their unit after they stopped stalling.
    package var evictedEndpoints: Int = 0
    /// Stalls counted under ``Endpoint/other`` because their unit's or their user's endpoint limit
    /// was reached.
    package var foldedEndpointStalls: Int = 0
    /// Entries a start without a saved position left unread: older than the longest window, or
    /// before the last ``CollectorConfiguration/coldStartEntries`` of their machine.
    package var skippedEntries: Int = 0
    /// Stalls of users first seen when ``CollectorConfiguration/maximumUsers`` users held series
    /// that still stall, counted under ``otherUnits``.
    package var foldedUserStalls: Int = 0
    /// Per user (`_UID`) holding series of its own: what folding took from it.
    package var users: [String: UserStats] = [:]
    /// When the latest counted entry was received (microseconds since the epoch).
    package var lastEntryMicroseconds: UInt64 = 0
    /// The stalls of the longest window, oldest first, for the windows and the digest.
    package var recent: [Recent] = []

    /// The unit that stalls of units past the unit limit count under.
    package static let otherUnits = "(other units)"
    /// The fingerprint that stalls past a unit's fingerprint limit count under.
    package static let otherFingerprint = "other"
    /// The machine id key that stalls of hosts past the host limit count under.
    package static let otherHosts = "(other hosts)"

    package init() {}

    /// Reads state files of earlier versions too: fields they lack take their defaults, and their
    /// per-fingerprint recent stalls (now kept in one list) are left behind.
    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        // Every version saved its units (an empty object when there were none): a document
        // without them (`{}`) is not a state, and is never taken for a fresh start.
        guard container.contains(.units) else {
            throw DecodingError.keyNotFound(
                CodingKeys.units,
                DecodingError.Context(codingPath: [], debugDescription: "a state always has its units"))
        }
        cursor = try container.decodeIfPresent(String.self, forKey: .cursor)
        units = try container.decode([String: UnitStats].self, forKey: .units)
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
        rejectedCursors = try container.decodeIfPresent(Int.self, forKey: .rejectedCursors) ?? 0
        vanishedCursors = try container.decodeIfPresent(Int.self, forKey: .vanishedCursors) ?? 0
        evictedSeries = try container.decodeIfPresent(Int.self, forKey: .evictedSeries) ?? 0
        evictedFingerprints = try container.decodeIfPresent(Int.self, forKey: .evictedFingerprints) ?? 0
        foldedUserStalls = try container.decodeIfPresent(Int.self, forKey: .foldedUserStalls) ?? 0
        users = try container.decodeIfPresent([String: UserStats].self, forKey: .users) ?? [:]
        evictedEndpoints = try container.decodeIfPresent(Int.self, forKey: .evictedEndpoints) ?? 0
        foldedEndpointStalls = try container.decodeIfPresent(Int.self, forKey: .foldedEndpointStalls) ?? 0
        skippedEntries = try container.decodeIfPresent(Int.self, forKey: .skippedEntries) ?? 0
    }

    /// Where reading stands for one source machine: the cursor of its last entry read, and where
    /// that entry stands in the machine's own order (its boot and monotonic time), so that an
    /// entry received a second time is recognized.
    package struct Source: Codable, Sendable, Hashable {
        package var cursor: String
        package var bootID: String
        package var monotonicMicroseconds: UInt64
    }

    /// One host (machine).
    package struct HostStats: Codable, Sendable, Hashable {
        /// Its latest `_HOSTNAME`.
        package var name: String = ""
        /// Its bit in ``FingerprintStats/hostBits``.
        package var index: Int = 0
        package var stalls: Int = 0
        package var lastSeenMicroseconds: UInt64 = 0
    }

    package struct UnitStats: Codable, Sendable, Hashable {
        /// Who writes its entries: `nil` for a system unit (and ``otherUnits``), else the `_UID`
        /// (see ``StallObservation/owner(of:)``), whose budget it counts against.
        package var owner: String?
        /// When its latest stall was received (microseconds since the epoch): the least recent
        /// of a user's series gives way first.
        package var lastSeenMicroseconds: UInt64 = 0
        package var stalls: Int = 0
        package var totalMicroseconds: UInt64 = 0
        /// Lifetime counts per histogram bucket (the last one is +Inf).
        package var buckets: [Int] = []
        package var suppressedReports: Int = 0
        package var watchdogStalls: Int = 0
        /// The unit's first fingerprints (they keep their own series for good), and ``otherFingerprint``.
        package var fingerprints: [String: FingerprintStats] = [:]
        /// Stalls counted under ``otherFingerprint``.
        package var otherStalls: Int = 0
        /// Its stalls in a request, by ``Endpoint/label(of:)``: the unit's first endpoints, and
        /// ``Endpoint/other`` for the rest. Stalls outside any request count in none.
        package var endpoints: [String: EndpointStats] = [:]

        package init(owner: String? = nil) { self.owner = owner }

        package init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            owner = try container.decodeIfPresent(String.self, forKey: .owner)
            lastSeenMicroseconds = try container.decodeIfPresent(UInt64.self, forKey: .lastSeenMicroseconds) ?? 0
            stalls = try container.decode(Int.self, forKey: .stalls)
            totalMicroseconds = try container.decode(UInt64.self, forKey: .totalMicroseconds)
            buckets = try container.decode([Int].self, forKey: .buckets)
            suppressedReports = try container.decode(Int.self, forKey: .suppressedReports)
            watchdogStalls = try container.decode(Int.self, forKey: .watchdogStalls)
            fingerprints = try container.decode([String: FingerprintStats].self, forKey: .fingerprints)
            otherStalls = try container.decode(Int.self, forKey: .otherStalls)
            endpoints = try container.decodeIfPresent([String: EndpointStats].self, forKey: .endpoints) ?? [:]
        }
    }

    /// What folding took from one user (a `_UID` whose entries come from outside system units).
    package struct UserStats: Codable, Sendable, Hashable {
        /// Its stalls counted under ``otherUnits`` because its series budget was full of series
        /// that still stall.
        package var foldedStalls: Int = 0
        /// Its series that gave way to newer ones of its own after they stopped stalling.
        package var evictedSeries: Int = 0
    }

    package struct FingerprintStats: Codable, Sendable, Hashable {
        package var stalls: Int = 0
        package var totalMicroseconds: UInt64 = 0
        package var worstMicroseconds: UInt64 = 0
        package var lastSeenMicroseconds: UInt64 = 0
        package var frame: String = ""
        package var callout: String = ""
        /// The backtrace of the longest stall.
        package var heaviestBacktrace: String = ""
        /// Whether it has its own metric series: every fingerprint but ``otherFingerprint``.
        package var labeled: Bool = false
        /// The hosts it occurred on, one bit per ``HostStats/index`` (bounded by the host limit).
        package var hostBits: [UInt64] = []

        /// On how many hosts it occurred.
        package var hostCount: Int { hostBits.reduce(0) { $0 + $1.nonzeroBitCount } }

        package init() {}

        package init(from decoder: any Decoder) throws {
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

    /// The stalls of one endpoint of a unit (see ``Endpoint``).
    package struct EndpointStats: Codable, Sendable, Hashable {
        package var stalls: Int = 0
        package var totalMicroseconds: UInt64 = 0
        /// When its latest stall was received: the least recent endpoint gives way first.
        package var lastSeenMicroseconds: UInt64 = 0

        package init() {}

        mutating func record(_ stall: StallObservation) {
            stalls.saturatingIncrease(by: 1)
            totalMicroseconds = totalMicroseconds.saturatingAdd(stall.durationMicroseconds)
            lastSeenMicroseconds = max(lastSeenMicroseconds, stall.realtimeMicroseconds)
        }

        mutating func merge(_ other: Self) {
            stalls.saturatingIncrease(by: other.stalls)
            totalMicroseconds = totalMicroseconds.saturatingAdd(other.totalMicroseconds)
            lastSeenMicroseconds = max(lastSeenMicroseconds, other.lastSeenMicroseconds)
        }
    }

    /// One stall remembered for the windows.
    package struct Recent: Codable, Sendable, Hashable {
        package var unit: String
        package var fingerprint: String
        package var time: UInt64
        package var duration: UInt64
    }
}

extension CollectorState {
    /// What makes this state impossible, or `nil` when nothing does: a count below zero, a part
    /// counted more often than its whole, a histogram or host table that does not fit. A state
    /// that saved counts cannot hold such values; a damaged file can, and is never exported as is.
    package var damage: String? {
        func negative(_ pairs: KeyValuePairs<String, Int>, in place: String) -> String? {
            for (name, value) in pairs where value < 0 { return "\(place)\(name) is \(value), below zero" }
            return nil
        }
        if let problem = negative(
            [
                "malformedEntries": malformedEntries, "foldedUnitStalls": foldedUnitStalls,
                "foldedFingerprintStalls": foldedFingerprintStalls, "foldedHostStalls": foldedHostStalls,
                "duplicateEntries": duplicateEntries, "rejectedCursors": rejectedCursors,
                "vanishedCursors": vanishedCursors, "evictedSeries": evictedSeries,
                "evictedFingerprints": evictedFingerprints, "foldedUserStalls": foldedUserStalls,
                "evictedEndpoints": evictedEndpoints, "foldedEndpointStalls": foldedEndpointStalls,
                "skippedEntries": skippedEntries,
            ], in: "")
        {
            return problem
        }
        for (unit, stats) in units {
            let place = "units[\(DisplayText.escaped(unit))]."
            if let problem = negative(
                [
                    "stalls": stats.stalls, "suppressedReports": stats.suppressedReports,
                    "watchdogStalls": stats.watchdogStalls, "otherStalls": stats.otherStalls,
                ], in: place)
            {
                return problem
            }
            if stats.watchdogStalls > stats.stalls || stats.otherStalls > stats.stalls {
                return
                    "\(place)stalls is \(stats.stalls), fewer than its watchdog (\(stats.watchdogStalls)) or other (\(stats.otherStalls)) stalls"
            }
            if !stats.buckets.isEmpty, stats.buckets.count != bucketBounds.count + 1 {
                return "\(place)buckets has \(stats.buckets.count) counts for \(bucketBounds.count) bounds"
            }
            if let bucket = stats.buckets.first(where: { $0 < 0 }) {
                return "\(place)buckets holds \(bucket), below zero"
            }
            for (fingerprint, counts) in stats.fingerprints {
                if counts.stalls < 0 || counts.stalls > stats.stalls {
                    return
                        "\(place)fingerprints[\(DisplayText.escaped(fingerprint))].stalls is \(counts.stalls), outside 0...\(stats.stalls)"
                }
            }
            if let problem = stats.endpointDamage { return place + problem }
        }
        for (user, stats) in users where stats.foldedStalls < 0 || stats.evictedSeries < 0 {
            return
                "users[\(DisplayText.escaped(user))] has \(stats.foldedStalls) folded stalls and \(stats.evictedSeries) evicted series"
        }
        for (machine, host) in hosts where host.stalls < 0 || host.index < 0 || host.index >= hosts.count {
            return
                "hosts[\(DisplayText.escaped(machine))] has stalls \(host.stalls) and index \(host.index) of \(hosts.count)"
        }
        return nil
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

/// Counts stalls per unit × fingerprint over the collector's lifetime and its windows, and the
/// stalls in requests per unit × endpoint (see ``Endpoint``).
///
/// Whom it trusts: journald's trusted fields (`_UID`, `_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`, …),
/// which no writer can forge. A system unit's stalls always have a series of their own: root
/// made the unit, and only root makes more of them. Every other writer (a user's session, a user
/// unit, a program started by hand) is a user, by `_UID`, with a budget of its own:
/// ``CollectorConfiguration/maximumUnits`` series. A user's new series past its budget takes the
/// place of the user's least recently stalled series once that one has not stalled for the
/// longest window, and is otherwise counted under ``CollectorState/otherUnits``: folding takes
/// only the entries of the user who makes the series. Fingerprints and endpoints give way the
/// same way within their unit. Everything is decided by the entries' receive times, so a restart, or a state
/// rebuilt from the journal's head, comes to the same series.
///
/// Ingesting one entry costs the same whatever the state holds: a few dictionary look-ups, an
/// append to ``CollectorState/recent`` and a trim of its oldest end; when a series must give way,
/// a pass over the series of that one user (at most its budget).
package struct StallAggregator: Sendable {
    package private(set) var state: CollectorState
    private var configuration: CollectorConfiguration
    /// Index of the oldest live element of `state.recent`; the dead prefix is dropped in batches.
    private var recentStart = 0
    /// The series of each user, by `_UID` (rebuilt from the state).
    private var seriesByOwner: [String: Set<String>] = [:]
    /// How many endpoints with series of their own each user's units hold together (rebuilt
    /// from the state).
    private var endpointsByOwner: [String: Int] = [:]
    /// The units whose counts changed since each reader of the state last took them
    /// (``takeChangedUnits(for:)``): `nil` for every unit.
    private var changedUnits: [Set<String>?] = [nil, nil]
    /// What folding did since ``takeFoldNotes()``, for the log; at most ``maximumFoldNotes`` kinds.
    private var foldNotes: [FoldNote: Int] = [:]
    static let maximumFoldNotes = 64

    package init(state: CollectorState = CollectorState(), configuration: CollectorConfiguration) {
        self.state = state
        self.configuration = configuration
        for (unit, stats) in state.units {
            guard let owner = stats.owner else { continue }
            seriesByOwner[owner, default: []].insert(unit)
            endpointsByOwner[owner, default: 0] += stats.labeledEndpoints
        }
        foldUnlabeledFingerprints()
        apply(configuration)
    }

    /// One kind of folding: a user's stalls counted under ``CollectorState/otherUnits`` or a
    /// fingerprint under ``CollectorState/otherFingerprint``, or a series that gave way.
    package struct FoldNote: Sendable, Hashable, CustomStringConvertible {
        /// `unit`, `user` or `fingerprint`.
        package var what: String
        /// The user (`_UID`) whose series it was; `nil` for a system unit.
        package var owner: String?
        /// The series folded, or the one that gave way.
        package var series: String
        package var reason: String

        package var description: String {
            "\(what) \(DisplayText.escaped(series))\(owner.map { " of uid \($0.isEmpty ? "(none)" : $0)" } ?? ""): \(reason)"
        }
    }

    /// Who reads what changed: the metrics and the saved state each render or encode again only
    /// the units that changed since their last turn.
    package enum ChangeReader: Int, Sendable {
        case metrics = 0
        case state = 1
    }

    /// The units whose counts changed (came, went or counted) since the last call for `reader`;
    /// `nil` for every unit (the first call, or after a change that touches every unit).
    package mutating func takeChangedUnits(for reader: ChangeReader) -> Set<String>? {
        defer { changedUnits[reader.rawValue] = [] }
        return changedUnits[reader.rawValue]
    }

    private mutating func markChanged(_ unit: String) {
        for index in changedUnits.indices { changedUnits[index]?.insert(unit) }
    }

    /// What folding did since the last call, with how often, for the log.
    package mutating func takeFoldNotes() -> [(note: FoldNote, count: Int)] {
        defer { foldNotes = [:] }
        return foldNotes.map { ($0.key, $0.value) }.sorted { $0.count > $1.count }
    }

    private mutating func note(_ what: String, owner: String?, series: String, reason: String) {
        let key = FoldNote(what: what, owner: owner, series: series, reason: reason)
        if foldNotes[key] != nil || foldNotes.count < Self.maximumFoldNotes { foldNotes[key, default: 0] += 1 }
    }

    /// How long a series must not have stalled before it gives way: the longest window.
    private var idleAge: UInt64 { UInt64(configuration.windows.max()?.microseconds ?? 86_400_000_000) }

    private func idle(_ lastSeen: UInt64, at time: UInt64) -> Bool { time >= lastSeen && time - lastSeen >= idleAge }

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
    package mutating func apply(_ configuration: CollectorConfiguration) {
        self.configuration = configuration
        let bounds = configuration.histogramBuckets.map {
            UInt64($0.microseconds)
        }
        if state.bucketBounds != bounds {
            changedUnits = [nil, nil]
            state.bucketBounds = bounds
            for unit in state.units.keys { state.units[unit]?.buckets = Array(repeating: 0, count: bounds.count + 1) }
        }
        compactRecent()
        if state.recent.count > configuration.maximumTrackedStalls {
            state.recent.removeFirst(state.recent.count - configuration.maximumTrackedStalls)
        }
    }

    /// Counts a saved position of `machine` the journal refused (`rejected`: its cursor is
    /// dropped, and the machine is read after its boot and monotonic time until an entry of it is
    /// read) or whose entry it no longer holds.
    package mutating func noteCursorRecovery(rejected: Bool, machine: String) {
        if rejected {
            state.rejectedCursors.saturatingIncrease(by: 1)
            state.sources[machine]?.cursor = ""
        } else {
            state.vanishedCursors.saturatingIncrease(by: 1)
        }
    }

    /// Reads `machine` from `cursor` on, where nothing was read from it yet: for a state saved
    /// when one cursor stood for every machine.
    package mutating func adopt(cursor: String, for machine: String) {
        guard state.sources[machine] == nil else { return }
        state.sources[machine] = CollectorState.Source(cursor: cursor, bootID: "", monotonicMicroseconds: 0)
    }

    /// Reads `machine` after `entry`, which is left unread with every entry before it: a start
    /// without a saved position (see ``CollectorConfiguration/coldStartEntries``).
    package mutating func start(after entry: JournalEntry, machine: String) {
        guard state.sources[machine] == nil else { return }
        state.sources[machine] = CollectorState.Source(
            cursor: entry.cursor, bootID: entry.bootID, monotonicMicroseconds: entry.monotonicMicroseconds)
    }

    /// Counts entries left unread by a start without a saved position.
    package mutating func noteSkipped(_ count: Int) { state.skippedEntries.saturatingIncrease(by: count) }

    /// What an entry did to the counts.
    package enum Outcome: Sendable, Equatable {
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
    package mutating func ingest(_ entry: JournalEntry) -> Outcome {
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
                let unit = admittedUnit(
                    StallObservation.unit(of: entry.fields), owner: StallObservation.owner(of: entry.fields),
                    time: entry.realtimeMicroseconds, counted: false)
                state.units[unit]!.suppressedReports.saturatingIncrease(by: record.count)
                markChanged(unit)
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

    private func newUnit(owner: String?) -> CollectorState.UnitStats {
        var stats = CollectorState.UnitStats(owner: owner)
        stats.buckets = Array(repeating: 0, count: state.bucketBounds.count + 1)
        return stats
    }

    /// The unit an entry counts under, present in the state. A system unit's own, always. A
    /// user's own while its budget allows, or in place of its least recent series that stopped
    /// stalling; else ``CollectorState/otherUnits``. `counted`: the entry is a stall (a
    /// suppression entry folded is not one).
    private mutating func admittedUnit(_ unit: String, owner: String?, time: UInt64, counted: Bool = true) -> String {
        if state.units[unit] != nil { return unit }
        guard let owner, unit != CollectorState.otherUnits else {
            state.units[unit] = newUnit(owner: nil)
            return unit
        }
        if seriesByOwner[owner] == nil, seriesByOwner.count >= configuration.maximumUsers, !makeRoomForUser(at: time) {
            if counted { state.foldedUserStalls.saturatingIncrease(by: 1) }
            note(
                "user", owner: owner, series: unit,
                reason: "\(configuration.maximumUsers) users (max_users) hold series that stalled within \(idleAgeText)"
            )
            return otherUnits()
        }
        if seriesByOwner[owner, default: []].count >= configuration.maximumUnits {
            guard let lru = seriesByOwner[owner]!.min(by: { leastRecent($0, $1) }),
                idle(state.units[lru]!.lastSeenMicroseconds, at: time)
            else {
                if counted {
                    state.foldedUnitStalls.saturatingIncrease(by: 1)
                    state.users[owner, default: CollectorState.UserStats()].foldedStalls.saturatingIncrease(by: 1)
                }
                note(
                    "unit", owner: owner, series: unit,
                    reason:
                        "the user's \(configuration.maximumUnits) series (max_units) all stalled within \(idleAgeText)")
                return otherUnits()
            }
            evict(lru, owner: owner)
            note(
                "unit", owner: owner, series: lru, reason: "gave way to a newer series: no stall within \(idleAgeText)")
        }
        state.units[unit] = newUnit(owner: owner)
        seriesByOwner[owner, default: []].insert(unit)
        if state.users[owner] == nil { state.users[owner] = CollectorState.UserStats() }
        return unit
    }

    private var idleAgeText: String { Self.describe(.microseconds(Int64(idleAge))) }

    /// Orders series by their latest stall, then by name (so that replays decide alike).
    private func leastRecent(_ a: String, _ b: String) -> Bool {
        let (first, second) = (state.units[a]!.lastSeenMicroseconds, state.units[b]!.lastSeenMicroseconds)
        return first != second ? first < second : a < b
    }

    private mutating func otherUnits() -> String {
        if state.units[CollectorState.otherUnits] == nil {
            state.units[CollectorState.otherUnits] = newUnit(owner: nil)
        }
        return CollectorState.otherUnits
    }

    /// A user past ``CollectorConfiguration/maximumUsers``: the user whose latest stall is the
    /// oldest gives way, all its series, when that stall is older than the longest window.
    private mutating func makeRoomForUser(at time: UInt64) -> Bool {
        var oldest: (owner: String, lastSeen: UInt64)?
        for (owner, units) in seriesByOwner {
            let lastSeen = units.reduce(0) { max($0, state.units[$1]!.lastSeenMicroseconds) }
            if oldest == nil || (lastSeen, owner) < (oldest!.lastSeen, oldest!.owner) { oldest = (owner, lastSeen) }
        }
        guard let oldest, idle(oldest.lastSeen, at: time) else { return false }
        for unit in seriesByOwner[oldest.owner]!.sorted() { evict(unit, owner: oldest.owner) }
        seriesByOwner[oldest.owner] = nil
        endpointsByOwner[oldest.owner] = nil
        state.users[oldest.owner] = nil
        note(
            "user", owner: oldest.owner, series: "(all its series)",
            reason: "gave way to a newer user: no stall within \(idleAgeText)")
        return true
    }

    /// Moves a user's series into ``CollectorState/otherUnits``: its counts stay counted there.
    private mutating func evict(_ unit: String, owner: String) {
        guard let stats = state.units.removeValue(forKey: unit) else { return }
        seriesByOwner[owner]?.remove(unit)
        endpointsByOwner[owner, default: 0] -= stats.labeledEndpoints
        markChanged(unit)
        state.evictedSeries.saturatingIncrease(by: 1)
        state.users[owner]?.evictedSeries.saturatingIncrease(by: 1)
        let other = otherUnits()
        state.units[other]!.merge(stats)
        markChanged(other)
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

    /// The fingerprint a stall counts under within its unit: its own while the unit's limit
    /// allows, or in place of the unit's least recent fingerprint that stopped stalling; else
    /// ``CollectorState/otherFingerprint``.
    private mutating func admittedFingerprint(_ stall: StallObservation) -> String {
        // Mutated in place (`state.units[unit]!…`): copying a unit out and back would copy its
        // fingerprint table on every entry.
        let unit = stall.unit
        if state.units[unit]!.fingerprints[stall.fingerprint] != nil { return stall.fingerprint }
        if state.units[unit]!.labeledFingerprints >= configuration.maximumFingerprintsPerUnit {
            let lru = state.units[unit]!.fingerprints.filter { $0.value.labeled }
                .min { ($0.value.lastSeenMicroseconds, $0.key) < ($1.value.lastSeenMicroseconds, $1.key) }
            guard let lru, idle(lru.value.lastSeenMicroseconds, at: stall.realtimeMicroseconds) else {
                state.foldedFingerprintStalls.saturatingIncrease(by: 1)
                note(
                    "fingerprint", owner: state.units[unit]!.owner, series: unit,
                    reason:
                        "its \(configuration.maximumFingerprintsPerUnit) fingerprints (max_fingerprints_per_unit) all stalled within \(idleAgeText)"
                )
                return CollectorState.otherFingerprint
            }
            state.units[unit]!.fingerprints[lru.key] = nil
            var folded = lru.value
            folded.labeled = false
            state.units[unit]!.fingerprints[CollectorState.otherFingerprint, default: CollectorState.FingerprintStats()]
                .merge(folded)
            state.units[unit]!.otherStalls.saturatingIncrease(by: folded.stalls)
            state.evictedFingerprints.saturatingIncrease(by: 1)
            note(
                "fingerprint", owner: state.units[unit]!.owner, series: "\(unit) \(lru.key)",
                reason: "gave way to a newer fingerprint: no stall within \(idleAgeText)")
        }
        state.units[unit]!.fingerprints[stall.fingerprint] = CollectorState.FingerprintStats(labeled: true)
        return stall.fingerprint
    }

    /// The endpoint a stall in a request counts under within its unit, as fingerprints do: its own
    /// while the unit's `max_endpoints_per_unit` (and, for a user's unit, the user's
    /// `max_endpoints_per_user` over all its units) allows, or in place of the least recent
    /// endpoint that stopped stalling (the unit's, else the user's); else ``Endpoint/other``. A
    /// writer's endpoints are only ever in its own units (or `(other units)`), so no flood of
    /// routes reaches a system unit's, and the users' endpoint series on the host are at most
    /// `max_users` × `max_endpoints_per_user`.
    private mutating func admittedEndpoint(_ endpoint: String, of stall: StallObservation) -> String {
        let unit = stall.unit
        if state.units[unit]!.endpoints[endpoint] != nil { return endpoint }
        let owner = state.units[unit]!.owner
        let time = stall.realtimeMicroseconds
        if state.units[unit]!.labeledEndpoints >= configuration.maximumEndpointsPerUnit {
            let lru = state.units[unit]!.endpoints.filter { $0.key != Endpoint.other }
                .min { ($0.value.lastSeenMicroseconds, $0.key) < ($1.value.lastSeenMicroseconds, $1.key) }
            guard let lru, idle(lru.value.lastSeenMicroseconds, at: time) else {
                return foldedEndpoint(
                    owner: owner, series: unit,
                    reason:
                        "its \(configuration.maximumEndpointsPerUnit) endpoints (max_endpoints_per_unit) all stalled within \(idleAgeText)"
                )
            }
            evictEndpoint(lru.key, of: unit)
        } else if let owner, endpointsByOwner[owner, default: 0] >= configuration.maximumEndpointsPerUser {
            // The user's least recent endpoint, in any of its units: at most its budget to look at.
            var lru: (unit: String, endpoint: String, lastSeen: UInt64)?
            for candidate in seriesByOwner[owner] ?? [] {
                for (name, stats) in state.units[candidate]?.endpoints ?? [:] where name != Endpoint.other {
                    if lru == nil
                        || (stats.lastSeenMicroseconds, candidate, name) < (lru!.lastSeen, lru!.unit, lru!.endpoint)
                    {
                        lru = (candidate, name, stats.lastSeenMicroseconds)
                    }
                }
            }
            guard let lru, idle(lru.lastSeen, at: time) else {
                return foldedEndpoint(
                    owner: owner, series: unit,
                    reason:
                        "the user's \(configuration.maximumEndpointsPerUser) endpoints (max_endpoints_per_user) all stalled within \(idleAgeText)"
                )
            }
            evictEndpoint(lru.endpoint, of: lru.unit)
        }
        state.units[unit]!.endpoints[endpoint] = CollectorState.EndpointStats()
        if let owner { endpointsByOwner[owner, default: 0] += 1 }
        return endpoint
    }

    /// Counts a stall under ``Endpoint/other`` of its unit, and says why.
    private mutating func foldedEndpoint(owner: String?, series: String, reason: String) -> String {
        state.foldedEndpointStalls.saturatingIncrease(by: 1)
        note("endpoint", owner: owner, series: series, reason: reason)
        return Endpoint.other
    }

    /// Moves an endpoint's counts into ``Endpoint/other`` of its unit: it gave way to a newer one.
    private mutating func evictEndpoint(_ endpoint: String, of unit: String) {
        guard let stats = state.units[unit]?.endpoints.removeValue(forKey: endpoint) else { return }
        state.units[unit]!.endpoints[Endpoint.other, default: CollectorState.EndpointStats()].merge(stats)
        state.evictedEndpoints.saturatingIncrease(by: 1)
        markChanged(unit)
        let owner = state.units[unit]!.owner
        if let owner { endpointsByOwner[owner, default: 1] -= 1 }
        note(
            "endpoint", owner: owner, series: "\(unit) \(endpoint)",
            reason: "gave way to a newer endpoint: no stall within \(idleAgeText)")
    }

    private mutating func count(_ observation: StallObservation) -> Outcome {
        var stall = observation
        stall.unit = admittedUnit(stall.unit, owner: stall.owner, time: stall.realtimeMicroseconds)
        markChanged(stall.unit)
        state.units[stall.unit]!.lastSeenMicroseconds = max(
            state.units[stall.unit]!.lastSeenMicroseconds, stall.realtimeMicroseconds)
        let key = admittedFingerprint(stall)

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
        if let endpoint = Endpoint.label(of: stall.request) {
            let admitted = admittedEndpoint(endpoint, of: stall)
            state.units[stall.unit]!.endpoints[admitted, default: CollectorState.EndpointStats()].record(stall)
        }
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
    package mutating func trim(now: UInt64) {
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
    package mutating func snapshot() -> CollectorState {
        compactRecent()
        return state
    }

    /// One unit × fingerprint over a window.
    package struct WindowGroup: Sendable, Hashable {
        package var unit: String
        package var fingerprint: String
        package var stalls: Int
        package var totalMicroseconds: UInt64
        package var worstMicroseconds: UInt64
        package var frame: String
        package var callout: String
    }

    /// The groups with stalls received in the last `window` before `now` (epoch microseconds), worst first.
    package func groups(window: Duration, now: UInt64) -> [WindowGroup] {
        struct Key: Hashable {
            var unit: String
            var fingerprint: String
        }
        let since = Self.start(of: window, now: now)
        var groups: [Key: WindowGroup] = [:]
        for stall in state.recent[recentStart...] where stall.time >= since {
            let (unit, fingerprintKey) = series(of: stall)
            let key = Key(unit: unit, fingerprint: fingerprintKey)
            if groups[key] == nil {
                let fingerprint = state.units[unit]?.fingerprints[fingerprintKey]
                groups[key] = WindowGroup(
                    unit: unit, fingerprint: fingerprintKey, stalls: 0, totalMicroseconds: 0,
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

    /// The series a recent stall counts under now: its own, or, where its unit or fingerprint
    /// gave way since, the ones they were folded into.
    private func series(of stall: CollectorState.Recent) -> (unit: String, fingerprint: String) {
        guard let unit = state.units[stall.unit] else {
            return (CollectorState.otherUnits, CollectorState.otherFingerprint)
        }
        return (
            stall.unit,
            unit.fingerprints[stall.fingerprint] != nil ? stall.fingerprint : CollectorState.otherFingerprint
        )
    }

    /// Stalls per unit received in each of `windows` before `now`, in one pass over the recent stalls.
    package func stallsPerUnit(windows: [Duration], now: UInt64) -> [[String: Int]] {
        let starts = windows.map { Self.start(of: $0, now: now) }
        var counts = Array(repeating: [String: Int](), count: windows.count)
        for stall in state.recent[recentStart...] {
            let unit = state.units[stall.unit] != nil ? stall.unit : CollectorState.otherUnits
            for (index, start) in starts.enumerated() where stall.time >= start {
                counts[index][unit, default: 0] += 1
            }
        }
        return counts
    }

    /// When a count of ``stallsPerUnit(windows:now:)`` next changes with time alone: the moment
    /// the earliest stall counted in one of `windows` at `now` leaves it (`nil` when none is
    /// counted). A gauge rendered at `now` is stale from then on, even if no stall comes.
    package func nextWindowExpiry(windows: [Duration], now: UInt64) -> UInt64? {
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
    package func digest(window: Duration, now: UInt64) -> DigestRecord {
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
    /// Endpoints with their own series (all but ``Endpoint/other``).
    var labeledEndpoints: Int { endpoints.count - (endpoints[Endpoint.other] == nil ? 0 : 1) }

    /// What makes its endpoint counts impossible, or `nil`: a name no entry can give, a count
    /// below zero, or more stalls in requests than the unit has.
    var endpointDamage: String? {
        var total = 0
        for (endpoint, counts) in endpoints {
            let place = "endpoints[\(DisplayText.escaped(FieldLimits.clamp(endpoint, toBytes: 80)))]"
            if endpoint.isEmpty || endpoint.utf8.count > Endpoint.maximumBytes {
                return "\(place) is not an endpoint: \(endpoint.utf8.count) bytes, not 1 to \(Endpoint.maximumBytes)"
            }
            if counts.stalls < 0 || counts.stalls > stalls {
                return "\(place).stalls is \(counts.stalls), outside 0...\(stalls)"
            }
            total = total.saturatingAdd(counts.stalls)
        }
        if total > stalls { return "stalls is \(stalls), fewer than its endpoints' \(total)" }
        return nil
    }

    /// Fingerprints with their own series (all but ``CollectorState/otherFingerprint``).
    var labeledFingerprints: Int {
        fingerprints.count - (fingerprints[CollectorState.otherFingerprint] == nil ? 0 : 1)
    }

    /// Takes the counts of a series that gave way: all of them count under ``CollectorState/otherFingerprint``.
    mutating func merge(_ other: Self) {
        stalls.saturatingIncrease(by: other.stalls)
        totalMicroseconds = totalMicroseconds.saturatingAdd(other.totalMicroseconds)
        if buckets.count == other.buckets.count {
            for index in buckets.indices { buckets[index].saturatingIncrease(by: other.buckets[index]) }
        }
        suppressedReports.saturatingIncrease(by: other.suppressedReports)
        watchdogStalls.saturatingIncrease(by: other.watchdogStalls)
        lastSeenMicroseconds = max(lastSeenMicroseconds, other.lastSeenMicroseconds)
        var folded = CollectorState.FingerprintStats()
        for fingerprint in other.fingerprints.values { folded.merge(fingerprint) }
        if other.stalls > 0 || !other.fingerprints.isEmpty {
            fingerprints[CollectorState.otherFingerprint, default: CollectorState.FingerprintStats()].merge(folded)
            otherStalls.saturatingIncrease(by: other.stalls)
        }
        if !other.endpoints.isEmpty {
            var endpoint = CollectorState.EndpointStats()
            for stats in other.endpoints.values { endpoint.merge(stats) }
            endpoints[Endpoint.other, default: CollectorState.EndpointStats()].merge(endpoint)
        }
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

    /// Takes the counts of a fingerprint folded into this one (the worst stall keeps its frame).
    mutating func merge(_ other: Self) {
        stalls.saturatingIncrease(by: other.stalls)
        totalMicroseconds = totalMicroseconds.saturatingAdd(other.totalMicroseconds)
        lastSeenMicroseconds = max(lastSeenMicroseconds, other.lastSeenMicroseconds)
        if other.worstMicroseconds >= worstMicroseconds, !other.frame.isEmpty || frame.isEmpty {
            worstMicroseconds = other.worstMicroseconds
            frame = other.frame
            callout = other.callout
            heaviestBacktrace = other.heaviestBacktrace
        }
        for (index, word) in other.hostBits.enumerated() {
            if hostBits.count <= index { hostBits.append(0) }
            hostBits[index] |= word
        }
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
