import Foundation
import StallJournal
import Testing

@testable import StallMonitor

/// The journal schema: one definition, written and read back the same.
struct SchemaTests {
    @Test func everyFieldNameIsOneJournaldKeeps() {
        let events: [StallMonitorEvent] = [
            .stallDetected(Reports.report(event: .detected)), .stallEnded(Reports.report()),
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
        let fields = JournalSink.fields(for: .stallEnded(Reports.report()), syslogIdentifier: "svc")
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
        for field in JournalSink.fields(for: .stallEnded(Reports.report()), syslogIdentifier: "svc") {
            dictionary[field.name] = field.value
        }
        dictionary["STALL_DURATION_USEC"] = "soon"
        #expect(
            throws: JournalDecodingError(field: "STALL_DURATION_USEC", value: "soon", reason: "not an integer")
        ) {
            try StallRecord(journalFields: dictionary)
        }
        dictionary.removeValue(forKey: "STALL_ID")
        dictionary["STALL_DURATION_USEC"] = "1"
        #expect(throws: JournalDecodingError(field: "STALL_ID", value: nil, reason: "missing")) {
            try StallRecord(journalFields: dictionary)
        }
    }

    static func endedFields() -> [String: String] {
        var dictionary: [String: String] = [:]
        for field in JournalSink.fields(for: .stallEnded(Reports.report()), syslogIdentifier: "svc") {
            dictionary[field.name] = field.value
        }
        return dictionary
    }

    static func suppressionFields() -> [String: String] {
        let summary = SuppressionReport(
            loop: "main", threadID: 7, fingerprint: "00000000deadbeef", frame: "Service.refresh()", count: 3,
            totalDuration: .seconds(1), worstDuration: .milliseconds(400), burst: 5, interval: .seconds(60))
        var dictionary: [String: String] = [:]
        for field in JournalSink.fields(for: .suppressed(summary), syslogIdentifier: "svc") {
            dictionary[field.name] = field.value
        }
        return dictionary
    }

    /// Decodes `fields` with `field` set to `value`; the error, or nil when it decoded.
    static func decodingError(
        _ fields: [String: String], _ field: String, _ value: String,
        decode: ([String: String]) throws(JournalDecodingError) -> Void
    ) -> JournalDecodingError? {
        var fields = fields
        fields[field] = value
        do {
            try decode(fields)
            return nil
        } catch {
            return error
        }
    }

    @Test func numbersOutsideTheirBoundsMakeTheEntryMalformed() {
        let year = String(FieldLimits.maximumMicroseconds)
        let pastYear = String(FieldLimits.maximumMicroseconds + 1)
        let stall: [String: [String]] = [
            "STALL_DURATION_USEC": ["-1", pastYear, "9223372036854775807", "18446744073709551616"],
            "STALL_CPU_USEC": ["-1", pastYear],
            "STALL_THRESHOLD_USEC": ["-250000", pastYear],
            "STALL_WATCHDOG_USEC": ["-1", pastYear],
            "STALL_SAMPLES": ["-1000", "4294967296", "9223372036854775807"],
            "STALL_SAMPLES_UNANSWERED": ["-1"],
            "STALL_STACK_SAMPLES": ["-1", "4294967296"],
            "STALL_THREAD_TID": ["0", "-1", "4194305"],
            "PRIORITY": ["-1", "8", "99"],
        ]
        let ended = Self.endedFields()
        for (field, values) in stall {
            for value in values {
                let error = Self.decodingError(ended, field, value) { fields throws(JournalDecodingError) in
                    _ = try StallRecord(journalFields: fields)
                }
                #expect(error?.field == field, "\(field)=\(value) decoded")
                #expect(error?.value == value)
                #expect(error?.description.contains("field \(field)=\"\(value)\"") == true)
            }
        }
        let suppression: [String: [String]] = [
            "STALL_SUPPRESSED_COUNT": ["-1000", "9223372036854775807", "4294967296"],
            "STALL_SUPPRESSED_TOTAL_USEC": ["-1", pastYear],
            "STALL_SUPPRESSED_WORST_USEC": ["-1", pastYear],
            "STALL_RATE_LIMIT_BURST": ["-5"],
            "STALL_RATE_LIMIT_INTERVAL_USEC": ["-1", pastYear],
            "STALL_THREAD_TID": ["0"],
        ]
        let suppressed = Self.suppressionFields()
        for (field, values) in suppression {
            for value in values {
                let error = Self.decodingError(suppressed, field, value) { fields throws(JournalDecodingError) in
                    _ = try SuppressionRecord(journalFields: fields)
                }
                #expect(error?.field == field, "\(field)=\(value) decoded")
            }
        }
        // The bounds themselves are accepted.
        #expect(
            Self.decodingError(ended, "STALL_DURATION_USEC", year) { fields throws(JournalDecodingError) in
                _ = try StallRecord(journalFields: fields)
            } == nil)
        #expect(
            Self.decodingError(suppressed, "STALL_SUPPRESSED_COUNT", "4294967295") {
                fields throws(JournalDecodingError) in
                _ = try SuppressionRecord(journalFields: fields)
            } == nil)
    }

    @Test func fingerprintAndStallIDMustBeLowercaseHexOfTheirLength() {
        let ended = Self.endedFields()
        for value in ["00000000DEADBEEF", "00000000deadbee", "00000000deadbeef0", "00000000deadbeeg", "", "other"] {
            let error = Self.decodingError(ended, "STALL_FINGERPRINT", value) { fields throws(JournalDecodingError) in
                _ = try StallRecord(journalFields: fields)
            }
            #expect(
                error
                    == JournalDecodingError(
                        field: "STALL_FINGERPRINT", value: value, reason: "not 16 lowercase hex digits"))
        }
        let suppression = Self.decodingError(Self.suppressionFields(), "STALL_FINGERPRINT", "x") {
            fields throws(JournalDecodingError) in _ = try SuppressionRecord(journalFields: fields)
        }
        #expect(suppression?.field == "STALL_FINGERPRINT")
        for value in ["0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef", "0123456789abcdef0123456789abcdez"] {
            let error = Self.decodingError(ended, "STALL_ID", value) { fields throws(JournalDecodingError) in
                _ = try StallRecord(journalFields: fields)
            }
            #expect(
                error == JournalDecodingError(field: "STALL_ID", value: value, reason: "not 32 lowercase hex digits"))
        }
        let event = Self.decodingError(ended, "STALL_EVENT", "detected") { fields throws(JournalDecodingError) in
            _ = try StallRecord(journalFields: fields)
        }
        #expect(event?.field == "STALL_EVENT")
    }

    @Test func overLongStringsMakeTheEntryMalformedButNamesAreCut() throws {
        let ended = Self.endedFields()
        let limits: [String: Int] = [
            "MESSAGE": FieldLimits.messageBytes, "STALL_FRAME": FieldLimits.frameBytes,
            "STALL_BACKTRACE": FieldLimits.backtraceBytes, "STALL_LOOP": FieldLimits.nameBytes,
            "STALL_RUNLOOP_MODE": FieldLimits.nameBytes, "STALL_ACTIVITY": FieldLimits.keywordBytes,
            "STALL_CALLOUT": FieldLimits.keywordBytes, "STALL_THREAD_STATE": FieldLimits.keywordBytes,
            "STALL_THREAD_SYSCALL": FieldLimits.keywordBytes, "STALL_THREAD_WCHAN": FieldLimits.waitChannelBytes,
        ]
        for (field, limit) in limits {
            let fits = Self.decodingError(ended, field, String(repeating: "é", count: limit / 2)) {
                fields throws(JournalDecodingError) in _ = try StallRecord(journalFields: fields)
            }
            #expect(fits == nil, "\(field) at its limit rejected")
            let error = Self.decodingError(ended, field, String(repeating: "x", count: limit + 1)) {
                fields throws(JournalDecodingError) in _ = try StallRecord(journalFields: fields)
            }
            #expect(error?.field == field)
            #expect(error?.reason == "\(limit + 1) bytes long, longer than the \(limit) allowed")
            // The error shows 80 characters of the value, not all of it.
            #expect((error?.description.utf8.count ?? .max) < 200)
        }
        var fields = ended
        fields["SYSLOG_IDENTIFIER"] = String(repeating: "A", count: 100_000)
        let record = try StallRecord(journalFields: fields)
        #expect(record.syslogIdentifier.utf8.count <= FieldLimits.identifierBytes)
        #expect(record.syslogIdentifier.hasSuffix("…"))
        #expect(record.syslogIdentifier.hasPrefix(String(repeating: "A", count: 200)))
    }

    @Test func writersClampEveryFieldToWhatReadersAccept() throws {
        var report = Reports.report()
        report.duration = .seconds(400 * 86_400)
        report.samples = Int.max
        report.runLoopMode = String(repeating: "m", count: 10_000)
        let frames = [
            StallFrame(
                address: 0x1000, image: "/usr/bin/service", symbol: "s",
                function: "Service." + String(repeating: "ü", count: 50_000) + "()", offset: 1,
                file: "/src/Service.swift", line: 1)
        ]
        report.stack = frames
        let huge = String(repeating: "I", count: 100_000)
        let fields = JournalSink.fields(for: .stallEnded(report), syslogIdentifier: huge)
        var dictionary: [String: String] = [:]
        for field in fields { dictionary[field.name] = field.value }
        #expect((dictionary["STALL_FRAME"]?.utf8.count ?? .max) <= FieldLimits.frameBytes)
        #expect(dictionary["STALL_FRAME"]?.hasSuffix("…") == true)
        #expect((dictionary["MESSAGE"]?.utf8.count ?? .max) <= FieldLimits.messageBytes)
        #expect((dictionary["SYSLOG_IDENTIFIER"]?.utf8.count ?? .max) <= FieldLimits.identifierBytes)
        #expect(dictionary["STALL_DURATION_USEC"] == String(FieldLimits.maximumMicroseconds))
        #expect(dictionary["STALL_SAMPLES"] == String(FieldLimits.maximumCount))
        // What the writer sends, every reader accepts.
        _ = try StallRecord(journalFields: dictionary)

        // The writer itself refuses what no reader would accept.
        #expect(throws: JournalDecodingError.self) {
            try JournalWriter(socketPath: "/nonexistent").send([
                JournalField("MESSAGE", "x"), JournalField("SYSLOG_IDENTIFIER", huge),
            ])
        }
        #expect(throws: JournalDecodingError.self) {
            try JournalWriter(socketPath: "/nonexistent").send([
                JournalField("MESSAGE", String(repeating: "x", count: FieldLimits.readBytes + 1))
            ])
        }
    }

    @Test func controlCharactersAreShownAsVisibleEscapes() {
        #expect(
            DisplayText.escaped("plain Service.refresh() (Service.swift:42)")
                == "plain Service.refresh() (Service.swift:42)")
        #expect(DisplayText.escaped("a\u{1b}[2Jb") == "a\\x1b[2Jb")
        #expect(DisplayText.escaped("\u{1b}]0;title\u{07}") == "\\x1b]0;title\\x07")
        #expect(DisplayText.escaped("\u{9b}31m\u{9d}x\u{7f}") == "\\u009b31m\\u009dx\\x7f")
        #expect(DisplayText.escaped("line\nbreak\ttab\r\u{0}") == "line\\x0abreak\\x09tab\\x0d\\x00")
        #expect(DisplayText.escaped("\u{202e}evil") == "\\u202eevil")
        #expect(DisplayText.escaped("back\\slash") == "back\\\\slash")
        #expect(DisplayText.escaped("ünïcödé 名前") == "ünïcödé 名前")
        // Cells are cut by Unicode scalars, so a pile of combining marks is bounded too.
        let zalgo = "a" + String(repeating: "\u{301}", count: 10_000)
        #expect(DisplayText.cell(zalgo, limit: 10).unicodeScalars.count == 10)
        #expect(DisplayText.cell(String(repeating: "\u{1b}", count: 100), limit: 9) == "\\x1b\\x1b…")
        // The error shown for a malformed entry is escaped too.
        let error = JournalDecodingError(field: "STALL_FRAME", value: "\u{1b}[2J", reason: "r")
        #expect(error.description == "field STALL_FRAME=\"\\x1b[2J\": r")
    }

    @Test func backtraceIsCutAtALineToFitFourKilobytes() {
        let frames = (0..<200).map { index in
            StallFrame(
                address: UInt(0x5555_0000 + index), image: "/usr/bin/service", symbol: "s",
                function: "Module.Type.function\(index)(argument:other:)", file: "/src/File.swift", line: index + 1)
        }
        let fields = JournalSink.fields(for: .stallEnded(Reports.report(stack: frames)), syslogIdentifier: "svc")
        let backtrace = fields.first { $0.name == "STALL_BACKTRACE" }!.value
        #expect(backtrace.utf8.count <= 4096)
        #expect(backtrace.hasSuffix("…"))
        #expect(backtrace.hasPrefix("#0 0x55550000 Module.Type.function0(argument:other:)"))
        #expect(!backtrace.contains("function199"))
    }

    @Test func fingerprintIgnoresAddressesAndStartsAtTheCulprit() {
        let a = Reports.report().stack
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
            StallReport.Callout.recognizeRunLoopCallout([
                frame("f"), frame("__CFRUNLOOP_IS_SERVICING_THE_MAIN_DISPATCH_QUEUE__"),
                frame("__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__"),
            ]) == .mainQueue)
        #expect(
            StallReport.Callout.recognizeRunLoopCallout([
                frame("__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE1_PERFORM_FUNCTION__")
            ])
                == .source1)
        #expect(StallReport.Callout.recognizeRunLoopCallout([frame("main")]) == .unknown)
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
