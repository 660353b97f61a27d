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
}
