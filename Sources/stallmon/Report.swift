import ArgumentParser
import Foundation
import StallCollector
import StallJournal

/// Groups the journal's stall reports by unit and fingerprint, or by unit and route.
struct Report: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Summarize the journal's stall reports by unit and fingerprint.",
        discussion: """
            Reads the ended (and watchdog) stall entries through the journal schema and prints one \
            row per unit and fingerprint: count, hosts, median and longest duration, callout and the \
            frame of the longest stall, and the request it served (endpoint and trace ID) where a \
            stall served one. --by route prints one row per unit and endpoint instead (the route, \
            else the gRPC method, the URL path or the span's name, after the HTTP method). Entries \
            that do not match the schema are named on standard \
            error and make the exit status 65; a journal this user may not read exits 69. Control \
            characters from the journal are shown escaped (\\x1b) and long cells are cut (…).
            """
    )

    @Option(help: "Only this systemd unit (e.g. foo.service).")
    var unit: String?

    @Option(help: "Read this journal namespace (LogNamespace=) instead of the default one.")
    var namespace: String?

    @Option(help: "Only this host: its name (_HOSTNAME) or its machine id (_MACHINE_ID).")
    var host: String?

    @Option(
        name: [.customShort("D"), .long],
        help: """
            Read the journal files in this directory (and its machine-id subdirectories) instead of \
            the local journal, e.g. /var/log/journal/remote where systemd-journal-remote writes; \
            may be given more than once.
            """)
    var directory: [String] = []

    @Flag(name: [.customShort("m"), .long], help: "Read every journal this machine has, the remote ones included.")
    var merge = false

    @Option(help: "Only entries since this time: 30s, 15m, 2h, 7d, today, yesterday, or YYYY-MM-DD[ HH:MM[:SS]].")
    var since: String?

    @Option(
        help: ArgumentHelp(
            "Group by unit and fingerprint (the same stall in code) or by unit and route (the same request).",
            valueName: "fingerprint|route"))
    var by: Grouping = .fingerprint

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Option(
        help: ArgumentHelp(
            "Write an SVG flame graph of the stalls' sampled stacks, weighted by stall time, to this file.",
            valueName: "file"))
    var flamegraph: String?

    @Flag(help: "Print the stalls' sampled stacks as folded text (outer;...;inner microseconds).")
    var folded = false

    @Flag(
        name: .customLong("all-writers"),
        help: """
            With --flamegraph or --folded: also draw the stalls written outside system units (by any \
            local user), apart, under a frame naming the writer's uid.
            """)
    var allWriters = false

    func validate() throws {
        if !directory.isEmpty, merge || namespace != nil {
            throw ValidationError("--directory reads only the given directories: it excludes --merge and --namespace.")
        }
        if merge, namespace != nil {
            throw ValidationError("--merge reads every journal: it excludes --namespace.")
        }
        if let host, host.isEmpty || host.contains("=") {
            throw ValidationError("--host '\(host)' is not a host name or machine id.")
        }
        if json, folded { throw ValidationError("--json and --folded print different things: choose one.") }
        if by != .fingerprint, flamegraph != nil || folded {
            throw ValidationError(
                "--by chooses the table's (or --json's) groups: --flamegraph and --folded draw stacks.")
        }
        if allWriters, flamegraph == nil, !folded {
            throw ValidationError("--all-writers chooses what --flamegraph or --folded draw: give one of them.")
        }
        if let since, TimeSpec.parse(since, now: Date()) == nil {
            throw ValidationError(
                "--since '\(since)' is not a time: use 30s, 15m, 2h, 7d, today, yesterday or YYYY-MM-DD[ HH:MM[:SS]].")
        }
    }

    func run() throws {
        let readers = try JournalSource.open(
            namespace: namespace, directories: directory, merge: merge, command: "report")
        let drawing = flamegraph != nil || folded
        var stalls: [StallObservation] = []
        // Merged as entries come: memory stays bounded whatever they hold (FlameGraph.maximumNodes).
        var graph = ServiceFlameGraph(allWriters: allWriters)
        var malformed: [String] = []
        var malformedCount = 0
        do {
            for reader in readers {
                for messageID in [MessageID.stallEnded, MessageID.watchdogStall] {
                    for unitMatches in UnitMatch.terms(unit) {
                        try reader.addMatch("MESSAGE_ID", messageID)
                        for (field, value) in unitMatches { try reader.addMatch(field, value) }
                        if let host {
                            try reader.addMatch(JournalEntry.isMachineID(host) ? "_MACHINE_ID" : "_HOSTNAME", host)
                        }
                        try reader.addDisjunction()
                    }
                }
                if let since, let date = TimeSpec.parse(since, now: Date()) {
                    try reader.seek(realtimeMicroseconds: UInt64(max(0, date.timeIntervalSince1970) * 1_000_000))
                } else {
                    try reader.seekHead()
                }
                while let entry = try reader.next() {
                    guard UnitMatch.accepts(entry, unit: unit) else { continue }
                    do {
                        let record = try StallRecord(journalFields: entry.fields)
                        if drawing {
                            graph.add(record, fields: entry.fields)
                        } else {
                            stalls.append(StallObservation(record: record, entry: entry))
                        }
                    } catch {
                        malformedCount += 1
                        if malformed.count < 20 { malformed.append("entry \(entry.cursor): \(error)") }
                    }
                }
            }
        } catch {
            JournalSource.complain("report", "cannot read the journal: \(error)")
            throw ExitStatus.unavailable
        }
        let groups = StallGroup.group(stalls, by: by.grouping)
        if drawing {
            try drawStacks(graph.graph)
        } else if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(JSONText.escapingControls(String(decoding: try encoder.encode(groups), as: UTF8.self)))
        } else {
            print(by == .route ? Self.routeTable(groups) : Self.table(groups))
        }
        for problem in malformed {
            JournalSource.complain("report", "skipped malformed \(problem)")
        }
        if malformedCount > 0 {
            JournalSource.complain("report", "\(malformedCount) malformed entries skipped")
            throw ExitStatus.dataError
        }
    }

    /// The widest each column of the table gets, in characters; longer cells end in `…`. The JSON
    /// output carries the whole values, which the schema bounds (``FieldLimits``).
    static let columnLimits = [64, 16, 12, 8, 12, 24, 16, 160]

    /// The table by unit and fingerprint. Where a group's longest stall served a request, two
    /// columns say which (its endpoint and trace ID), before the heaviest frame; a journal without
    /// requests gets the table it always got.
    static func table(_ groups: [StallGroup]) -> String {
        guard !groups.isEmpty else { return "no stalls" }
        let requests = groups.contains { $0.endpoint != nil || $0.traceID != nil }
        var header = ["UNIT", "FINGERPRINT", "COUNT", "HOSTS", "P50", "MAX", "CALLOUT", "HEAVIEST FRAME"]
        if requests { header.insert(contentsOf: ["REQUEST", "TRACE"], at: 7) }
        let rows = groups.map { group in
            var cells = [
                group.unit, group.fingerprint, String(group.count), String(group.hosts),
                milliseconds(group.p50Microseconds), maximum(group), group.callout, group.heaviestFrame,
            ].enumerated().map { column, cell in DisplayText.cell(cell, limit: columnLimits[column]) }
            cells[0] += outsideMark(group)
            if requests { cells.insert(contentsOf: requestCells(group), at: 7) }
            return cells
        }
        return layout(header: header, rows: rows, numeric: [2, 3, 4, 5])
    }

    /// The table by unit and endpoint (`--by route`): stalls outside any request are one row,
    /// `(no request)`.
    static func routeTable(_ groups: [StallGroup]) -> String {
        guard !groups.isEmpty else { return "no stalls" }
        let header = ["UNIT", "ENDPOINT", "COUNT", "HOSTS", "P50", "MAX", "TRACE", "HEAVIEST FRAME"]
        let rows = groups.map { group in
            let request = requestCells(group)
            return [
                DisplayText.cell(group.unit, limit: columnLimits[0]) + outsideMark(group),
                group.endpoint == nil ? "(no request)" : request[0],
                String(group.count), String(group.hosts), milliseconds(group.p50Microseconds),
                DisplayText.cell(maximum(group), limit: columnLimits[5]), request[1],
                DisplayText.cell(group.heaviestFrame, limit: columnLimits[7]),
            ]
        }
        return layout(header: header, rows: rows, numeric: [2, 3, 4, 5])
    }

    /// The endpoint and the trace ID of a group's longest stall, as cells: `-` for what it lacks.
    static func requestCells(_ group: StallGroup) -> [String] {
        [
            group.endpoint.map { RequestText.endpoint($0) } ?? "-",
            group.traceID.map { DisplayText.cell($0, limit: 32) } ?? "-",
        ]
    }

    /// What follows the unit of a group stallmond saw from outside: ` (seen from outside)`, or
    /// ` (N seen from outside)` where only some of its stalls were; nothing for a linked monitor's.
    static func outsideMark(_ group: StallGroup) -> String {
        guard let outside = group.seenFromOutside, outside > 0 else { return "" }
        return outside == group.count ? " (seen from outside)" : " (\(outside) seen from outside)"
    }

    static func maximum(_ group: StallGroup) -> String {
        milliseconds(group.maxMicroseconds) + (group.watchdogKills > 0 ? " (\(group.watchdogKills) killed)" : "")
    }

    /// Columns padded to their widest cell (numbers to the right); the last is not padded.
    static func layout(header: [String], rows: [[String]], numeric: Set<Int>) -> String {
        let widths = header.indices.map { column in
            ([header] + rows).map { DisplayText.width($0[column]) }.max() ?? 0
        }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { column, cell in
                if column == cells.count - 1 { return cell }
                let padding = String(repeating: " ", count: widths[column] - DisplayText.width(cell))
                return numeric.contains(column) ? padding + cell : cell + padding
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }

    /// `--by`'s values.
    enum Grouping: String, ExpressibleByArgument, CaseIterable {
        case fingerprint
        case route

        var grouping: StallGroup.Grouping { self == .route ? .route : .fingerprint }
    }

    static func milliseconds(_ microseconds: UInt64) -> String {
        microseconds >= 10_000_000 ? String(format: "%.1f s", Double(microseconds) / 1e6) : "\(microseconds / 1000) ms"
    }
}

/// `--since` values.
enum TimeSpec {
    static func parse(_ text: String, now: Date) -> Date? {
        let trimmed = text.trimmingCharacters(in: .whitespaces).lowercased()
        let calendar = Calendar.current
        switch trimmed {
        case "today": return calendar.startOfDay(for: now)
        case "yesterday": return calendar.date(byAdding: .day, value: -1, to: calendar.startOfDay(for: now))
        default: break
        }
        if let unit = trimmed.last, let value = Double(trimmed.dropLast()), value >= 0 {
            let seconds: Double? = ["s": 1, "m": 60, "h": 3600, "d": 86400][unit]
            if let seconds { return now.addingTimeInterval(-value * seconds) }
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone.current
        for format in ["yyyy-MM-dd HH:mm:ss", "yyyy-MM-dd HH:mm", "yyyy-MM-dd", "yyyy-MM-dd'T'HH:mm:ss"] {
            formatter.dateFormat = format
            if let date = formatter.date(from: text.trimmingCharacters(in: .whitespaces)) { return date }
        }
        return nil
    }
}
