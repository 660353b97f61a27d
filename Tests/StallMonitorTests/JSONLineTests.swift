import Foundation
import StallJournal
import Testing

@testable import StallMonitor

/// Reports as one JSON object a line, for a container's log collector: the journal entry's fields
/// and values, within Docker's 16 KiB a line.
struct JSONLineTests {
    /// 2026-11-27T05:23:45.123456Z
    static let time = (seconds: 1_795_757_025, nanoseconds: 123_456_789)

    static func traced(_ report: StallReport) -> StallReport {
        var report = report
        report.request = StallRecord.Request(
            operation: "GET /users/:id", method: "GET", route: "/users/:id",
            traceID: "4bf92f3577b34da6a3ce929d0e0e4736", spanID: "00f067aa0ba902b7")
        return report
    }

    static func object(_ line: [UInt8]) throws -> [String: Any] {
        try #require(JSONSerialization.jsonObject(with: Data(line)) as? [String: Any])
    }

    @Test func aStallIsOneLineWithEveryJournalFieldAndItsValue() throws {
        let event = StallMonitorEvent.stallEnded(Self.traced(Reports.report()))
        let fields = JournalSink.fields(for: event, syslogIdentifier: "svc")
        let line = JSONLine.encode(fields, time: Self.time)
        #expect(line.last == UInt8(ascii: "\n"))
        #expect(line.filter { $0 == UInt8(ascii: "\n") }.count == 1, "one line")
        let object = try Self.object(line)
        #expect(object["time"] as? String == "2026-11-27T05:23:45.123456Z")
        #expect(object["level"] as? String == "warning")
        #expect(object["message"] as? String == fields.first { $0.name == "MESSAGE" }?.value)
        #expect(object["MESSAGE"] == nil)
        for field in fields where field.name != "MESSAGE" {
            #expect(object[field.name] as? String == field.value, "\(field.name)")
        }
        #expect(object.count == fields.count + 2, "\(object.keys.sorted())")
        #expect(object["STALL_TRACE_ID"] as? String == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(object["STALL_REQUEST_ROUTE"] as? String == "/users/:id")
        // The journal's own decoder reads it, `message` read as `MESSAGE`.
        var dictionary = object.compactMapValues { $0 as? String }
        dictionary["MESSAGE"] = dictionary.removeValue(forKey: "message")
        let record = try StallRecord(journalFields: dictionary)
        #expect(record.fields == fields)
    }

    @Test(arguments: [
        (StallMonitorEvent.stallDetected(Reports.report(event: .detected)), "warning"),
        (.watchdogStall(Reports.report(event: .watchdog)), "crit"),
        (
            .suppressed(
                SuppressionReport(
                    loop: "main", threadID: 1, fingerprint: "f", frame: "x", count: 3, totalDuration: .seconds(1),
                    worstDuration: .milliseconds(400), burst: 5, interval: .seconds(60))), "notice"
        ),
        (.started(MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: 60)), "info"),
    ])
    func theLevelIsSyslogsNameOfThePriority(event: StallMonitorEvent, level: String) throws {
        let fields = JournalSink.fields(for: event, syslogIdentifier: "svc")
        let object = try Self.object(JSONLine.encode(fields, time: Self.time))
        #expect(object["level"] as? String == level)
        #expect(object["PRIORITY"] as? String == fields.first { $0.name == "PRIORITY" }?.value)
    }

    @Test func anEightTimesThresholdStallIsAnError() throws {
        var report = Reports.report()
        report.duration = report.threshold * 8
        let object = try Self.object(
            JSONLine.encode(JournalSink.fields(for: .stallEnded(report), syslogIdentifier: "s"), time: Self.time))
        #expect(object["level"] as? String == "err")
    }

    /// A frame of `length` bytes of name, ending in its index.
    static func frame(_ index: Int, name: String) -> StallFrame {
        StallFrame(
            address: UInt(0x1000 + index * 16), image: "/usr/bin/service", symbol: name, function: name, offset: 4,
            file: "/src/Recursion.swift", line: index + 1)
    }

    @Test func aHundredFrameStackIsOneLineWithinTheLimit() throws {
        let frames = (0..<100).map {
            Self.frame($0, name: "Service.Recursion.descend(depth: Swift.Int, into: [Swift.String]) -> () #\($0)")
        }
        var report = Self.traced(Reports.report(stack: frames))
        report.sampledStacks = [
            SampledStack(frames: frames, count: 10), SampledStack(frames: Array(frames.dropFirst()), count: 5),
        ]
        let fields = JournalSink.fields(for: .stallEnded(report), syslogIdentifier: "svc")
        let line = JSONLine.encode(fields, time: Self.time)
        #expect(line.count <= JSONLine.maximumBytes)
        #expect(line.filter { $0 == UInt8(ascii: "\n") }.count == 1)
        let object = try Self.object(line)
        // The journal's fields are bounded already (4 KiB a backtrace): nothing more is cut.
        #expect(object[JSONLine.truncatedKey] == nil)
        #expect(object["STALL_BACKTRACE"] as? String == fields.first { $0.name == "STALL_BACKTRACE" }?.value)
        #expect(object["STALL_STACKS"] != nil)
    }

    /// Control characters in symbols (a hostile or broken binary) take six bytes each in JSON: the
    /// line is cut to fit, stacks first, then the backtrace at a frame, and says so.
    @Test func aLineOverTheLimitIsCutAndNamesWhatWasCut() throws {
        let hostile = String(repeating: "\u{1}", count: 200)
        let frames = (0..<100).map { Self.frame($0, name: "f\($0)" + hostile) }
        var report = Reports.report(stack: frames)
        report.sampledStacks = [SampledStack(frames: frames, count: 10)]
        let fields = JournalSink.fields(for: .stallEnded(report), syslogIdentifier: "svc")
        let uncut = fields.reduce(0) { $0 + JSONLine.escapedCount($1.value) }
        #expect(uncut > JSONLine.maximumBytes, "the test's line must need cutting")
        let line = JSONLine.encode(fields, time: Self.time)
        #expect(line.count <= JSONLine.maximumBytes)
        #expect(line.filter { $0 == UInt8(ascii: "\n") }.count == 1)
        let object = try Self.object(line)
        let truncated = try #require(object[JSONLine.truncatedKey] as? String)
        #expect(truncated.split(separator: ",").contains("STALL_STACKS"), "\(truncated)")
        #expect(object["STALL_STACKS"] == nil)
        let backtrace = try #require(object["STALL_BACKTRACE"] as? String)
        #expect(truncated.split(separator: ",").contains("STALL_BACKTRACE"))
        #expect(backtrace.hasSuffix(FieldLimits.truncationMarker) && backtrace.hasPrefix("#0 "))
        #expect(backtrace.split(separator: "\n").count < 100)
        // What is not cut is whole.
        #expect(object["message"] as? String == fields.first { $0.name == "MESSAGE" }?.value)
        #expect(object["STALL_ID"] as? String == report.stallID)
    }

    @Test func valuesAreEscapedAsJSONStrings() throws {
        var line: [UInt8] = []
        JSONLine.appendEscaped("a\"b\\c\nd\te\u{1}f\u{7f}é", to: &line)
        #expect(String(decoding: line, as: UTF8.self) == "a\\\"b\\\\c\\nd\\te\\u0001f\u{7f}é")
        #expect(JSONLine.escapedCount("a\"b\\c\nd\te\u{1}f\u{7f}é") == line.count)
    }
}
