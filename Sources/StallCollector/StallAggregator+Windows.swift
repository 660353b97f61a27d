import StallConfiguration
import StallJournal

/// What the counts say over the trailing windows: the groups of a window, the stalls per unit in
/// each, when a count next changes with time alone, and the digest.
extension StallAggregator {
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
