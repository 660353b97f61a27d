import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// `stallmon report` and `follow` read entries that anyone on the host can write: with our
    /// MESSAGE_IDs, out-of-bound values, huge fields and terminal escape sequences. They run as real
    /// children against a real journald of a namespace of their own.
    @Suite
    struct HostileJournalTests {
        @Test func reportBoundsHugeIdentifiersAndEscapesTerminalSequences() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            for index in 0..<20 {
                try journal.send(Entries.stallFields(identifier: "svc", fingerprint: Entries.fingerprint(index)))
            }
            let huge = String(repeating: "A", count: 100_000)
            for index in 0..<3 {
                try journal.send(
                    Entries.stallFields(identifier: huge + "\(index)", fingerprint: Entries.fingerprint(100 + index)))
            }
            try journal.send(
                Entries.stallFields(
                    identifier: "evil\u{1b}]0;owned\u{07}", fingerprint: Entries.fingerprint(200),
                    frame: "Evil.run() \u{1b}[2J\u{1b}[H\u{9b}31m (Evil.swift:1)"))
            try #require(journal.waitForEntries(24, messageIDs: [MessageID.stallEnded]))

            let table = try Executable.stallmon.run(["report", "--namespace", journal.name])
            #expect(table.status == 0, "\(table.errors)")
            #expect(table.output.utf8.count < 16_384, "\(table.output.utf8.count) bytes of table")
            let lines = table.output.split(separator: "\n")
            #expect(lines.count == 25)
            #expect(lines.allSatisfy { $0.unicodeScalars.count <= 340 })
            #expect(!table.output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x9B })
            #expect(table.output.contains("Evil.run() \\x1b[2J\\x1b[H\\u009b31m (Evil.swift:1)"))
            #expect(table.output.contains("(evil\\x1b]0;owned\\x07)"))
            #expect(table.output.contains("(AAAAAAAA"))

            let json = try Executable.stallmon.run(["report", "--namespace", journal.name, "--json"])
            #expect(json.status == 0, "\(json.errors)")
            #expect(json.output.utf8.count < 64_000, "\(json.output.utf8.count) bytes of JSON")
            #expect(
                !json.output.unicodeScalars.contains {
                    $0.value < 0x20 && $0.value != 0x0A || (0x7F...0x9F).contains($0.value)
                })
            let groups = try JSONDecoder().decode([StallGroup].self, from: Data(json.output.utf8))
            #expect(groups.count == 24)
            let long = groups.filter { $0.unit.hasPrefix("(AAAA") }
            #expect(long.count == 3)
            #expect(
                long.allSatisfy { $0.unit.utf8.count <= FieldLimits.identifierBytes + 2 && $0.unit.hasSuffix("…)") })
            #expect(groups.contains { $0.heaviestFrame == "Evil.run() \u{1b}[2J\u{1b}[H\u{9b}31m (Evil.swift:1)" })
        }

        @Test func reportNamesOutOfBoundEntriesAndExitsWithDataError() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            try journal.send(Entries.stallFields(identifier: "good", fingerprint: Entries.fingerprint(1)))
            let hostile: [[String: String]] = [
                ["STALL_DURATION_USEC": "9223372036854775807"],
                ["STALL_CPU_USEC": "-5"],
                ["STALL_FINGERPRINT": "ABCDEF0123456789"],
                ["STALL_SAMPLES": "-1000"],
                ["STALL_FRAME": String(repeating: "x", count: 100_000)],
            ]
            for overrides in hostile {
                try journal.send(
                    Entries.stallFields(identifier: "bad", fingerprint: Entries.fingerprint(2), overrides: overrides))
            }
            try #require(journal.waitForEntries(6, messageIDs: [MessageID.stallEnded]))

            let report = try Executable.stallmon.run(["report", "--namespace", journal.name, "--json"])
            #expect(report.status == 65)
            let groups = try JSONDecoder().decode([StallGroup].self, from: Data(report.output.utf8))
            #expect(groups.map(\.unit) == ["(good)"])
            for field in ["STALL_DURATION_USEC", "STALL_CPU_USEC", "STALL_FINGERPRINT", "STALL_SAMPLES", "STALL_FRAME"]
            {
                #expect(
                    report.errors.split(separator: "\n").contains {
                        $0.contains("skipped malformed entry s=") && $0.contains("field \(field)=")
                    }, "\(field) not named in \(report.errors)")
            }
            #expect(report.errors.contains("5 malformed entries skipped"))
            #expect(report.errors.utf8.count < 4096)
        }

        @Test func followNamesMalformedEntriesAndEndsWithDataError() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            try journal.send(Entries.stallFields(identifier: "before", fingerprint: Entries.fingerprint(1)))
            try journal.send(
                Entries.stallFields(
                    identifier: "before", fingerprint: Entries.fingerprint(2), overrides: ["STALL_ID": "nothex"]))
            try #require(journal.waitForEntries(2, messageIDs: [MessageID.stallEnded]))

            let follow = try Executable.stallmon.start(["follow", "--namespace", journal.name, "--lines", "5"])
            #expect(
                follow.waitForOutput { output, errors in output.contains("(before)") || output.contains("before[") })
            try journal.send(
                Entries.stallFields(
                    identifier: "after\u{1b}[2J", fingerprint: Entries.fingerprint(3),
                    frame: "After.run() \u{1b}]0;title\u{07}"))
            try journal.send(
                Entries.stallFields(
                    identifier: "after", fingerprint: Entries.fingerprint(4),
                    overrides: ["STALL_SUPPRESSED_COUNT": "1", "PRIORITY": "99"]))
            try journal.send(
                [
                    ("MESSAGE_ID", MessageID.reportsSuppressed), ("MESSAGE", "suppressed"), ("PRIORITY", "5"),
                    ("STALL_THREAD_TID", "1"), ("STALL_FINGERPRINT", Entries.fingerprint(5)),
                    ("STALL_SUPPRESSED_COUNT", "-1000"), ("STALL_SUPPRESSED_TOTAL_USEC", "0"),
                    ("STALL_SUPPRESSED_WORST_USEC", "0"), ("STALL_RATE_LIMIT_BURST", "5"),
                    ("STALL_RATE_LIMIT_INTERVAL_USEC", "60000000"),
                ])
            #expect(
                follow.waitForOutput { output, errors in
                    output.contains("After.run()")
                        && errors.components(separatedBy: "skipped malformed entry").count == 4
                })
            let result = follow.terminate()
            #expect(result.status == 65, "\(result.errors)")
            #expect(!result.output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 })
            #expect(result.output.contains("(after\\x1b[2J)["))
            #expect(result.output.contains("After.run() \\x1b]0;title\\x07"))
            let problems = result.errors.split(separator: "\n").filter { $0.contains("skipped malformed entry s=") }
            #expect(problems.count == 3)
            #expect(problems.contains { $0.contains("field STALL_ID=\"nothex\": not 32 lowercase hex digits") })
            #expect(problems.contains { $0.contains("field PRIORITY=\"99\": out of range") })
            #expect(problems.contains { $0.contains("field STALL_SUPPRESSED_COUNT=\"-1000\": out of range") })
            #expect(result.errors.contains("3 malformed entries skipped"))

            // Nothing malformed: interrupted, it exits 0.
            let clean = try Executable.stallmon.start(["follow", "--namespace", journal.name])
            usleep(500_000)
            #expect(clean.terminate(signal: SIGINT, grace: 10).status == 0)
        }

        @Test func aJournalTheUserMayNotReadIsUnavailableNotEmpty() throws {
            try #require(Journald.host.ensureRunning())
            try #require(getuid() == 0, "needs root to run a child as nobody")
            let identifier = "stallmon-unreadable-\(getpid())"
            let fields = Entries.stallFields(identifier: identifier, fingerprint: Entries.fingerprint(7))
            try JournalWriter().send(fields.map { JournalField($0.0, $0.1) })
            #expect(!(try Journald.host.entries(["SYSLOG_IDENTIFIER=\(identifier)"])).isEmpty)

            let drop = ["--reuid=65534", "--regid=65534", "--clear-groups", Executable.stallmon.url.path]
            let report = try Self.run("/usr/bin/setpriv", drop + ["report"])
            #expect(report.status == 69, "\(report.output)\(report.errors)")
            #expect(report.output.isEmpty)
            #expect(report.errors.contains("stallmon report: cannot read the journal: permission denied for /"))
            #expect(report.errors.contains("systemd-journal"))

            let follow = try Self.run("/usr/bin/setpriv", drop + ["follow"])
            #expect(follow.status == 69, "\(follow.output)\(follow.errors)")
            #expect(follow.errors.contains("stallmon follow: cannot read the journal: permission denied for /"))

            // As root, the same binary reads it.
            let root = try Executable.stallmon.run(["report", "--json"])
            #expect(root.output.contains("(\(identifier))"))
        }

        /// Runs `path` to completion (killed after 30 s): its status, standard output and error.
        static func run(_ path: String, _ arguments: [String]) throws -> Executable.Result {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: path)
            process.arguments = arguments
            let output = Pipe()
            let errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            try process.run()
            let killer = DispatchWorkItem {
                if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + 30, execute: killer)
            defer { killer.cancel() }
            let outputText = output.fileHandleForReading.readDataToEndOfFile()
            let errorText = errors.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return Executable.Result(
                status: process.terminationStatus, output: String(decoding: outputText, as: UTF8.self),
                errors: String(decoding: errorText, as: UTF8.self))
        }
    }
}
