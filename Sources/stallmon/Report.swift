import ArgumentParser
import Foundation
import StallCollector
import StallJournal

/// Groups the journal's stall reports by unit and fingerprint.
struct Report: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Summarize the journal's stall reports by unit and fingerprint.",
        discussion: """
            Reads the ended (and watchdog) stall entries through the journal schema and prints one \
            row per unit and fingerprint: count, hosts, median and longest duration, callout and the \
            frame of the longest stall. Entries that do not match the schema are named on standard \
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
                    try reader.addMatch("MESSAGE_ID", messageID)
                    if let unit { try reader.addMatch("_SYSTEMD_UNIT", unit) }
                    if let host {
                        try reader.addMatch(JournalEntry.isMachineID(host) ? "_MACHINE_ID" : "_HOSTNAME", host)
                    }
                    if messageID == MessageID.stallEnded { try reader.addDisjunction() }
                }
                if let since, let date = TimeSpec.parse(since, now: Date()) {
                    try reader.seek(realtimeMicroseconds: UInt64(max(0, date.timeIntervalSince1970) * 1_000_000))
                } else {
                    try reader.seekHead()
                }
                while let entry = try reader.next() {
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
        let groups = StallGroup.group(stalls)
        if drawing {
            try drawStacks(graph.graph)
        } else if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(JSONText.escapingControls(String(decoding: try encoder.encode(groups), as: UTF8.self)))
        } else {
            print(Self.table(groups))
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

    static func table(_ groups: [StallGroup]) -> String {
        guard !groups.isEmpty else { return "no stalls" }
        let header = ["UNIT", "FINGERPRINT", "COUNT", "HOSTS", "P50", "MAX", "CALLOUT", "HEAVIEST FRAME"]
        let rows = groups.map { group in
            [
                group.unit, group.fingerprint, String(group.count), String(group.hosts),
                milliseconds(group.p50Microseconds),
                milliseconds(group.maxMicroseconds)
                    + (group.watchdogKills > 0 ? " (\(group.watchdogKills) killed)" : ""),
                group.callout, group.heaviestFrame,
            ].enumerated().map { column, cell in DisplayText.cell(cell, limit: columnLimits[column]) }
        }
        let widths = header.indices.map { column in
            ([header] + rows).map { DisplayText.width($0[column]) }.max() ?? 0
        }
        let numeric: Set<Int> = [2, 3, 4, 5]
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { column, cell in
                if column == cells.count - 1 { return cell }
                let padding = String(repeating: " ", count: widths[column] - DisplayText.width(cell))
                return numeric.contains(column) ? padding + cell : cell + padding
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
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
