import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Where there is no journal: the Hummingbird example run as in a container (a mount namespace
    /// whose `/run` is an empty tmpfs, so no journald socket), its reports read from its standard
    /// error as a container's log collector reads them; and its reports exported through
    /// swift-otel's logging backend as OTLP log records linked to the trace.
    @Suite
    struct ContainerSinkTests {
        static let traceID = RequestContextTests.traceID
        static let traceparent = RequestContextTests.traceparent
        /// `2026-11-27T05:23:45.123456Z`.
        static var rfc3339: Regex<Substring> { #/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/# }
        static var chatter: Regex<Substring> { #/^example chatter \d+ x{200}$/# }

        /// A service's standard error, line by line: stallmon's JSON objects, the service's own
        /// chatter lines, and any other line (which must hold no part of a report).
        struct StandardError {
            var reports: [[String: String]] = []
            var chatter = 0
            var others: [String] = []
            var longest = 0

            init(_ text: String) {
                for line in text.split(separator: "\n") {
                    longest = max(longest, line.utf8.count + 1)
                    if line.wholeMatch(of: ContainerSinkTests.chatter) != nil {
                        chatter += 1
                    } else if let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                        object["MESSAGE_ID"] != nil
                    {
                        reports.append(object.compactMapValues { $0 as? String })
                    } else {
                        others.append(String(line))
                    }
                }
            }

            func reports(_ messageID: String) -> [[String: String]] {
                reports.filter { $0["MESSAGE_ID"] == messageID }
            }
        }

        /// Polls the service's standard error until it holds `count` reports with `messageID`.
        static func standardError(
            _ service: FrameworkService, _ messageID: String, atLeast count: Int, timeout: Double = 10
        ) -> StandardError {
            let deadline = Date().addingTimeInterval(timeout)
            var seen = StandardError(service.errorsSoFar)
            while seen.reports(messageID).count < count, Date() < deadline {
                usleep(100_000)
                seen = StandardError(service.errorsSoFar)
            }
            return seen
        }

        /// Each stall of a traced request is one line on standard error that parses as JSON, with
        /// the journal entry's fields and values (read by the journal's own decoder), the time in
        /// RFC 3339 with microseconds and syslog's level; the service's own lines, written from a
        /// thread of its own every millisecond meanwhile, are all whole; and nothing reaches the
        /// host's journal.
        @Test(.requires(.example(.hummingbirdFixture), .container))
        func inAContainerEachStallIsOneJSONLineOnStandardErrorWithTheJournalsFields() throws {
            try #require(FrameworkService.canRunInContainer, "\(TestRequirement.container) is missing")
            let binary = try FrameworkService.requiredBinary(.hummingbirdFixture)
            let service = try FrameworkService(
                .hummingbirdFixture, binary: binary,
                environment: FrameworkServiceTests.environment.merging([
                    "EXAMPLE_TRACING": "stallmon", "EXAMPLE_STDERR_CHATTER": "1",
                ]) { $1 }, inContainer: true)
            defer { service.stop() }
            let stalls = [FrameworkServiceTests.cpu, FrameworkServiceTests.sleep, FrameworkServiceTests.lock]
            let answers = try stalls.map {
                try FrameworkService.Answer(
                    service.get(
                        "\($0.request)?ms=\(FrameworkServiceTests.stallMilliseconds)",
                        headers: ["traceparent": Self.traceparent]))
            }
            _ = Self.standardError(service, MessageID.stallEnded, atLeast: stalls.count)
            // Whatever else would come: a second report of one stall.
            let output = Self.standardError(service, MessageID.stallEnded, atLeast: stalls.count + 1, timeout: 1.5)
            let ended = output.reports(MessageID.stallEnded)
            let detected = output.reports(MessageID.stallDetected)
            #expect(ended.count == stalls.count, "\(ended)\n\(output.others.prefix(20))")
            #expect(detected.count == stalls.count)
            #expect(Set(detected.compactMap { $0["STALL_ID"] }) == Set(ended.compactMap { $0["STALL_ID"] }))
            #expect(output.reports(MessageID.monitorLifecycle).first?["STALLMON_EVENT"] == "started")
            #expect(output.longest <= 16 * 1024)
            #expect(output.chatter > 100, "the service's own lines: \(output.chatter)")
            let broken = output.others.filter { $0.contains("STALL_") || $0.contains("chatter") }
            #expect(broken.isEmpty, "lines broken by another's: \(broken.prefix(5))")
            guard ended.count == stalls.count else { return }
            for ((stall, answer), line) in zip(zip(stalls, answers), ended) {
                let what = "\(stall)"
                #expect(line["SYSLOG_IDENTIFIER"] == service.identifier, "\(what)")
                #expect(line["time"]?.wholeMatch(of: Self.rfc3339) != nil, "\(what): \(line["time"] ?? "")")
                #expect(line["level"] == "warning", "\(what)")
                #expect(line["PRIORITY"] == "4", "\(what)")
                let duration = (Double(line["STALL_DURATION_USEC"] ?? "") ?? 0) / 1000
                #expect(
                    duration >= answer.truthMilliseconds - FrameworkServiceTests.below
                        && duration <= answer.truthMilliseconds + FrameworkServiceTests.above,
                    "\(what): reported \(duration) ms, the handler measured \(answer.truthMilliseconds) ms")
                #expect(line["STALL_LOOP"] == "cooperative-pool", "\(what)")
                #expect(line["STALL_ACTIVITY"] == "pool-job", "\(what)")
                #expect((line["STALL_FRAME"] ?? "").contains(stall.function), "\(what): \(line)")
                #expect((line["STALL_BACKTRACE"] ?? "").contains(stall.function), "\(what)")
                #expect(line["STALL_THREAD_TID"] == String(answer.tid), "\(what)")
                if let syscalls = stall.syscalls {
                    #expect(line["STALL_THREAD_STATE"] == "S", "\(what)")
                    #expect(syscalls.contains(line["STALL_THREAD_SYSCALL"] ?? "?"), "\(what): \(line)")
                } else {
                    #expect(line["STALL_THREAD_STATE"] == "R", "\(what)")
                }
                #expect(line["STALL_TRACE_ID"] == Self.traceID, "\(what)")
                #expect(line["STALL_REQUEST_METHOD"] == "GET", "\(what)")
                // Hummingbird names the route once the handler returns: before, the path.
                #expect(line["STALL_REQUEST_ROUTE"] ?? line["STALL_REQUEST_PATH"] == stall.request, "\(what): \(line)")
                #expect(line["message"]?.contains("serving GET \(stall.request), trace \(Self.traceID)") == true)
                // The journal's decoder reads the line as an entry: the same schema, the same bounds.
                var fields = line
                fields["MESSAGE"] = fields.removeValue(forKey: "message")
                #expect(throws: Never.self, "\(what)") { try StallRecord(journalFields: fields) }
            }
            if Journald.host.ensureRunning() {
                let journal = try Journald.host.entries(
                    ["SYSLOG_IDENTIFIER=\(service.identifier)"], atLeast: 1, timeout: 0)
                #expect(journal.isEmpty, "the contained service reached the host's journal: \(journal.count) entries")
            }
        }

        /// A stall 100 frames deep (`max_frames` 128) is one line within 16 KiB, its backtrace and
        /// stacks bounded as in the journal.
        @Test(.requires(.example(.hummingbirdFixture), .container)) func aHundredFrameStackStaysOneLineWithinTheLimit()
            throws
        {
            try #require(FrameworkService.canRunInContainer, "\(TestRequirement.container) is missing")
            let binary = try FrameworkService.requiredBinary(.hummingbirdFixture)
            let service = try FrameworkService(
                .hummingbirdFixture, binary: binary,
                environment: FrameworkServiceTests.environment.merging(["STALLMON_MAX_FRAMES": "128"]) { $1 },
                inContainer: true)
            defer { service.stop() }
            _ = try service.get("/deep?ms=400&depth=100")
            let output = Self.standardError(service, MessageID.stallEnded, atLeast: 1)
            let line = try #require(output.reports(MessageID.stallEnded).first, "\(output.others.prefix(20))")
            #expect(output.longest <= 16 * 1024, "\(output.longest) bytes")
            let backtrace = line["STALL_BACKTRACE"] ?? ""
            let deep = backtrace.split(separator: "\n").filter { $0.contains("spinAtDepth") }
            #expect(deep.count >= 20, "\(backtrace)")
            #expect(backtrace.utf8.count <= FieldLimits.backtraceWriteBytes)
            #expect(line["STALL_STACKS"] != nil)
            #expect(line["truncated"] == nil, "\(line)")
        }
    }
}

extension Serial.ContainerSinkTests {
    /// With swift-otel exporting logs as well as traces (EXAMPLE_TRACING=otel) over OTLP/HTTP JSON
    /// to a receiver on loopback, and reports as JSON lines (EXAMPLE_SINK=json): the stall's log
    /// record carries the stalled server span's trace and span IDs as its own `traceId` and
    /// `spanId`, its body is the report's message, and its attributes its duration, loop and frame.
    @Test(.requires(.example(.hummingbirdFixture))) func withSwiftOTelTheStallsLogRecordIsLinkedToTheStalledSpan()
        throws
    {
        let binary = try FrameworkService.requiredBinary(.hummingbirdFixture)
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let service = try FrameworkService(
            .hummingbirdFixture, binary: binary,
            environment: Serial.FrameworkServiceTests.environment.merging([
                "EXAMPLE_TRACING": "otel", "EXAMPLE_SINK": "json",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:\(receiver.port)/v1/traces",
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://127.0.0.1:\(receiver.port)/v1/logs",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/json",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_BLRP_SCHEDULE_DELAY": "100",
            ]) { $1 })
        defer { service.stop() }
        _ = try service.get("/sleep?ms=300", headers: ["traceparent": Self.traceparent])
        let output = Self.standardError(service, MessageID.stallEnded, atLeast: 1)
        let line = try #require(output.reports(MessageID.stallEnded).first, "\(output.others.prefix(20))")
        let span = try #require(
            receiver.span { OTLPReceiver.hex($0["parentSpanId"]) == "00f067aa0ba902b7" },
            "no exported server span: \(receiver.spans())")
        let spanID = OTLPReceiver.hex(span["spanId"])
        #expect(OTLPReceiver.hex(span["traceId"]) == Self.traceID)
        #expect(line["STALL_SPAN_ID"] == spanID, "\(line)")
        #expect(OTLPReceiver.attributes(span["attributes"])["stallmon.stalled"] == "1", "\(span)")
        let record = try #require(
            receiver.logRecord {
                let attributes = OTLPReceiver.attributes($0["attributes"])
                return attributes["stall.id"] == line["STALL_ID"] && attributes["stall.event"] == "ended"
            },
            "no log record of stall \(line["STALL_ID"] ?? "?"): \(receiver.logRecords())")
        #expect(OTLPReceiver.hex(record["traceId"]) == Self.traceID, "\(record)")
        #expect(OTLPReceiver.hex(record["spanId"]) == spanID, "\(record)")
        let body = (record["body"] as? [String: Any])?["stringValue"] as? String
        #expect(body == line["message"], "\(record)")
        #expect(record["severityText"] as? String == "warning", "\(record)")
        let attributes = OTLPReceiver.attributes(record["attributes"])
        let microseconds = Int(line["STALL_DURATION_USEC"] ?? "") ?? -1
        #expect(
            attributes["stall.duration_ms"] == String(format: "%d.%03d", microseconds / 1000, microseconds % 1000),
            "\(attributes)")
        #expect(attributes["stall.loop"] == "cooperative-pool", "\(attributes)")
        #expect(attributes["stall.frame"] == line["STALL_FRAME"], "\(attributes)")
        #expect(attributes["stall.frame"]?.contains("sleepInHandler(milliseconds:)") == true)
        #expect(attributes["http.route"] ?? attributes["url.path"] == "/sleep", "\(attributes)")
        #expect(attributes["http.request.method"] == "GET", "\(attributes)")
        #expect(attributes["trace_id"] == Self.traceID && attributes["span_id"] == spanID)
    }
}
