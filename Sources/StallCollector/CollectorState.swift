import StallConfiguration
import StallJournal

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
