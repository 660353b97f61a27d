import Foundation
import StallJournal
import StallmonTestSupport
import Testing

extension Serial {
    /// A stall names its request: the example services with their framework's TracingMiddleware
    /// and `StallmonTracer` (EXAMPLE_TRACING), driven over loopback with a W3C `traceparent`, and
    /// the reports read back from a real journald.
    @Suite
    struct RequestContextTests {
        static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
        static let traceparent = "00-\(traceID)-00f067aa0ba902b7-01"
        static let environment = FrameworkServiceTests.environment

        /// Each handler's stall, reported with the request it served: method, route (Hummingbird
        /// names the route only once the handler returns, so a detected report has the path), the
        /// header's trace ID, and a span ID of that trace's server span. A pool stall, a blocked
        /// one, a main-actor hop and a `Task {}` the handler makes, on Hummingbird and on Vapor
        /// (whose async handler runs in a task of its own, made by the middleware's task: it
        /// inherits the request, and so does the task it makes).
        @Test(
            .requires(.example(.hummingbirdFixture), .example(.vaporFixture)),
            arguments: [FrameworkService.Kind.hummingbirdFixture, .vaporFixture])
        func aStallInsideARequestNamesItsRouteMethodAndTrace(kind: FrameworkService.Kind) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let binary = try FrameworkService.requiredBinary(kind)
            let service = try FrameworkService(
                kind, binary: binary, environment: Self.environment.merging(["EXAMPLE_TRACING": "stallmon"]) { $1 })
            defer { service.stop() }
            let routes = ["/cpu", "/sleep", "/main-actor", "/child-cpu"]
            for route in routes {
                _ = try service.get("\(route)?ms=300", headers: ["traceparent": Self.traceparent])
            }
            let ended = try service.entries(MessageID.stallEnded, atLeast: routes.count)
            let detected = try service.entries(MessageID.stallDetected, atLeast: routes.count)
            #expect(ended.count == routes.count && detected.count == routes.count)
            var spanIDs: Set<String> = []
            for (route, (detected, ended)) in zip(routes, zip(detected, ended)) {
                for entry in [detected, ended] {
                    let what = "\(kind) \(route) \(entry["STALL_EVENT"] ?? "?")"
                    #expect(entry["STALL_REQUEST_METHOD"] == "GET", "\(what): \(entry)")
                    let target = entry["STALL_REQUEST_ROUTE"] ?? entry["STALL_REQUEST_PATH"]
                    #expect(target == route, "\(what): \(entry)")
                    #expect(entry["STALL_TRACE_ID"] == Self.traceID, "\(what): \(entry)")
                    let span = entry["STALL_SPAN_ID"] ?? ""
                    #expect(FieldLimits.isLowercaseHex(span, digits: 16) && span != "00f067aa0ba902b7", "\(what)")
                    spanIDs.insert(span)
                    // Blocked and never signalled: only the pool job the thread runs, which is
                    // the handler's task, can have named the request.
                    if route == "/sleep" { #expect(entry["STALL_STACK_SOURCE"] == "kernel", "\(what): \(entry)") }
                    let message = entry["MESSAGE"] ?? ""
                    #expect(message.contains("serving GET \(route), trace \(Self.traceID)"), "\(what): \(message)")
                }
            }
            // One server span per request: the detected and ended report of a stall share it.
            #expect(spanIDs.count == routes.count, "\(spanIDs)")
        }

        /// A stall outside any request (the service's own task, made by `main()`, with no span)
        /// carries no request fields, though the tracer is bootstrapped and requests come and go;
        /// and none carries any when no tracer is.
        @Test(.requires(.example(.hummingbirdFixture)), arguments: [true, false])
        func aStallOutsideAnyRequestCarriesNoRequestFields(traced: Bool) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let binary = try FrameworkService.requiredBinary(.hummingbirdFixture)
            var environment = Self.environment
            if traced {
                environment["EXAMPLE_TRACING"] = "stallmon"
                environment["EXAMPLE_BACKGROUND_STALL_MS"] = "300"
            }
            let service = try FrameworkService(.hummingbirdFixture, binary: binary, environment: environment)
            defer { service.stop() }
            if traced {
                for _ in 0..<10 { _ = try service.get("/hello", headers: ["traceparent": Self.traceparent]) }
            } else {
                _ = try service.get("/cpu?ms=300", headers: ["traceparent": Self.traceparent])
            }
            let entries = try service.entries(MessageID.stallEnded, atLeast: 1)
            let entry = try #require(entries.first)
            #expect((entry["STALL_FRAME"] ?? "").contains("spinInHandler"), "\(entry)")
            #expect(entry.keys.filter { $0.hasPrefix("STALL_REQUEST_") || $0 == "STALL_TRACE_ID" }.isEmpty, "\(entry)")
            #expect(!(entry["MESSAGE"] ?? "").contains("serving"))
        }

        /// The trace shows the stall: the span a stall happened in, exported by the wrapped tracer
        /// (swift-distributed-tracing's InMemoryTracer here), carries a `stall` event with the
        /// stall's ID, duration, thread and frame, and `stallmon.stalled`; a span without a stall
        /// carries neither.
        @Test(
            .requires(.example(.hummingbirdFixture), .example(.vaporFixture)),
            arguments: [FrameworkService.Kind.hummingbirdFixture, .vaporFixture])
        func theStalledSpanCarriesAStallEvent(kind: FrameworkService.Kind) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let binary = try FrameworkService.requiredBinary(kind)
            let service = try FrameworkService(
                kind, binary: binary, environment: Self.environment.merging(["EXAMPLE_TRACING": "memory"]) { $1 })
            defer { service.stop() }
            _ = try service.get("/sleep?ms=300")
            _ = try service.get("/hello")
            let ended = try #require(try service.entries(MessageID.stallEnded, atLeast: 1).first)
            // The wrapped tracer's IDs are not W3C (InMemoryTracer's own): no trace ID, but the request.
            #expect(ended["STALL_REQUEST_METHOD"] == "GET" && ended["STALL_REQUEST_ROUTE"] == "/sleep", "\(ended)")
            let json = try service.get("/spans")
            let spans = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]])
            let stalled = try #require(
                spans.first { ($0["operation"] as? String)?.contains("/sleep") == true }, "\(json)")
            let events = try #require(stalled["events"] as? [[String: Any]])
            let stall = try #require(events.first { $0["name"] as? String == "stall" }, "\(stalled)")
            let attributes = try #require(stall["attributes"] as? [String: String])
            #expect(attributes["stallmon.stall.id"]?.contains(ended["STALL_ID"] ?? "?") == true, "\(attributes)")
            #expect(attributes["thread.id"] == "int64(\(ended["STALL_THREAD_TID"] ?? "?"))", "\(attributes)")
            #expect(attributes["code.function"]?.contains("sleepInHandler(milliseconds:)") == true, "\(attributes)")
            #expect(attributes["stallmon.stall.duration_ms"] != nil)
            #expect((stalled["attributes"] as? [String: String])?["stallmon.stalled"]?.contains("true") == true)
            let hello = try #require(
                spans.first { ($0["operation"] as? String)?.contains("/hello") == true }, "\(json)")
            #expect((hello["events"] as? [Any])?.isEmpty == true)
            #expect((hello["attributes"] as? [String: String])?["stallmon.stalled"] == nil)
        }
    }
}

extension Serial.RequestContextTests {
    /// With swift-otel's backend wrapped (Hummingbird, EXAMPLE_TRACING=otel) exporting OTLP/JSON to
    /// a receiver on loopback: the report's trace and span IDs are those of the exported server
    /// span, in the header's trace, and that span carries the `stall` event with the report's
    /// stall ID and the stall's true duration.
    @Test(.requires(.example(.hummingbirdFixture))) func withSwiftOTelTheExportedSpanIsTheReportsAndCarriesTheStall()
        throws
    {
        try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
        let binary = try FrameworkService.requiredBinary(.hummingbirdFixture)
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let service = try FrameworkService(
            .hummingbirdFixture, binary: binary,
            environment: Self.environment.merging([
                "EXAMPLE_TRACING": "otel",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:\(receiver.port)/v1/traces",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_BSP_SCHEDULE_DELAY": "100",
            ]) { $1 })
        defer { service.stop() }
        let answer = try FrameworkService.Answer(
            service.get("/sleep?ms=300", headers: ["traceparent": Self.traceparent]))
        let ended = try #require(try service.entries(MessageID.stallEnded, atLeast: 1).first)
        #expect(ended["STALL_TRACE_ID"] == Self.traceID, "\(ended)")
        let spanID = try #require(ended["STALL_SPAN_ID"])
        let span = try #require(
            receiver.span { OTLPReceiver.hex($0["spanId"]) == spanID },
            "no exported span \(spanID): \(receiver.spans())")
        #expect(OTLPReceiver.hex(span["traceId"]) == Self.traceID)
        #expect(OTLPReceiver.hex(span["parentSpanId"]) == "00f067aa0ba902b7")
        #expect(OTLPReceiver.attributes(span["attributes"])["stallmon.stalled"] == "1", "\(span)")
        let events = span["events"] as? [[String: Any]] ?? []
        let stall = try #require(events.first { $0["name"] as? String == "stall" }, "\(span)")
        let attributes = OTLPReceiver.attributes(stall["attributes"])
        #expect(attributes["stallmon.stall.id"] == ended["STALL_ID"], "\(attributes)")
        #expect(attributes["thread.id"] == String(answer.tid), "\(attributes)")
        #expect(attributes["code.function"]?.contains("sleepInHandler(milliseconds:)") == true, "\(attributes)")
        // The pool thread stamped the job's end before the span ended: the true duration.
        let duration = Double(attributes["stallmon.stall.duration_ms"] ?? "") ?? 0
        #expect(duration >= answer.truthMilliseconds - 5 && duration <= answer.truthMilliseconds + 60, "\(attributes)")
    }
}

extension Serial.RequestContextTests {
    /// A span started on an event loop, outside any task (a SwiftNIO handler's own tracing), names
    /// the request of a stall on that loop, on the CPU (signalled) or blocked (not signalled: found
    /// by its thread); a stall on the same loop outside the span names none.
    @Test func anEventLoopStallInsideASpanStartedOnTheLoopNamesItsRequest() throws {
        try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
        let server = try NIOServer()
        defer { server.stop() }
        let paths = ["/traced-cpu", "/traced-sleep", "/cpu"]
        for path in paths { _ = try server.stall("\(path)?ms=250") }
        let ended = try server.entries(MessageID.stallEnded, atLeast: paths.count)
        #expect(ended.count == paths.count)
        for (path, entry) in zip(paths, ended) {
            #expect(entry["STALL_ACTIVITY"] == "event-loop-cycle", "\(path): \(entry)")
            if path == "/cpu" {
                #expect(entry["STALL_REQUEST_ROUTE"] == nil && entry["STALL_TRACE_ID"] == nil, "\(entry)")
                continue
            }
            #expect(entry["STALL_REQUEST_METHOD"] == "GET" && entry["STALL_REQUEST_ROUTE"] == path, "\(entry)")
            #expect(entry["STALL_REQUEST_OPERATION"] == "GET \(path)", "\(entry)")
            #expect(FieldLimits.isLowercaseHex(entry["STALL_TRACE_ID"] ?? "", digits: 32), "\(entry)")
        }
        #expect(ended[1]["STALL_STACK_SOURCE"] == "kernel", "the blocked handler was signalled: \(ended[1])")
    }
}
