import Foundation
import FoundationXML
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What a user without privileges could still do through the request fields, the flame graph,
/// `follow`, the textfile and stallmond's first milliseconds, with the real CLI, the real daemon
/// and a real journald of the test's own.
extension Serial.HostileWriterTests {
    /// Eight of the schema's worst entries and a forged stall of 366 days by `nobody` fill the
    /// flame graph; an ordinary stall of root's came next, and `--all-writers` crashed (exit 132:
    /// its writer's frame could not be made, and -1 was used as a parent). The forged year also
    /// made the system unit's boxes too narrow to draw. Both views now draw, say what was cut,
    /// and show every writer, the system unit's frames with room to read them.
    @Test func aFullFlameGraphOfAllWritersIsDrawnSaysWhatWasCutAndShowsTheUnits() throws {
        let journal = Journald.namespaced()
        defer { journal.remove() }
        try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
        let unit = "stallmon-writers-\(getpid()).service"
        defer { JournalWriters.removeSystemUnit(unit) }
        var flood = (0..<8).map { Self.worst($0) }
        flood.append(Self.worst(999, overrides: ["STALL_DURATION_USEC": "\(FieldLimits.maximumMicroseconds)"]))
        try JournalWriters.send(flood, to: journal.socketPath, as: .nobody)
        let frame = "RealService.work() (RealService.swift:7)"
        try JournalWriters.send(
            (0..<3).map { Self.stall("real", fingerprint: 10 + $0, frame: frame) }, to: journal.socketPath,
            as: .systemUnit(unit))
        try journal.send(Self.stall("tool", fingerprint: 20, frame: "Tool.run() (Tool.swift:3)"))
        try #require(journal.waitForEntries(13, messageIDs: [MessageID.stallEnded], timeout: 30))
        let cut = "cut at 100000 distinct frames"

        let directory = NSTemporaryDirectory() + "stallmon-writers-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/all.svg"
        let drawn = try Executable.stallmon.run(
            ["report", "--namespace", journal.name, "--flamegraph", path, "--all-writers"])
        #expect(drawn.status == 0, "\(drawn.errors.suffix(2000))")
        #expect(drawn.output.contains(cut), "\(drawn.output)")
        let svg = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        #expect(XMLParser(data: Data(svg.utf8)).parse())
        #expect(svg.contains(cut))
        for writer in ["[system units]", "[uid 65534]", "[uid 0]"] {
            #expect(svg.contains("<title>\(writer) ("), "no box of \(writer)")
        }
        // The unit's frame: drawn, and wide enough for its name (a third of the width, as each writer).
        let widths = Self.boxWidths(svg, titled: frame)
        #expect(widths.count == 1, "\(widths)")
        #expect(widths.allSatisfy { $0 > 300 }, "\(widths)")
        #expect(svg.contains(">\(frame)</text>"))

        let folded = try Executable.stallmon.run(["report", "--namespace", journal.name, "--folded", "--all-writers"])
        #expect(folded.status == 0, "\(folded.errors.suffix(2000))")
        #expect(folded.errors.contains(cut), "\(folded.errors)")
        let lines = folded.output.split(separator: "\n")
        #expect(lines.contains("[system units];\(frame) 1200000"), "\(lines.filter { !$0.contains("Outer") })")
        #expect(lines.contains { $0.hasPrefix("[uid 0]") }, "root's stall, cut at its writer's frame")
        #expect(lines.contains { $0.hasPrefix("[uid 65534];") })
    }

    /// The widths of the SVG's boxes whose tooltip is `label (…)`.
    static func boxWidths(_ svg: String, titled label: String) -> [Double] {
        svg.components(separatedBy: "<g><title>").dropFirst().compactMap { box in
            guard box.hasPrefix(label + " ("), let range = box.range(of: "width=\"") else { return nil }
            return Double(box[range.upperBound...].prefix { $0 != "\"" })
        }
    }

    /// An entry of `nobody` naming itself `nginx.service` printed in `follow` exactly as the unit's
    /// own line would. It is marked as `report` and the metrics mark it, with its writer's uid;
    /// the system unit's line is as it was, and `--json` carries `_UID`.
    @Test func followMarksAUsersEntryWithItsUid() throws {
        let journal = Journald.namespaced()
        defer { journal.remove() }
        try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
        let unit = "stallmon-follow-\(getpid()).service"
        defer { JournalWriters.removeSystemUnit(unit) }
        try JournalWriters.send(
            [
                Self.stall("nginx.service", fingerprint: 1).map {
                    $0.0 == "MESSAGE" ? ($0.0, "event loop of nginx stalled 2400 ms in timer callout") : $0
                }
            ], to: journal.socketPath, as: .nobody)
        try JournalWriters.send([Self.stall("real", fingerprint: 2)], to: journal.socketPath, as: .systemUnit(unit))
        try #require(journal.waitForEntries(2, messageIDs: [MessageID.stallEnded], timeout: 30))

        let follow = try Executable.stallmon.start(["follow", "--namespace", journal.name, "--lines", "5"])
        defer { if follow.process.isRunning { _ = follow.terminate() } }
        #expect(follow.waitForOutput { output, _ in output.split(separator: "\n").count >= 2 })
        let result = follow.terminate(signal: SIGINT)
        #expect(result.status == 0, "\(result.errors)")
        let lines = result.output.split(separator: "\n")
        let spoof = lines.first { $0.contains("event loop of nginx") }
        #expect(spoof?.contains(" (nginx.service) (uid 65534)[") == true, "\(lines)")
        #expect(!result.output.contains(" nginx.service["), "\(lines)")
        #expect(lines.contains { $0.contains(" \(unit)[") && !$0.contains("(uid") }, "\(lines)")

        let json = try Executable.stallmon.start(["follow", "--namespace", journal.name, "--lines", "5", "--json"])
        defer { if json.process.isRunning { _ = json.terminate() } }
        #expect(json.waitForOutput { output, _ in output.split(separator: "\n").count >= 2 })
        let objects = json.terminate(signal: SIGINT).output.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: String]
        }
        #expect(objects.first { $0["SYSLOG_IDENTIFIER"] == "nginx.service" }?["_UID"] == "65534", "\(objects)")
    }

    /// Identifiers, frames and a route holding ESC, BEL, CR, NUL, tab, DEL, the 8-bit CSI and
    /// U+202E reached `stallmon.prom` (and node_exporter's `/metrics`) as raw bytes. Every label
    /// value is now printable, each such character shown as `\u{1B}`.
    @Test func controlCharactersNeverReachTheTextfile() throws {
        try Self.withHostileTextfile { _, text in
            #expect(Self.controls(in: text).isEmpty, "\(Self.controls(in: text))")
            let shown = #"\\u{1B}[2J\\u{7}\\u{D}\\u{0}\\u{9}\\u{7F}\\u{9B}31m\\u{202E}\\u{2066}\\u{61C}"#
            #expect(text.contains(#"stallmon_stalls_total{unit="(evil\#(shown)) (uid 65534)"} 1"#), "\(text)")
            #expect(text.contains(#"frame="Evil.run\#(shown)() (Evil.swift:1)""#))
            #expect(text.contains(#"endpoint="GET /evil/\#(shown)""#))
            #expect(text.contains(#"stallmon_stalls_total{unit="(back\\\\u{1B}) (uid 65534)"} 1"#), "\(text)")
            #expect(text.contains(#"stallmon_stalls_total{unit="(back\\u{1B}) (uid 65534)"} 1"#))
            #expect(text.contains(#"stallmon_stalls_total{unit="(unit\\x2dname) (uid 65534)"} 1"#))
        }
    }

    /// The same textfile passes `promtool check metrics`, and node_exporter's textfile collector
    /// serves it without a scrape error and with no control byte.
    @Test(.requires(.promtool, .nodeExporter)) func theHostileTextfilePassesPromtoolAndNodeExportersScrape() throws {
        let promtool = try ExternalTool.required(.promtool)
        let exporter = try ExternalTool.required(.nodeExporter)
        try Self.withHostileTextfile { scratch, _ in
            let check = try ExternalTool.run("/bin/sh", ["-c", "\(promtool) check metrics < \(scratch.metrics)"])
            #expect(check.status == 0, "\(check.output)")
            try Self.scrape(scratch, with: exporter)
        }
    }

    /// Writes the hostile entries to a journal of their own, runs stallmond over it until the
    /// textfile has them, and hands `body` the daemon's directory and the textfile's text.
    static func withHostileTextfile(_ body: (Daemon, String) throws -> Void) throws {
        let journal = Journald.namespaced()
        defer { journal.remove() }
        try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
        let hostile = "\u{1b}[2J\u{07}\r\u{0}\t\u{7f}\u{9b}31m\u{202e}\u{2066}\u{061c}"
        let route = "/evil/\(hostile)"
        let request = StallRecord.Request(operation: "GET \(route)", method: "GET", route: route)
        var entries = [
            Self.stall("evil\(hostile)", fingerprint: 1, frame: "Evil.run\(hostile)() (Evil.swift:1)"),
            Entries.fields(of: Entries.requestRecord(request, identifier: "api"), overriding: [:]),
            // Backslashes that could read as escapes: a distinct series each.
            Self.stall("back\\u{1B}", fingerprint: 2), Self.stall("back\u{1b}", fingerprint: 3),
        ]
        entries.append(Self.stall("unit\\x2dname", fingerprint: 4))
        try JournalWriters.send(entries, to: journal.socketPath, as: .nobody)
        try #require(journal.waitForEntries(entries.count, messageIDs: [MessageID.stallEnded], timeout: 30))

        let scratch = try Daemon(journal: try #require(journal.directory))
        defer { scratch.remove() }
        let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
        defer { if daemon.process.isRunning { _ = daemon.terminate() } }
        #expect(scratch.wait(#"stallmon_stalls_total{unit="(api) (uid 65534)"}"#, toBe: 1), "\(scratch.text)")
        #expect(daemon.terminate().status == 0)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: scratch.metrics))
        try body(scratch, String(decoding: bytes, as: UTF8.self))
    }

    /// The characters of `text` that no label value may hold, as code points: below U+0020 (but
    /// newline, between lines, and tab), U+007F to U+009F, and the bidirectional controls.
    static func controls(in text: String) -> [String] {
        text.unicodeScalars.filter { scalar in
            switch scalar.value {
            case 0x0A, 0x09: false
            case 0x00...0x1F, 0x7F...0x9F, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
            default: false
            }
        }.map { "U+\(String($0.value, radix: 16))" }
    }

    /// node_exporter's textfile collector reads the file; its `/metrics` has the series, no scrape
    /// error and no control character.
    static func scrape(_ scratch: Daemon, with exporter: String) throws {
        let port = 19_000 + Int(getpid() % 1000)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: exporter)
        process.arguments = [
            "--collector.disable-defaults", "--collector.textfile",
            "--collector.textfile.directory=\(scratch.directory)", "--web.listen-address=127.0.0.1:\(port)",
        ]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        var body = ""
        let deadline = Date(timeIntervalSinceNow: 20)
        while Date() < deadline {
            let scrape = try ExternalTool.run(
                "/usr/bin/curl", ["-sf", "http://127.0.0.1:\(port)/metrics"], timeout: 10)
            if scrape.status == 0, scrape.output.contains("stallmon_stalls_total") {
                body = scrape.output
                break
            }
            usleep(200_000)
        }
        #expect(body.contains(#"stallmon_stalls_total{unit="(evil\\u{1B}[2J"#), "\(body.prefix(4000))")
        #expect(body.contains("node_textfile_scrape_error 0"), "\(body.prefix(4000))")
        #expect(controls(in: body).isEmpty, "\(controls(in: body))")
    }

    /// All-zero trace and span IDs (W3C Trace Context calls them invalid) were taken as IDs. They
    /// are malformed, as any other bad ID: `report` names them and exits 65, and stallmond counts
    /// them in `stallmond_malformed_entries_total` and counts the well-formed stall.
    @Test func allZeroTraceAndSpanIDsAreMalformed() throws {
        let journal = Journald.namespaced()
        defer { journal.remove() }
        try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
        let record = Entries.requestRecord(Entries.users)
        let zeroTrace = String(repeating: "0", count: 32)
        let zeroSpan = String(repeating: "0", count: 16)
        try JournalWriters.send(
            [
                Entries.fields(of: record, overriding: [:]),
                Entries.fields(of: record, overriding: ["STALL_TRACE_ID": zeroTrace]),
                Entries.fields(of: record, overriding: ["STALL_SPAN_ID": zeroSpan]),
            ], to: journal.socketPath, as: .nobody)
        try #require(journal.waitForEntries(3, messageIDs: [MessageID.stallEnded], timeout: 30))

        let report = try Executable.stallmon.run(["report", "--namespace", journal.name, "--by", "route"])
        #expect(report.status == 65, "\(report.output)\(report.errors)")
        #expect(report.errors.contains(#"field STALL_TRACE_ID="\#(zeroTrace)": all zero"#), "\(report.errors)")
        #expect(report.errors.contains(#"field STALL_SPAN_ID="\#(zeroSpan)": all zero"#), "\(report.errors)")
        #expect(report.errors.contains("2 malformed entries skipped"))
        #expect(report.output.contains("GET /users/:id"), "the well-formed stall still counts")

        let scratch = try Daemon(journal: try #require(journal.directory))
        defer { scratch.remove() }
        let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
        defer { if daemon.process.isRunning { _ = daemon.terminate() } }
        #expect(scratch.wait(#"stallmon_stalls_total{unit="(api) (uid 65534)"}"#, toBe: 1), "\(scratch.text)")
        #expect(scratch.wait("stallmond_malformed_entries_total", toBe: 2), "\(scratch.text)")
        #expect(daemon.terminate().status == 0)
    }
}
