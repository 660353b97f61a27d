import Foundation
import StallJournal

/// The collector's metrics in Prometheus' text format, for node_exporter's textfile collector.
package enum PrometheusTextfile {
    /// Renders every metric. Counters only ever grow: a fingerprint keeps its own series once it
    /// has one, and fingerprints past the per-unit limit count under `fingerprint="other"`.
    package static func render(_ state: CollectorState, windows: [Duration], now: UInt64, aggregator: StallAggregator)
        -> String
    {
        Renderer().render(state, changed: nil, windows: windows, now: now, aggregator: aggregator)
    }

    /// The metric families, in the file's order, and what each says.
    static let unitFamilies: [(name: String, type: String, help: String)] = [
        ("stallmon_stalls_total", "counter", "Stalls of monitored run loops, by systemd unit."),
        ("stallmon_stall_duration_seconds", "histogram", "Durations of stalls, by systemd unit."),
        (
            "stallmon_fingerprint_stalls_total", "counter",
            "Stalls by unit and fingerprint (the same stall in code); bounded per unit, the rest under fingerprint=\"other\"."
        ),
        ("stallmon_fingerprint_worst_stall_seconds", "gauge", "The longest stall seen per unit and fingerprint."),
        (
            "stallmon_endpoint_stalls_total", "counter",
            "Stalls inside a request, by unit and endpoint (route, gRPC method or span name, never the URL path); bounded per unit by max_endpoints_per_unit and per user by max_endpoints_per_user, the rest under endpoint=\"(other endpoints)\"."
        ),
        ("stallmon_endpoint_stall_seconds_total", "counter", "Time stalled inside a request, by unit and endpoint."),
        (
            "stallmon_watchdog_stalls_total", "counter",
            "Stalls that outlasted WatchdogSec= (systemd killed the service)."
        ),
        (
            "stallmon_suppressed_reports_total", "counter",
            "Stall reports held back by rate limiting in the monitored services."
        ),
    ]

    /// Renders the metrics of successive states, rendering again only the units that changed
    /// since the last call: a new stall costs the same whatever the number of series. The file is
    /// still written whole (node_exporter reads it whole), from each unit's text kept here.
    ///
    /// - Important: Not thread-safe: one caller at a time (the collector's save queue).
    package final class Renderer {
        /// Each unit's lines of each family in ``unitFamilies``, and of `stallmon_fingerprint_hosts`.
        private var units: [String: [String]] = [:]
        private var bucketBounds: [UInt64]?

        package init() {}

        /// The metrics of `state`. `changed`: the units that changed since the last call (their
        /// text is made again, and that of units the cache lacks); `nil` for all of them.
        package func render(
            _ state: CollectorState, changed: Set<String>?, windows: [Duration], now: UInt64,
            aggregator: StallAggregator
        ) -> String {
            if changed == nil || bucketBounds != state.bucketBounds {
                units = [:]
                bucketBounds = state.bucketBounds
            }
            for unit in changed ?? [] { units[unit] = nil }
            if units.count > state.units.count { units = units.filter { state.units[$0.key] != nil } }
            let names = state.units.keys.sorted()
            var sections: [[String]] = []
            sections.reserveCapacity(names.count)
            for unit in names {
                if let text = units[unit] {
                    sections.append(text)
                } else {
                    let text = PrometheusTextfile.lines(of: unit, state.units[unit]!, bucketBounds: state.bucketBounds)
                    units[unit] = text
                    sections.append(text)
                }
            }
            var text = ""
            func family(_ name: String, _ type: String, _ help: String) {
                text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            }
            for (index, unitFamily) in PrometheusTextfile.unitFamilies.enumerated() {
                family(unitFamily.name, unitFamily.type, unitFamily.help)
                for section in sections { text += section[index] }
            }
            family("stallmon_window_stalls", "gauge", "Stalls received in the trailing window, by unit.")
            for (window, perUnit) in zip(windows, aggregator.stallsPerUnit(windows: windows, now: now)) {
                let label = StallAggregator.describe(window)
                for unit in names {
                    text +=
                        "stallmon_window_stalls{unit=\"\(escape(unit))\",window=\"\(label)\"} \(perUnit[unit] ?? 0)\n"
                }
            }
            // Hosts get their own series here only: host × unit × fingerprint would multiply the
            // bounds (max_hosts × max_units × max_fingerprints_per_unit). Which hosts a fingerprint
            // hit is a count per fingerprint; `stallmon report --host` and the journal say which.
            family(
                "stallmon_host_stalls_total", "counter",
                "Stalls by host (_HOSTNAME, and _MACHINE_ID as its identity); bounded by max_hosts, the rest under host=\"(other hosts)\"."
            )
            for (machineID, host) in state.hosts.sorted(by: { $0.key < $1.key }) {
                let id = machineID == CollectorState.otherHosts ? "" : machineID
                text +=
                    "stallmon_host_stalls_total{host=\"\(escape(host.name))\",machine_id=\"\(escape(id))\"} \(host.stalls)\n"
            }
            family(
                "stallmon_fingerprint_hosts", "gauge",
                "On how many hosts a unit's fingerprint stalled (the same code on many hosts shares its fingerprint).")
            for section in sections { text += section[PrometheusTextfile.unitFamilies.count] }
            text += PrometheusTextfile.collectorLines(state)
            return text
        }
    }

    /// A unit's lines of each family of ``unitFamilies``, then of `stallmon_fingerprint_hosts`,
    /// each ending in a newline.
    static func lines(of unit: String, _ stats: CollectorState.UnitStats, bucketBounds: [UInt64]) -> [String] {
        let label = "unit=\"\(escape(unit))\""
        var histogram = ""
        var cumulative = 0
        for (index, bound) in bucketBounds.enumerated() {
            cumulative += index < stats.buckets.count ? stats.buckets[index] : 0
            histogram += "stallmon_stall_duration_seconds_bucket{\(label),le=\"\(seconds(bound))\"} \(cumulative)\n"
        }
        histogram += "stallmon_stall_duration_seconds_bucket{\(label),le=\"+Inf\"} \(stats.stalls)\n"
        histogram += "stallmon_stall_duration_seconds_sum{\(label)} \(seconds(stats.totalMicroseconds))\n"
        histogram += "stallmon_stall_duration_seconds_count{\(label)} \(stats.stalls)\n"
        var fingerprints = ""
        var worst = ""
        var hosts = ""
        for (key, fingerprint) in stats.fingerprints.sorted(by: { $0.key < $1.key }) where fingerprint.labeled {
            let series = "\(label),fingerprint=\"\(escape(key))\""
            fingerprints +=
                "stallmon_fingerprint_stalls_total{\(series),frame=\"\(escape(fingerprint.frame))\"} \(fingerprint.stalls)\n"
            worst += "stallmon_fingerprint_worst_stall_seconds{\(series)} \(seconds(fingerprint.worstMicroseconds))\n"
            hosts += "stallmon_fingerprint_hosts{\(series)} \(fingerprint.hostCount)\n"
        }
        if stats.otherStalls > 0 {
            fingerprints +=
                "stallmon_fingerprint_stalls_total{\(label),fingerprint=\"other\",frame=\"\"} \(stats.otherStalls)\n"
        }
        var endpointStalls = ""
        var endpointSeconds = ""
        for (endpoint, counts) in stats.endpoints.sorted(by: { $0.key < $1.key }) {
            let series = "\(label),endpoint=\"\(escape(endpoint))\""
            endpointStalls += "stallmon_endpoint_stalls_total{\(series)} \(counts.stalls)\n"
            endpointSeconds += "stallmon_endpoint_stall_seconds_total{\(series)} \(seconds(counts.totalMicroseconds))\n"
        }
        return [
            "stallmon_stalls_total{\(label)} \(stats.stalls)\n", histogram, fingerprints, worst, endpointStalls,
            endpointSeconds, "stallmon_watchdog_stalls_total{\(label)} \(stats.watchdogStalls)\n",
            "stallmon_suppressed_reports_total{\(label)} \(stats.suppressedReports)\n", hosts,
        ]
    }

    /// stallmond's own counters: what it set aside, and how far it read.
    static func collectorLines(_ state: CollectorState) -> String {
        var lines: [String] = []
        func family(_ name: String, _ type: String, _ help: String) {
            lines.append("# HELP \(name) \(help)")
            lines.append("# TYPE \(name) \(type)")
        }
        family(
            "stallmond_malformed_entries_total", "counter",
            "Journal entries with a stall MESSAGE_ID that did not match the schema.")
        lines.append("stallmond_malformed_entries_total \(state.malformedEntries)")
        family(
            "stallmond_folded_stalls_total", "counter",
            "Stalls counted under fingerprint=\"other\", endpoint=\"(other endpoints)\", unit=\"(other units)\" or host=\"(other hosts)\" because a limit was reached."
        )
        lines.append("stallmond_folded_stalls_total{what=\"endpoint\"} \(state.foldedEndpointStalls)")
        lines.append("stallmond_folded_stalls_total{what=\"fingerprint\"} \(state.foldedFingerprintStalls)")
        lines.append("stallmond_folded_stalls_total{what=\"host\"} \(state.foldedHostStalls)")
        lines.append("stallmond_folded_stalls_total{what=\"unit\"} \(state.foldedUnitStalls)")
        lines.append("stallmond_folded_stalls_total{what=\"user\"} \(state.foldedUserStalls)")
        family(
            "stallmond_user_folded_stalls_total", "counter",
            "Stalls of a user (_UID, outside system units) counted under unit=\"(other units)\" because its max_units series all still stall."
        )
        for (user, stats) in state.users.sorted(by: { $0.key < $1.key }) {
            lines.append("stallmond_user_folded_stalls_total{uid=\"\(escape(user))\"} \(stats.foldedStalls)")
        }
        family(
            "stallmond_evicted_series_total", "counter",
            "Series that gave way to newer ones of the same user or unit after no stall for the longest window."
        )
        lines.append("stallmond_evicted_series_total{what=\"endpoint\"} \(state.evictedEndpoints)")
        lines.append("stallmond_evicted_series_total{what=\"fingerprint\"} \(state.evictedFingerprints)")
        lines.append("stallmond_evicted_series_total{what=\"unit\"} \(state.evictedSeries)")
        family(
            "stallmond_cursor_recoveries_total", "counter",
            "Saved journal positions the journal rejected (reading resumed by boot and time) or no longer holds (vacuumed)."
        )
        lines.append("stallmond_cursor_recoveries_total{reason=\"rejected\"} \(state.rejectedCursors)")
        lines.append("stallmond_cursor_recoveries_total{reason=\"vanished\"} \(state.vanishedCursors)")
        family(
            "stallmond_duplicate_entries_total", "counter",
            "Stall entries received twice (an uploader that restarted sent them again), counted once.")
        lines.append("stallmond_duplicate_entries_total \(state.duplicateEntries)")
        family(
            "stallmond_skipped_entries_total", "counter",
            "Stall entries a start without a saved position did not read: older than the longest window, or before the newest cold_start_entries of their machine."
        )
        lines.append("stallmond_skipped_entries_total \(state.skippedEntries)")
        family("stallmond_last_entry_timestamp_seconds", "gauge", "When the newest counted entry reached the journal.")
        lines.append("stallmond_last_entry_timestamp_seconds \(seconds(state.lastEntryMicroseconds))")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The longest label value written, in bytes of UTF-8, before the exposition format's
    /// escapes. The schema bounds units and frames already (``FieldLimits``); this keeps the file
    /// bounded whatever state it is rendered from.
    static let maximumLabelBytes = 256

    /// A label value, in the exposition format: ``shown(_:)``, then backslash, double quote and
    /// newline escaped as the format asks.
    static func escape(_ value: String) -> String {
        var result = ""
        for character in shown(value).unicodeScalars {
            switch character {
            case "\\": result += "\\\\"
            case "\"": result += "\\\""
            case "\n": result += "\\n"
            default: result.unicodeScalars.append(character)
            }
        }
        return result
    }

    /// A label value as a series shows it: printable, and distinct for distinct values.
    ///
    /// - Every character that ``DisplayText/isControl(_:)`` names (C0, tab and newline too, DEL,
    ///   C1, the bidirectional controls, the line and paragraph separators) is shown as its code
    ///   point in Swift's notation, `\u{1B}`, `\u{202E}`: an operator's terminal reading
    ///   `curl …/metrics` acts on none of them. Not `\x1b`: that is how systemd escapes unit names
    ///   (`foo\x2dbar.service`), which stay as systemd writes them.
    /// - A backslash is doubled where it comes before `u`, a backslash or a replaced character,
    ///   so that no value reads as another's escape (two values are never one series).
    /// - A value longer than ``maximumLabelBytes`` is cut (never inside an escape), ending in `…`
    ///   and a hash of the whole value, so two long values never become the same series.
    static func shown(_ value: String) -> String {
        if value.utf8.count <= maximumLabelBytes,
            !value.unicodeScalars.contains(where: { $0 == "\\" || DisplayText.isControl($0) })
        {
            return value
        }
        let scalars = Array(value.unicodeScalars)
        var pieces: [String] = []
        pieces.reserveCapacity(scalars.count)
        var bytes = 0
        for (index, scalar) in scalars.enumerated() {
            let piece: String
            if DisplayText.isControl(scalar) {
                piece = "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            } else if scalar == "\\", index + 1 < scalars.count,
                ["u", "\\"].contains(scalars[index + 1]) || DisplayText.isControl(scalars[index + 1])
            {
                piece = "\\\\"
            } else {
                piece = String(scalar)
            }
            pieces.append(piece)
            bytes += piece.utf8.count
        }
        guard bytes > maximumLabelBytes else { return pieces.joined() }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in value.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        let digits = String(hash, radix: 16)
        let suffix = FieldLimits.truncationMarker + "#" + String(repeating: "0", count: 16 - digits.count) + digits
        var result = ""
        var used = 0
        for piece in pieces {
            if used + piece.utf8.count + suffix.utf8.count > maximumLabelBytes { break }
            result += piece
            used += piece.utf8.count
        }
        return result + suffix
    }

    static func seconds(_ microseconds: UInt64) -> String {
        let whole = microseconds / 1_000_000
        let fraction = microseconds % 1_000_000
        guard fraction > 0 else { return "\(whole)" }
        var digits = String(fraction)
        digits = String(repeating: "0", count: 6 - digits.count) + digits
        while digits.hasSuffix("0") { digits.removeLast() }
        return "\(whole).\(digits)"
    }

    /// Writes the file atomically (node_exporter must never read half a file).
    package static func write(_ text: String, to path: String) throws {
        try AtomicFile.write(Data(text.utf8), to: path, mode: 0o644)
    }
}
