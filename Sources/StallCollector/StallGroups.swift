import StallJournal

/// Stalls grouped by unit × fingerprint (or unit × endpoint), as `stallmon report` shows them.
package struct StallGroup: Sendable, Hashable, Codable {
    package var unit: String
    package var fingerprint: String
    package var count: Int
    package var p50Microseconds: UInt64
    package var maxMicroseconds: UInt64
    /// The callout kind seen most often.
    package var callout: String
    /// The frame of the longest stall.
    package var heaviestFrame: String
    /// How many of them outlasted the service watchdog.
    package var watchdogKills: Int
    /// On how many hosts (distinct `_MACHINE_ID`s) it stalled.
    package var hosts: Int
    /// The request the longest stall served (``StallJournal/StallRecord/Request/endpoint``), and
    /// its W3C trace ID: `nil` when it served none (or its trace is unknown).
    package var endpoint: String?
    package var traceID: String?
    /// How many of them stallmond saw from outside (``StallObservation/seenFromOutside``): `nil`
    /// when none, so that a group of linked monitors' stalls reads as it always did.
    package var seenFromOutside: Int?

    /// What ``group(_:by:)`` puts in one group besides the unit.
    package enum Grouping: String, Sendable, CaseIterable {
        /// The same stall in code: `STALL_FINGERPRINT`.
        case fingerprint
        /// The same request: ``StallJournal/StallRecord/Request/endpoint``; stalls outside any
        /// request are one group.
        case route
    }

    /// Groups stalls; a stall with both a watchdog and an ended report counts once, at its longer duration.
    package static func group(_ stalls: [StallObservation]) -> [StallGroup] { group(stalls, by: .fingerprint) }

    /// Groups stalls by unit and `grouping`; a stall with both a watchdog and an ended report
    /// counts once, at its longer duration.
    package static func group(_ stalls: [StallObservation], by grouping: Grouping) -> [StallGroup] {
        var unique: [String: StallObservation] = [:]
        var order: [String] = []
        for stall in stalls {
            if let existing = unique[stall.stallID] {
                var merged = existing.durationMicroseconds >= stall.durationMicroseconds ? existing : stall
                merged.isWatchdog = existing.isWatchdog || stall.isWatchdog
                unique[stall.stallID] = merged
            } else {
                unique[stall.stallID] = stall
                order.append(stall.stallID)
            }
        }
        var byKey: [String: [StallObservation]] = [:]
        var keys: [String] = []
        for id in order {
            let stall = unique[id]!
            let second = grouping == .fingerprint ? stall.fingerprint : stall.request.map(\.endpoint) ?? ""
            let key = stall.unit + "\u{0}" + second
            if byKey[key] == nil { keys.append(key) }
            byKey[key, default: []].append(stall)
        }
        return keys.map { key in
            let members = byKey[key]!
            let durations = members.map(\.durationMicroseconds).sorted()
            let worst = members.max { $0.durationMicroseconds < $1.durationMicroseconds }!
            var callouts: [String: Int] = [:]
            for member in members { callouts[member.callout, default: 0] += 1 }
            let endpoint = worst.request.map(\.endpoint) ?? ""
            let traceID = worst.request.map(\.traceID) ?? ""
            return StallGroup(
                unit: worst.unit, fingerprint: worst.fingerprint, count: members.count,
                p50Microseconds: durations[(durations.count - 1) / 2], maxMicroseconds: durations.last!,
                callout: callouts.max { ($0.value, $1.key) < ($1.value, $0.key) }!.key, heaviestFrame: worst.frame,
                watchdogKills: members.filter(\.isWatchdog).count, hosts: Set(members.map(\.machineID)).count,
                endpoint: endpoint.isEmpty ? nil : endpoint, traceID: traceID.isEmpty ? nil : traceID,
                seenFromOutside: members.contains(where: \.seenFromOutside)
                    ? members.filter(\.seenFromOutside).count : nil)
        }.sorted { ($0.count, $0.maxMicroseconds, $1.unit) > ($1.count, $1.maxMicroseconds, $0.unit) }
    }
}
