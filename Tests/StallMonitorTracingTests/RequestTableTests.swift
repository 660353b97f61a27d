import CStallCapture
import InMemoryTracing
import Instrumentation
import StallJournal
import StallMonitor
import Testing
import Tracing

@testable import StallMonitorTracing

/// The table of requests in flight (requests.c) and `StallmonTracer`'s spans, in process: what a
/// watchdog finds for a key, nesting, inheritance, capacity, and W3C trace context.
@Suite(.serialized)
struct RequestTableTests {
    /// What the watchdog finds for `key` now, as the report would say it.
    func request(for key: UInt64) -> StallReport.Request? {
        var key = key
        guard let pointer = stallmon_request_acquire(&key, 1) else { return nil }
        let record = Unmanaged<AnyObject>.fromOpaque(pointer).takeRetainedValue() as? any StallRequestRecord
        return record?.stallRequest
    }

    var here: UInt64 { stallmon_request_current_key() }

    @Test func aSpanIsFoundUnderItsTaskWhileItRunsAndNotAfter() {
        let tracer = StallmonTracer()

        #expect(request(for: here) == nil)
        tracer.withSpan("GET /users/:id", ofKind: .server) { span in
            span.attributes["http.request.method"] = "GET"
            span.attributes["url.path"] = "/users/42"
            let found = request(for: here)
            #expect(found?.operation == "GET /users/:id")
            #expect(found?.method == "GET")
            #expect(found?.path == "/users/42")
            #expect(found?.endpoint == "GET /users/42")
            #expect(found?.traceID.count == 32 && found?.spanID.count == 16)
            span.attributes["http.route"] = "/users/:id"
            #expect(request(for: here)?.endpoint == "GET /users/:id")
        }
        #expect(request(for: here) == nil)
        #expect(stallmon_request_live() == 0)
    }

    /// An inner span names the operation and span ID; the request's method and route come from
    /// the span around it; the trace is the same.
    @Test func theInnermostSpanWinsAndTheRequestComesFromTheSpanAroundIt() {
        let tracer = StallmonTracer()
        tracer.withSpan("GET /orders", ofKind: .server) { outer in
            outer.attributes["http.request.method"] = "GET"
            outer.attributes["http.route"] = "/orders"
            let outerRequest = request(for: here)
            tracer.withSpan("db.query") { _ in
                let inner = request(for: here)
                #expect(inner?.operation == "db.query")
                #expect(inner?.endpoint == "GET /orders")
                #expect(inner?.traceID == outerRequest?.traceID)
                #expect(inner?.spanID != outerRequest?.spanID)
            }
            #expect(request(for: here)?.spanID == outerRequest?.spanID)
        }
    }

    /// A task enqueued by work that serves a request serves it too, and keeps it while the request
    /// lasts; it lapses when the request's span ends. A task that now lives at the same address (its
    /// ID differs) inherits nothing, and neither does a job that is not a task (an actor's).
    @Test func aTaskEnqueuedByARequestsWorkInheritsItUntilTheSpanEnds() throws {
        let tracer = StallmonTracer()
        // A fake job: zeroed (kind 0, a task), its ID at 36.
        let memory = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 64)
        defer { memory.deallocate() }
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: 128)
        memory.storeBytes(of: UInt32(41), toByteOffset: 36, as: UInt32.self)
        let job = UInt64(UInt(bitPattern: memory))
        let inherited = stallmon_request_inherited()
        tracer.withSpan("GET /report", ofKind: .server) { span in
            span.attributes["http.route"] = "/report"
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job)?.endpoint == "/report")
            #expect(request(for: job)?.spanID == request(for: here)?.spanID)
            // Another task at the same address: not the request's.
            memory.storeBytes(of: UInt32(42), toByteOffset: 36, as: UInt32.self)
            #expect(request(for: job) == nil)
            memory.storeBytes(of: UInt32(41), toByteOffset: 36, as: UInt32.self)
        }
        #expect(stallmon_request_inherited() == inherited + 1)
        #expect(request(for: job) == nil)
        #expect(stallmon_request_live() == 0)
        // An actor's job (kind 1) inherits nothing.
        memory.storeBytes(of: UInt8(1), toByteOffset: 32, as: UInt8.self)
        tracer.withSpan("GET /actor") { _ in
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job) == nil)
        }
    }

    /// A task keeps the request that first made or woke it while that request lasts: another
    /// request's task waking it does not take it over.
    @Test func aTaskKeepsItsRequestWhenAnotherRequestWakesIt() async throws {
        let tracer = StallmonTracer()
        let memory = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 64)
        defer { memory.deallocate() }
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: 128)
        memory.storeBytes(of: UInt32(7), toByteOffset: 36, as: UInt32.self)
        let job = UInt64(UInt(bitPattern: memory))
        let first = tracer.startSpan("GET /first")
        stallmon_request_inherit_for(here, job)
        let firstSpanID = request(for: here)?.spanID
        first.end()
        // The first request is over: the next waker's request is the task's now.
        tracer.withSpan("GET /second") { _ in
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job)?.operation == "GET /second")
            #expect(request(for: job)?.spanID != firstSpanID)
        }
        let third = tracer.startSpan("GET /third")
        stallmon_request_inherit_for(here, job)
        #expect(request(for: job)?.operation == "GET /third")
        // A fourth request, in a task of its own, wakes it while the third lasts: it stays the third's.
        let (fourthKey, fourth) = await Task.detached {
            (stallmon_request_current_key(), tracer.startSpan("GET /fourth"))
        }.value
        #expect(request(for: fourthKey)?.operation == "GET /fourth")
        stallmon_request_inherit_for(fourthKey, job)
        #expect(request(for: job)?.operation == "GET /third")
        fourth.end()
        third.end()
        #expect(request(for: job) == nil)
    }

    /// Past the table's slots near a key, a span goes unregistered (counted) and the rest work on.
    @Test func aFullTableRefusesSpansAndRecovers() {
        let tracer = StallmonTracer()
        let refused = stallmon_request_refused()
        var spans: [StallmonSpan] = []
        for index in 0..<(Int(STALLMON_REQUEST_SLOTS) + 100) {
            spans.append(tracer.startSpan("span \(index)"))
        }
        #expect(stallmon_request_refused() > refused)
        // One task's spans share the window of its key.
        #expect(stallmon_request_live() == 4)
        for span in spans { span.end() }
        #expect(stallmon_request_live() == 0)
        tracer.withSpan("after") { _ in #expect(request(for: here)?.operation == "after") }
    }

    /// A span dropped without its end leaves the table as its record goes: the table keeps no
    /// reference, and a reader never finds a record being freed.
    @Test func aSpanDroppedWithoutItsEndLeavesTheTable() {
        do {
            let span = StallmonTracer().startSpan("never ended")
            #expect(request(for: here)?.operation == "never ended")
            _ = span
        }
        #expect(stallmon_request_live() == 0)
        #expect(request(for: here) == nil)
    }

    @Test func alonesTraceContextFollowsAnIncomingTraceparentAndGoesOut() throws {
        let tracer = StallmonTracer()
        var context = InstrumentationContext.topLevel
        tracer.extract(
            ["traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"], into: &context,
            using: DictionaryExtractor())
        try tracer.withSpan("GET /", context: context, ofKind: .server) { span in
            #expect(request(for: here)?.traceID == "4bf92f3577b34da6a3ce929d0e0e4736")
            var headers: [String: String] = [:]
            tracer.inject(span.context, into: &headers, using: DictionaryInjector())
            let header = try #require(headers["traceparent"])
            #expect(header.hasPrefix("00-4bf92f3577b34da6a3ce929d0e0e4736-"))
            #expect(header.hasSuffix("-01"))
            #expect(!header.contains("00f067aa0ba902b7"))
            #expect(header.contains(request(for: here)?.spanID ?? "?"))
        }
    }

    @Test(arguments: [
        "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
    ])
    func aMalformedTraceparentIsIgnored(header: String) {
        #expect(TraceParent(header) == nil, "\(header)")
    }

    @Test func aLaterVersionsTraceparentIsReadByItsFirstFields() {
        let parsed = TraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next")
        #expect(parsed?.traceID == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(parsed?.spanIDText == "00f067aa0ba902b7")
    }

    /// Wrapping a recording tracer: its spans are the ones that end, with a `stall` event for a
    /// stall noted inside them and `stallmon.stalled`; others carry neither.
    @Test func aWrappedSpanGetsAStallEventForAStallNotedInIt() throws {
        let memory = InMemoryTracer()
        let tracer = StallmonTracer(wrapping: memory)
        tracer.withSpan("GET /slow", ofKind: .server) { span in
            span.attributes["http.route"] = "/slow"
            #expect(request(for: here)?.route == "/slow")
            span.state.noteStall(
                StallNote(
                    stallID: "0123456789abcdef0123456789abcdef", startNanoseconds: 1, duration: .milliseconds(250),
                    ended: true, threadID: 42, frame: "Slow.work() (Slow.swift:7)", loop: "cooperative-pool"))
        }
        tracer.withSpan("GET /fast") { _ in }
        let slow = try #require(memory.finishedSpans.first { $0.operationName == "GET /slow" })
        let event = try #require(slow.events.first)
        #expect(event.name == "stall")
        #expect(event.attributes.get("stallmon.stall.id") == .string("0123456789abcdef0123456789abcdef"))
        #expect(event.attributes.get("code.function") == .string("Slow.work() (Slow.swift:7)"))
        #expect(event.attributes.get("stallmon.stall.duration_ms") == .double(250))
        #expect(slow.attributes.get("stallmon.stalled") == .bool(true))
        let fast = try #require(memory.finishedSpans.first { $0.operationName == "GET /fast" })
        #expect(fast.events.isEmpty && fast.attributes.get("stallmon.stalled") == nil)
    }
}

private struct DictionaryExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

private struct DictionaryInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}
