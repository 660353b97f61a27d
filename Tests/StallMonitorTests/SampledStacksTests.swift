import Foundation
import StallJournal
import Testing

@testable import StallMonitor

/// `STALL_STACKS`: every distinct sampled stack with its count, in one journal field of at most
/// 4 KiB that refers to the backtrace's lines.
struct SampledStacksTests {
    static let refresh = StallFrame(
        address: 0x1000, image: "/usr/bin/service", symbol: "Service.Service.refresh() -> ()",
        function: "Service.refresh()", offset: 12, file: "/src/Service.swift", line: 42)
    static let timer = StallFrame(
        address: 0x2000, image: "/usr/lib/libFoundation.so",
        symbol: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__",
        function: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__")
    static let runLoop = StallFrame(
        address: 0x2100, image: "/usr/lib/libFoundation.so", symbol: "CFRunLoopRunSpecific",
        function: "CFRunLoopRunSpecific", offset: 300)
    static let memcpy = StallFrame(
        address: 0x7f00_0000_3000, image: "/lib/x86_64-linux-gnu/libc.so.6", symbol: "memcpy", function: "memcpy",
        offset: 40)
    static let parse = StallFrame(
        address: 0x1100, image: "/usr/bin/service", symbol: "Service.parse()", function: "Service.parse()",
        offset: 8, file: "/src/Parser.swift", line: 7)

    static func record(_ report: StallReport) throws -> (StallRecord, [JournalField]) {
        let fields = JournalSink.fields(for: .stallEnded(report), syslogIdentifier: "svc")
        var dictionary: [String: String] = [:]
        for field in fields { dictionary[field.name] = field.value }
        return (try StallRecord(journalFields: dictionary), fields)
    }

    @Test func distinctStacksAreWrittenAgainstTheBacktraceAndReadBackEqual() throws {
        var report = Reports.report(stack: [Self.refresh, Self.timer, Self.runLoop])
        report.sampledStacks = [
            SampledStack(frames: [Self.memcpy, Self.parse, Self.refresh, Self.timer, Self.runLoop], count: 3),
            SampledStack(frames: [Self.refresh, Self.timer, Self.runLoop], count: 11),
            SampledStack(frames: [Self.parse, Self.refresh, Self.timer, Self.runLoop], count: 1),
        ]
        let (record, fields) = try Self.record(report)
        let value = try #require(fields.first { $0.name == "STALL_STACKS" }?.value)
        // The heaviest stack is the backtrace's three lines; the others define two more frames.
        #expect(
            value
                == "=memcpy\n=Service.parse() at Parser.swift:7\n0-2 11\n3,4,0-2 3\n4,0-2 1")
        #expect(record.fields == fields)
        #expect(record.sampledStacks.stacks.map(\.count) == [11, 3, 1])
        let resolved = record.resolvedStacks
        #expect(resolved.map(\.count) == [11, 3, 1])
        let defined = ["memcpy", "Service.parse() at Parser.swift:7"]
        let backtrace = [Self.refresh, Self.timer, Self.runLoop].map(\.backtraceLine)
        #expect(resolved[0].frames == backtrace)
        #expect(resolved[1].frames == defined + backtrace)
        #expect(resolved[2].frames == defined.suffix(1) + backtrace)
    }

    @Test func anEntryWithoutTheFieldGivesItsBacktraceAsTheOneStack() throws {
        let (record, fields) = try Self.record(Reports.report())
        #expect(!fields.contains { $0.name == "STALL_STACKS" })
        #expect(record.sampledStacks.isEmpty)
        #expect(record.resolvedStacks.count == 1)
        #expect(record.resolvedStacks[0].frames == [Self.refresh.backtraceLine, Self.timer.backtraceLine])
        #expect(record.resolvedStacks[0].count == 14)
    }

    /// 300 stacks of 20 frames of their own each would take ~400 KiB: the field keeps the heaviest
    /// that fit in 4 KiB and counts the samples of the rest, and still reads back equal.
    @Test func fieldStaysWithinFourKiBAndCountsWhatDidNotFit() throws {
        var report = Reports.report(stack: [Self.refresh, Self.timer])
        report.sampledStacks = (0..<300).map { index in
            SampledStack(
                frames: (0..<20).map { depth in
                    StallFrame(
                        address: UInt(0x10_0000 + index * 64 + depth), image: "/usr/bin/service",
                        symbol: "Service.generated\(index)_\(depth)()",
                        function: "Service.generated\(index)_\(depth)()",
                        offset: 4, file: "/src/Generated.swift", line: depth + 1)
                } + [Self.refresh, Self.timer],
                count: 300 - index)
        }
        let (record, fields) = try Self.record(report)
        let value = try #require(fields.first { $0.name == "STALL_STACKS" }?.value)
        #expect(value.utf8.count <= 4096)
        #expect(value.utf8.count > 4096 - 900)  // full: one more stack of its own takes ~900 bytes
        #expect(record.fields == fields)
        let kept = record.sampledStacks.stacks
        #expect(kept.count == 4)
        #expect(kept.first?.count == 300)
        #expect(record.sampledStacks.omittedSamples > 0)
        #expect(record.sampledStacks.totalSamples == (1...300).reduce(0, +))
        #expect(record.resolvedStacks.last?.frames == ["(stacks not recorded)"])
    }

    /// A backtrace cut at 4 KiB keeps its first lines: frames past the cut are defined in the field.
    @Test func framesPastACutBacktraceAreDefinedInTheField() throws {
        let deep = (0..<120).map { depth in
            StallFrame(
                address: UInt(0x5000 + depth), image: "/usr/bin/service",
                symbol: "Service.recursion\(depth)()", function: "Service.recursion\(depth)()", offset: 4,
                file: "/src/Recursion.swift", line: depth + 1)
        }
        var report = Reports.report(stack: deep)
        report.sampledStacks = [SampledStack(frames: deep, count: 5)]
        let (record, fields) = try Self.record(report)
        #expect(record.fields == fields)
        #expect(record.backtrace.hasSuffix("…"))
        #expect(!record.sampledStacks.frames.isEmpty)
        let kept = record.backtrace.split(separator: "\n").count - 1  // less the "…" line
        #expect(kept > 10 && kept < 120)
        #expect(
            record.resolvedStacks.first?.frames
                == deep.prefix(kept).map(\.backtraceLine) + deep.dropFirst(kept).map(\.stackDefinition))
        #expect(record.sampledStacks.frames.first == "Service.recursion\(kept)() at Recursion.swift:\(kept + 1)")
    }

    @Test(arguments: [
        ("0-9 3", "frame 9 is not in the backtrace's 2 lines or the 0 frames defined"),
        ("0,1", "not '<frames> <count>'"),
        ("0 0", "not '<frames> <count>'"),
        ("0 4294967296", "not '<frames> <count>'"),
        ("1-0 2", "'1-0' is not a frame number or range"),
        ("0,,1 2", "'' is not a frame number or range"),
        ("-1 2", "'-1' is not a frame number or range"),
        ("0 1\n* 2\n* 3", "not one '* <count>' line"),
        ("=\n0 1", "a frame must be 1 to 1024 bytes"),
    ])
    func malformedFieldIsNamedWithItsLine(value: String, reason: String) throws {
        var dictionary: [String: String] = [:]
        for field in JournalSink.fields(for: .stallEnded(Reports.report()), syslogIdentifier: "svc") {
            dictionary[field.name] = field.value
        }
        dictionary["STALL_STACKS"] = value
        #expect {
            try StallRecord(journalFields: dictionary)
        } throws: { error in
            let error = error as? JournalDecodingError
            return error?.field == "STALL_STACKS" && error?.reason == reason
        }
    }

    @Test func rangesCannotMakeAFieldExpensive() {
        #expect {
            try SampledStacks(decoding: "0-1024 1", backtraceLineCount: 2000)
        } throws: { ($0 as? JournalDecodingError)?.reason == "more than 1024 frames" }
        // 70 lines of `0-1000 1` (under 1 KiB) would name 70,070 frames.
        #expect {
            try SampledStacks(
                decoding: Array(repeating: "0-1000 1", count: 70).joined(separator: "\n"), backtraceLineCount: 2000)
        } throws: { ($0 as? JournalDecodingError)?.reason == "more than 65536 frames in all" }
    }
}
