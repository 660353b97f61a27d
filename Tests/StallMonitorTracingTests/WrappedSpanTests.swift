import CStallCapture
import Foundation
import InMemoryTracing
import Instrumentation
import StallJournal
import StallMonitor
import Synchronization
import Testing
import Tracing

@testable import StallMonitorTracing

/// The spans of tracers whose spans are objects (swift-otel's), wrapped in the table's slots, and
/// what a stall in a span leaves for its reports.
extension RequestTableTests {
    /// A span that ends with a stall inside it leaves what it said last for the stall's later
    /// reports (a Hummingbird span names its route only as it ends); one without a stall leaves
    /// nothing.
    @Test func aStalledSpanThatEndsLeavesItsLastWordsForTheStallsReports() {
        let tracer = StallmonTracer()
        var stalled = SpanRegistration.none
        tracer.withSpan("GET /slow", ofKind: .server) { span in
            span.attributes["url.path"] = "/slow/1"
            stalled = span.registration
            noteStall(
                "00112233445566778899aabbccddeeff", in: stalled, lasting: .milliseconds(250), ended: false, thread: 42,
                frame: "")
            span.attributes["http.route"] = "/slow/:id"
        }
        let last = SpanTableReader().request(slot: stalled.slot, sequence: stalled.sequence)
        #expect(last?.route == "/slow/:id" && last?.path == "/slow/1")
        var quiet = SpanRegistration.none
        tracer.withSpan("GET /quiet") { span in quiet = span.registration }
        #expect(SpanTableReader().request(slot: quiet.slot, sequence: quiet.sequence) == nil)
    }

    /// A wrapped tracer whose spans are objects (as swift-otel's are), in a task and outside one
    /// (where the span's keeper holds it): the report reads the wrapped span, and its stall becomes
    /// an event on it.
    @Test func aWrappedTracersObjectSpansAreReadAndGetTheirStallEvents() async throws {
        let objects = ObjectSpanTracer<Void>()
        let tracer = StallmonTracer(wrapping: objects)
        @Sendable func check() throws {
            let key = stallmon_request_current_key()
            let span = tracer.startSpan("GET /object", ofKind: .server)
            span.attributes["http.request.method"] = "GET"
            span.attributes["http.route"] = "/object/:id"
            #expect(span.operationName == "GET /object" && span.isRecording)
            let found = request(for: key)
            #expect(
                found?.operation == "GET /object" && found?.endpoint == "GET /object/:id",
                "\(String(describing: found))")
            noteStall(
                "ffeeddccbbaa99887766554433221100", in: span.registration, lasting: .milliseconds(120), ended: true,
                thread: 7, frame: "Object.work()")
            span.end()
            #expect(request(for: key) == nil)
        }
        try await Task { try check() }.value
        let thread = Thread { try? check() }
        thread.start()
        while !thread.isFinished { try await Task.sleep(for: .milliseconds(1)) }
        let ended = objects.ended.withLock { $0 }
        #expect(ended.count == 2)
        for span in ended {
            #expect(span.events.map(\.name) == ["stall"])
            #expect(span.attributes.get("stallmon.stalled") == .bool(true))
        }
    }

    /// A wrapped span is held by its tracer's span type's calls, numbered for the first 14 types a
    /// process wraps; the spans of the types past them are held with their calls, and work the same.
    @Test func theSpansOfMoreTypesThanTheCallsHaveNumbersForWorkTheSame() async throws {
        func check<Marker>(_ marker: Marker.Type) async throws {
            let objects = ObjectSpanTracer<Marker>()
            let tracer = StallmonTracer(wrapping: objects)
            try await Task {
                let key = stallmon_request_current_key()
                let span = tracer.startSpan("GET /\(Marker.self)", ofKind: .server)
                span.attributes["http.request.method"] = "GET"
                span.attributes["http.route"] = "/\(Marker.self)/:id"
                span.operationName = "GET /\(Marker.self)/:id"
                let found = try #require(request(for: key))
                #expect(found.operation == "GET /\(Marker.self)/:id" && found.route == "/\(Marker.self)/:id")
                noteStall(
                    "00112233445566778899aabbccddeeff", in: span.registration, lasting: .milliseconds(90), ended: true,
                    thread: 9, frame: "Marked.work()")
                span.end()
            }.value
            let ended = objects.ended.withLock { $0 }
            #expect(ended.count == 1, "\(Marker.self)")
            #expect(ended.first?.events.map(\.name) == ["stall"], "\(Marker.self)")
            #expect(ended.first?.attributes.get("http.route") == .string("/\(Marker.self)/:id"))
            #expect(ended.first?.attributes.get("stallmon.stalled") == .bool(true))
        }
        let markers: [Any.Type] = [
            Int8.self, Int16.self, Int32.self, Int64.self, UInt8.self, UInt16.self, UInt32.self, UInt64.self,
            Float.self, Double.self, String.self, Bool.self, Character.self, Substring.self, UInt.self, Int.self,
        ]
        for marker in markers {
            func open<Marker>(_ marker: Marker.Type) async throws { try await check(marker) }
            try await open(marker)
        }
    }

    /// The slot keeps a wrapped tracer's span after it ends (a reader may still copy it), and lets
    /// it go when the slot's next span starts, wrapped or alone: one span held per slot, and none
    /// leaked. The spans of one task take the same slot, one after another.
    @Test func aWrappedSpanIsReleasedWhenItsSlotsNextSpanStarts() {
        let objects = ObjectSpanTracer<Void>(keepsEnded: false)
        let tracer = StallmonTracer(wrapping: objects)
        let spans = 100
        for _ in 0..<spans {
            tracer.withSpan("GET /") { span in span.attributes["url.path"] = "/" }
        }
        #expect(objects.ended.freed == spans - 1)
        StallmonTracer().withSpan("GET /alone") { _ in }
        #expect(objects.ended.freed == spans)
        #expect(stallmon_request_live() == 0)
    }

    /// Wrapping a recording tracer: its spans are the ones that end, with a `stall` event for a
    /// stall noted inside them and `stallmon.stalled`; others carry neither.
    @Test func aWrappedSpanGetsAStallEventForAStallNotedInIt() throws {
        let memory = InMemoryTracer()
        let tracer = StallmonTracer(wrapping: memory)
        tracer.withSpan("GET /slow", ofKind: .server) { span in
            span.attributes["http.route"] = "/slow"
            #expect(request(for: here)?.route == "/slow")
            noteStall(
                "0123456789abcdef0123456789abcdef", in: span.registration, lasting: .milliseconds(250), ended: true,
                thread: 42, frame: "Slow.work() (Slow.swift:7)")
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

/// A tracer whose spans are objects, as swift-otel's are; a type of span for each `Marker`.
private struct ObjectSpanTracer<Marker>: Tracer {
    let ended: ObjectSpan<Marker>.Ended

    /// `keepsEnded`: whether the spans that end are kept, for a test to read (else only counted
    /// as they are freed).
    init(keepsEnded: Bool = true) {
        ended = ObjectSpan<Marker>.Ended(keeps: keepsEnded)
    }

    func startSpan<Instant: TracerInstant>(
        _ operationName: String, context: @autoclosure () -> InstrumentationContext, ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant, function: String, file fileID: String, line: UInt
    ) -> ObjectSpan<Marker> {
        ObjectSpan(operationName: operationName, context: context(), ended: ended)
    }

    func forceFlush() {}

    func extract<Carrier, Extract: Extractor>(
        _ carrier: Carrier, into context: inout InstrumentationContext, using extractor: Extract
    ) where Extract.Carrier == Carrier {}

    func inject<Carrier, Inject: Injector>(
        _ context: InstrumentationContext, into carrier: inout Carrier, using injector: Inject
    ) where Inject.Carrier == Carrier {}
}

private final class ObjectSpan<Marker>: Tracing.Span, @unchecked Sendable {
    final class Ended: @unchecked Sendable {
        private let lock = NSLock()
        private let keeps: Bool
        private var spans: [ObjectSpan] = []
        private var freedSpans = 0
        init(keeps: Bool) { self.keeps = keeps }
        func add(_ span: ObjectSpan) { if keeps { lock.withLock { spans.append(span) } } }
        func withLock<T>(_ body: ([ObjectSpan]) -> T) -> T { lock.withLock { body(spans) } }
        /// The spans freed.
        var freed: Int { lock.withLock { freedSpans } }
        func free() { lock.withLock { freedSpans += 1 } }
    }

    let context: InstrumentationContext
    private let lock = NSLock()
    private let ended: Ended
    private var name: String
    private var attributesSet: SpanAttributes = [:]
    private(set) var events: [SpanEvent] = []
    private var done = false

    init(operationName: String, context: InstrumentationContext, ended: Ended) {
        self.name = operationName
        self.context = context
        self.ended = ended
    }

    deinit { ended.free() }

    var operationName: String {
        get { lock.withLock { name } }
        set { lock.withLock { name = newValue } }
    }
    var attributes: SpanAttributes {
        get { lock.withLock { attributesSet } }
        set { lock.withLock { attributesSet = newValue } }
    }
    var isRecording: Bool { lock.withLock { !done } }
    func setStatus(_ status: SpanStatus) {}
    func addEvent(_ event: SpanEvent) { lock.withLock { events.append(event) } }
    func recordError<Instant: TracerInstant>(
        _ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant
    ) {}
    func addLink(_ link: SpanLink) {}
    func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        lock.withLock { done = true }
        ended.add(self)
    }
}
