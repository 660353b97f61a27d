import Foundation
import StallJournal
import Testing

@testable import StallMonitor

/// The journal schema: one definition, written and read back the same.
struct SchemaTests {
    static func report(event: StallReport.Event = .ended, stack: [StallFrame]? = nil) -> StallReport {
        StallReport(
            event: event, stallID: "0123456789abcdef0123456789abcdef", loop: "main", threadID: 42,
            duration: .milliseconds(312), threshold: .milliseconds(250), activity: .afterWaiting,
            runLoopMode: "kCFRunLoopDefaultMode", callout: .timer, threadState: "R", syscall: nil, waitChannel: nil,
            cpuTime: .milliseconds(300), samples: 15, unansweredSamples: 0, stackSamples: 14,
            stack: stack ?? [
                StallFrame(
                    address: 0x1000, image: "/usr/bin/service", symbol: "Service.Service.refresh() -> ()",
                    function: "Service.refresh()", offset: 12, file: "/src/Service.swift", line: 42),
                StallFrame(
                    address: 0x2000, image: "/usr/lib/libFoundation.so",
                    symbol: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__",
                    function: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__"),
            ],
            fingerprint: "00000000deadbeef", noStackReason: nil, startNanoseconds: 1, pausedTime: .zero
        )
    }

    @Test func everyFieldNameIsOneJournaldKeeps() {
        let events: [StallMonitorEvent] = [
            .stallDetected(Self.report(event: .detected)), .stallEnded(Self.report()),
            .suppressed(
                SuppressionReport(
                    loop: "main", threadID: 1, fingerprint: "f", frame: "x", count: 3, totalDuration: .seconds(1),
                    worstDuration: .milliseconds(400), burst: 5, interval: .seconds(60))),
            .started(MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: 60)),
            .stopped(
                MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: nil),
                .init(stalls: 1, suppressedReports: 0, droppedReports: 0)),
        ]
        for event in events {
            for field in JournalSink.fields(for: event, syslogIdentifier: "svc") {
                #expect(JournalField.isValidName(field.name), "\(field.name)")
            }
        }
        #expect(!JournalField.isValidName("_PRIVATE"))
        #expect(!JournalField.isValidName("1ABC"))
        #expect(!JournalField.isValidName("stall_id"))
        #expect(!JournalField.isValidName(String(repeating: "A", count: 65)))
        #expect(JournalField.isValidName(String(repeating: "A", count: 64)))
    }

    @Test func stallRecordRoundTrips() throws {
        let fields = JournalSink.fields(for: .stallEnded(Self.report()), syslogIdentifier: "svc")
        var dictionary: [String: String] = [:]
        for field in fields { dictionary[field.name] = field.value }
        let record = try StallRecord(journalFields: dictionary)
        #expect(record.fields == fields)
        #expect(
            record.message
                == "main run loop stalled 312 ms in timer callout at Service.refresh() (Service.swift:42); 96% on CPU")
        #expect(record.frame == "Service.refresh() (Service.swift:42)")
        #expect(record.messageID == MessageID.stallEnded)
    }

    @Test func decodingNamesTheBrokenField() {
        var dictionary: [String: String] = [:]
        for field in JournalSink.fields(for: .stallEnded(Self.report()), syslogIdentifier: "svc") {
            dictionary[field.name] = field.value
        }
        dictionary["STALL_DURATION_USEC"] = "soon"
        #expect(
            throws: JournalDecodingError(field: "STALL_DURATION_USEC", value: "soon", reason: "not an integer in range")
        ) {
            try StallRecord(journalFields: dictionary)
        }
        dictionary.removeValue(forKey: "STALL_ID")
        dictionary["STALL_DURATION_USEC"] = "1"
        #expect(throws: JournalDecodingError(field: "STALL_ID", value: nil, reason: "missing")) {
            try StallRecord(journalFields: dictionary)
        }
    }

    @Test func backtraceIsCutAtALineToFitFourKilobytes() {
        let frames = (0..<200).map { index in
            StallFrame(
                address: UInt(0x5555_0000 + index), image: "/usr/bin/service", symbol: "s",
                function: "Module.Type.function\(index)(argument:other:)", file: "/src/File.swift", line: index + 1)
        }
        let fields = JournalSink.fields(for: .stallEnded(Self.report(stack: frames)), syslogIdentifier: "svc")
        let backtrace = fields.first { $0.name == "STALL_BACKTRACE" }!.value
        #expect(backtrace.utf8.count <= 4096)
        #expect(backtrace.hasSuffix("…"))
        #expect(backtrace.hasPrefix("#0 0x55550000 Module.Type.function0(argument:other:)"))
        #expect(!backtrace.contains("function199"))
    }

    @Test func fingerprintIgnoresAddressesAndStartsAtTheCulprit() {
        let a = Self.report().stack
        var b = a
        b[0].address = 0x9999  // another address-space layout
        b[0].offset = 99
        #expect(StallReport.fingerprint(of: a) == StallReport.fingerprint(of: b))
        var c = a
        c[0].symbol = "Service.Service.other() -> ()"
        #expect(StallReport.fingerprint(of: a) != StallReport.fingerprint(of: c))
        // Library frames above the culprit do not change it.
        let library = StallFrame(address: 1, image: "/lib/x86_64-linux-gnu/libc.so.6", symbol: "__poll")
        #expect(StallReport.fingerprint(of: [library] + a) == StallReport.fingerprint(of: a))
    }

    @Test func calloutIsRecognizedFromTheInnermostRunLoopFrame() {
        func frame(_ symbol: String) -> StallFrame { StallFrame(address: 1, symbol: symbol) }
        #expect(
            StallReport.Callout.recognize([
                frame("f"), frame("__CFRUNLOOP_IS_SERVICING_THE_MAIN_DISPATCH_QUEUE__"),
                frame("__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__"),
            ]) == .mainQueue)
        #expect(
            StallReport.Callout.recognize([frame("__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE1_PERFORM_FUNCTION__")])
                == .source1)
        #expect(StallReport.Callout.recognize([frame("main")]) == .unknown)
    }

    @Test func rateLimiterAdmitsABurstThenSummarizes() {
        var limiter = RateLimiter(burst: 2, interval: 1_000)
        let admitted0 = limiter.admit("a", frame: "f", now: 0)
        #expect(admitted0)
        let admitted10 = limiter.admit("a", frame: "f", now: 10)
        #expect(admitted10)
        let admitted20 = limiter.admit("a", frame: "f", now: 20)
        #expect(!admitted20)
        limiter.recordSuppressed("a", duration: 300)
        let admitted30 = limiter.admit("a", frame: "f", now: 30)
        #expect(!admitted30)
        limiter.recordSuppressed("a", duration: 500)
        let admitted40 = limiter.admit("b", frame: "g", now: 40)
        #expect(admitted40)
        #expect(limiter.nextExpiry == 1_000)
        #expect(limiter.takeSummaries(now: 999, all: false).isEmpty)
        let summaries = limiter.takeSummaries(now: 1_000, all: false)
        #expect(summaries.count == 1)
        #expect(summaries.first?.suppressed == 2)
        #expect(summaries.first?.totalDuration == 800)
        #expect(summaries.first?.worstDuration == 500)
        let admittedAgain = limiter.admit("a", frame: "f", now: 1_001)
        #expect(admittedAgain)
    }
}
