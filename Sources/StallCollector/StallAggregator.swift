import StallConfiguration
import StallJournal

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
    private(set) var recentStart = 0
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
}
