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

/// The table of requests in flight (requests.c) and `StallmonTracer`'s spans, in process: what a
/// watchdog finds for a key, nesting, inheritance, capacity, and W3C trace context.
@Suite(.serialized)
struct RequestTableTests {
    /// What the watchdog finds for `key` now, as the report would say it; for a task whose ID it
    /// read while the task lived, `taskID` (as the trampoline reads a pool job's as it starts).
    func request(for key: UInt64, taskID: UInt32? = nil) -> StallReport.Request? {
        var key = key
        var found = stallmon_request_found()
        if let taskID {
            guard stallmon_request_find_task(key, taskID, &found) != 0 else { return nil }
        } else {
            guard stallmon_request_find(&key, 1, &found) != 0 else { return nil }
        }
        return SpanTableReader().request(slot: found.slot, sequence: found.sequence)
    }

    /// The runtime's layout, checked as the pool monitor's probes check it (on a task of the
    /// runtime's global executor): until then the table reads no task's memory, and the pool hook's
    /// work (`stallmon_request_inherit_for`) does nothing.
    static let layoutVerified: Bool = {
        let done = DispatchSemaphore(value: 0)
        Task.detached(priority: .medium) {
            _ = stallmon_pool_learn_queue(UInt32(TaskPriority.medium.rawValue))
            done.signal()
        }
        done.wait()
        return stallmon_pool_layout_verified() == 1
    }()

    var here: UInt64 { stallmon_request_current_key() }

    /// Notes a stall of a pool thread in the span of `registration`, as the watchdog does.
    func noteStall(
        _ stallID: String, in registration: SpanRegistration, lasting duration: Duration, ended: Bool, thread: Int,
        frame: String
    ) {
        SpanTableReader().noteStall(
            StallNote(
                stallID: stallID, startNanoseconds: 1, duration: duration, ended: ended, threadID: thread, frame: frame,
                loop: "cooperative-pool"),
            slot: registration.slot, sequence: registration.sequence)
    }

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
        insideOrdersRequest(of: tracer) { outerRequest in
            tracer.withSpan("db.query") { _ in
                let inner = request(for: here)
                #expect(inner?.operation == "db.query")
                #expect(inner?.endpoint == "GET /orders")
                #expect(inner?.traceID == outerRequest?.traceID)
                #expect(inner?.spanID != outerRequest?.spanID)
            }
        }
    }

    /// Runs `body` inside a `GET /orders` server span of `tracer`, given what the table says of it,
    /// and checks that the table names that span again once `body`'s spans have ended.
    func insideOrdersRequest(of tracer: StallmonTracer, _ body: (StallReport.Request?) -> Void) {
        tracer.withSpan("GET /orders", ofKind: .server) { outer in
            outer.attributes["http.request.method"] = "GET"
            outer.attributes["http.route"] = "/orders"
            let outerRequest = request(for: here)
            body(outerRequest)
            #expect(request(for: here)?.spanID == outerRequest?.spanID)
        }
    }

    /// A span of another trace inside a task's span (a message's consumer, its context read from the
    /// message) is the task's innermost span while it runs, but no child of the span around it: it
    /// names the stalls with its own operation and trace, and not the request's route.
    @Test func aSpanOfAnotherTraceInsideATasksSpanIsItsInnermostButNoChild() {
        let tracer = StallmonTracer()
        insideOrdersRequest(of: tracer) { _ in
            var context = InstrumentationContext.topLevel
            tracer.extract(
                ["traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"], into: &context,
                using: DictionaryExtractor())
            tracer.withSpan("orders process", context: context, ofKind: .consumer) { _ in
                let inner = request(for: here)
                #expect(inner?.operation == "orders process")
                #expect(inner?.traceID == "4bf92f3577b34da6a3ce929d0e0e4736")
                #expect(inner?.method == "" && inner?.route == "")
                tracer.withSpan("db.query") { _ in
                    // A child of the consumer's span, in its trace.
                    #expect(request(for: here)?.operation == "db.query")
                    #expect(request(for: here)?.traceID == "4bf92f3577b34da6a3ce929d0e0e4736")
                }
            }
        }
    }

    /// A task enqueued by work that serves a request serves it too, and keeps it while the request
    /// lasts; it lapses when the request's span ends. A task that now lives at the same address (its
    /// ID differs) inherits nothing, and neither does a job that is not a task (an actor's).
    @Test func aTaskEnqueuedByARequestsWorkInheritsItUntilTheSpanEnds() throws {
        try #require(Self.layoutVerified)
        let tracer = StallmonTracer()
        let fake = FakeJob(id: 41)
        defer { withExtendedLifetime(fake) {} }
        let job = fake.key
        let inherited = stallmon_request_inherited()
        tracer.withSpan("GET /report", ofKind: .server) { span in
            span.attributes["http.route"] = "/report"
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job, taskID: 41)?.endpoint == "/report")
            #expect(request(for: job, taskID: 41)?.spanID == request(for: here)?.spanID)
            // Another task at the same address: not the request's.
            #expect(request(for: job, taskID: 42) == nil)
        }
        #expect(stallmon_request_inherited() == inherited + 1)
        #expect(request(for: job, taskID: 41) == nil)
        #expect(stallmon_request_live() == 0)
        // An actor's job (kind 1) inherits nothing.
        fake.kind = 1
        tracer.withSpan("GET /actor") { _ in
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job, taskID: 41) == nil)
        }
    }

    /// A task keeps the request that first made or woke it while that request lasts: another
    /// request's task waking it does not take it over.
    @Test func aTaskKeepsItsRequestWhenAnotherRequestWakesIt() async throws {
        try #require(Self.layoutVerified)
        let tracer = StallmonTracer()
        let fake = FakeJob(id: 7)
        defer { withExtendedLifetime(fake) {} }
        let job = fake.key
        let first = tracer.startSpan("GET /first")
        stallmon_request_inherit_for(here, job)
        let firstSpanID = request(for: here)?.spanID
        first.end()
        // The first request is over: the next waker's request is the task's now.
        tracer.withSpan("GET /second") { _ in
            stallmon_request_inherit_for(here, job)
            #expect(request(for: job, taskID: 7)?.operation == "GET /second")
            #expect(request(for: job, taskID: 7)?.spanID != firstSpanID)
        }
        let third = tracer.startSpan("GET /third")
        stallmon_request_inherit_for(here, job)
        #expect(request(for: job, taskID: 7)?.operation == "GET /third")
        // A fourth request, in a task of its own, wakes it while the third lasts: it stays the third's.
        let (fourthKey, fourth) = await Task.detached {
            (stallmon_request_current_key(), tracer.startSpan("GET /fourth"))
        }.value
        #expect(request(for: fourthKey)?.operation == "GET /fourth")
        stallmon_request_inherit_for(fourthKey, job)
        #expect(request(for: job, taskID: 7)?.operation == "GET /third")
        fourth.end()
        third.end()
        #expect(request(for: job, taskID: 7) == nil)
    }

    /// The pool hook's sign that a task's span may be open: set by such a span's start, kept by a
    /// sweep while one is open, cleared by the first sweep after the last one ends (the alias a
    /// request's task left keeps nothing open); a sweep with the sign clear looks at nothing.
    @Test func aSweepClearsThePoolHooksSignOnlyOnceNoSpanIsOpen() throws {
        try #require(Self.layoutVerified)
        let tracer = StallmonTracer()
        let fake = FakeJob(id: 5)
        defer { withExtendedLifetime(fake) {} }
        #expect(stallmon_request_sweep() == 0)
        #expect(stallmon_request_may_be_open() == 0)
        let sweeps = stallmon_request_sweeps()

        tracer.withSpan("GET /sweep", ofKind: .server) { _ in
            #expect(stallmon_request_may_be_open() == 1)
            stallmon_request_inherit_for(here, fake.key)
            #expect(stallmon_request_sweep() == 1)
            #expect(stallmon_request_may_be_open() == 1)
            // The hook goes on working: the task it made serves the request.
            #expect(request(for: fake.key, taskID: 5)?.operation == "GET /sweep")
        }
        #expect(stallmon_request_sweeps() == sweeps + 1)
        #expect(stallmon_request_may_be_open() == 1)
        #expect(stallmon_request_sweep() == 0)
        #expect(stallmon_request_may_be_open() == 0)
        #expect(stallmon_request_sweep() == 0)
        #expect(stallmon_request_sweeps() == sweeps + 2)

        // A thread's span (a NIO handler's, on its event loop) is no task's: the hook, which sees no
        // task there, has nothing to inherit from it.
        let job = fake.key
        let thread = Thread {
            let span = tracer.startSpan("on a thread")
            #expect(stallmon_request_live() == 1)
            #expect(stallmon_request_may_be_open() == 0)
            stallmon_request_inherit_for(stallmon_request_current_key(), job)
            var (key, found) = (job, stallmon_request_found())
            #expect(stallmon_request_find(&key, 1, &found) == 0)
            span.end()
        }
        thread.start()
        while !thread.isFinished { usleep(1000) }
        #expect(stallmon_request_sweeps() == sweeps + 2)
        #expect(stallmon_request_live() == 0)
    }

    /// A span that starts while a sweep looks is not missed: with two threads sweeping all along,
    /// spans start and end in two tasks, and every one of them sees the sign set from its start to
    /// its end.
    @Test func aSpanStartingWhileSweepsLookKeepsTheSignSet() async {
        final class Race: Sendable {
            let stop = Atomic<Bool>(false)
            let misses = Atomic<Int>(0)
        }
        let tracer = StallmonTracer()
        let race = Race()
        let sweeps = stallmon_request_sweeps()
        // Threads of their own, each stopped at the latest 30 s on (a test that hangs tells nothing).
        let deadline = Date().addingTimeInterval(30)
        let sweepers = (0..<2).map { _ in
            Thread {
                while !race.stop.load(ordering: .relaxed), Date() < deadline { _ = stallmon_request_sweep() }
            }
        }
        for sweeper in sweepers { sweeper.start() }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<2 {
                group.addTask {
                    for _ in 0..<100_000 {
                        let span = tracer.startSpan("GET /race")
                        if stallmon_request_may_be_open() == 0 { race.misses.add(1, ordering: .relaxed) }
                        span.attributes["url.path"] = "/race"
                        if stallmon_request_may_be_open() == 0 { race.misses.add(1, ordering: .relaxed) }
                        span.end()
                    }
                }
            }
        }
        race.stop.store(true, ordering: .relaxed)
        while sweepers.contains(where: { !$0.isFinished }) { try? await Task.sleep(for: .milliseconds(1)) }
        #expect(race.misses.load(ordering: .relaxed) == 0)
        #expect(stallmon_request_sweeps() > sweeps + 100)
        #expect(stallmon_request_sweep() == 0)
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

    /// Outside a task, a span dropped without its end leaves the table with its last copy: a
    /// thread's registrations never lapse by themselves.
    @Test func aSpanDroppedWithoutItsEndOutsideATaskLeavesTheTable() {
        let thread = Thread {
            let key = stallmon_request_current_key()
            do {
                let span = StallmonTracer().startSpan("never ended")
                #expect(request(for: key)?.operation == "never ended")
                _ = span
            }
            #expect(request(for: key) == nil)
            #expect(stallmon_request_live() == 0)
        }
        thread.start()
        while !thread.isFinished { usleep(1000) }
    }

    /// In a task, a span registered and never withdrawn names the task's stalls while the task
    /// lives; once another task lives at its address (its ID differs), it is found no more, and the
    /// new task's first span takes its slot back.
    @Test func aSpanATaskNeverEndedLapsesWithTheTask() throws {
        try #require(Self.layoutVerified)
        let fake = FakeJob(id: 41)
        defer { withExtendedLifetime(fake) {} }
        let task = fake.key
        var found = stallmon_request_found()
        let refused = stallmon_request_refused()

        var leaked: UInt64 = 0
        var parts: UnsafeMutableRawPointer? = nil
        let slot = stallmon_request_register(task, 0, &leaked, &parts)
        #expect(slot >= 0)
        stallmon_request_publish(slot, leaked)
        #expect(stallmon_request_find_task(task, 41, &found) == 1 && found.slot == slot)

        // The task has ended, and another lives at its address.
        fake.id = 42
        #expect(stallmon_request_find_task(task, 42, &found) == 0)
        // A request's work wakes the new task: it inherits the request, the old span
        // notwithstanding.
        StallmonTracer().withSpan("GET /waker") { _ in
            stallmon_request_inherit_for(here, task)
            #expect(request(for: task, taskID: 42)?.operation == "GET /waker")
        }
        var sequence: UInt64 = 0
        let again = stallmon_request_register(task, 0, &sequence, &parts)
        stallmon_request_publish(again, sequence)
        #expect(again == slot && sequence != leaked)
        #expect(stallmon_request_refused() == refused)
        #expect(stallmon_request_live() == 1)
        // The old span's end, late, takes nothing from the new one.
        #expect(stallmon_request_withdraw(slot, leaked) == 0)
        #expect(stallmon_request_find_task(task, 42, &found) == 1 && found.sequence == sequence)
        #expect(stallmon_request_withdraw(again, sequence) == 1)
        #expect(stallmon_request_live() == 0)
    }

    /// The watchdog's lookup of a task reads nothing of the task: a span registered by a task whose
    /// memory is gone since (unmapped here, so that a read would fault) is still found by its
    /// address, and its ID is taken from no dead memory.
    @Test func aLookupOfATaskThatHasEndedReadsNothingOfIt() throws {
        try #require(Self.layoutVerified)
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let memory = try #require(
            mmap(nil, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).flatMap {
                $0 == MAP_FAILED ? nil : $0
            })
        memory.storeBytes(of: 41, toByteOffset: 36, as: UInt32.self)
        var task = UInt64(UInt(bitPattern: memory))
        var sequence: UInt64 = 0
        var parts: UnsafeMutableRawPointer? = nil
        let slot = stallmon_request_register(task, 0, &sequence, &parts)
        try #require(slot >= 0)
        stallmon_request_publish(slot, sequence)
        munmap(memory, page)
        var found = stallmon_request_found()
        #expect(stallmon_request_find(&task, 1, &found) == 1 && found.sequence == sequence)
        #expect(stallmon_request_withdraw(slot, sequence) == 1)
    }

    /// A span is three words: the frameworks start spans as `any Span`, and a larger one would be
    /// boxed, an allocation per span.
    @Test func aSpanFitsAnExistentialsInlineBuffer() {
        #expect(MemoryLayout<StallmonSpan>.size <= 3 * MemoryLayout<Int>.size)
    }

    /// A span's attributes reach the report whether set one at a time or in a batch, later sets
    /// before earlier ones, and the current names before the older ones.
    @Test func attributesSetInBatchesAndOneAtATimeReachTheReport() {
        let tracer = StallmonTracer()
        tracer.withSpan("GET /batch", ofKind: .server) { span in
            span.updateAttributes { attributes in
                attributes["http.method"] = "POST"
                attributes["http.target"] = "/old/7"
                attributes["user_agent.original"] = "curl"
            }
            #expect(request(for: here)?.method == "POST")
            #expect(request(for: here)?.path == "/old/7")
            span.updateAttributes { attributes in
                attributes["http.request.method"] = "GET"
                attributes["url.path"] = "/batch/7"
                attributes["rpc.service"] = "Echo"
            }
            span.attributes["rpc.method"] = "Get"
            #expect(request(for: here)?.method == "GET")
            #expect(request(for: here)?.path == "/batch/7")
            #expect(request(for: here)?.rpcMethod == "Echo/Get")
            // Past the sets kept one by one, the last takes the rest.
            for index in 0..<20 { span.attributes["extra.\(index)"] = index }
            span.attributes["http.route"] = "/batch/:id"
            #expect(request(for: here)?.route == "/batch/:id")
            span.operationName = "GET /batch/:id"
            #expect(span.operationName == "GET /batch/:id")
            #expect(request(for: here)?.operation == "GET /batch/:id")
        }
        // The next span in the slot says nothing of the last one's.
        tracer.withSpan("GET /next") { _ in
            #expect(request(for: here)?.operation == "GET /next")
            #expect(request(for: here)?.method == "")
            #expect(request(for: here)?.route == "")
        }
    }

    /// Spans start, set attributes and end in many tasks at once while a reader (the monitor's
    /// part) reads them: a report never mixes two spans' parts, and never reads a span that ended.
    @Test(arguments: [false, true])
    func readersNeverSeeHalfASpan(wrapping: Bool) async {
        let tracer = wrapping ? StallmonTracer(wrapping: InMemoryTracer()) : StallmonTracer()
        let keys = Keys()
        let stop = Atomic<Bool>(false)
        let mismatches = Atomic<Int>(0)
        let reads = Atomic<Int>(0)
        let reader = Thread {
            var found = stallmon_request_found()
            while !stop.load(ordering: .relaxed) {
                for var key in keys.all() where stallmon_request_find(&key, 1, &found) != 0 {
                    guard let request = SpanTableReader().request(slot: found.slot, sequence: found.sequence)
                    else { continue }
                    reads.add(1, ordering: .relaxed)
                    // "op <n>" goes with "/<n>" (or no path yet).
                    let number = request.operation.dropFirst(3)
                    if !request.operation.hasPrefix("op ") || !(request.path.isEmpty || request.path == "/\(number)") {
                        mismatches.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        reader.start()
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    keys.add(stallmon_request_current_key())
                    for index in 0..<20_000 {
                        let number = worker * 100_000 + index
                        if wrapping, index % 100 == 0 { tracer.withSpan("op \(number)") { _ in } }
                        tracer.withSpan("op \(number)") { span in
                            span.attributes["url.path"] = "/\(number)"
                            span.attributes["http.request.method"] = "GET"
                        }
                    }
                }
            }
        }
        stop.store(true, ordering: .relaxed)
        while !reader.isFinished { try? await Task.sleep(for: .milliseconds(1)) }
        #expect(mismatches.load(ordering: .relaxed) == 0)
        #expect(reads.load(ordering: .relaxed) > 0)
        #expect(stallmon_request_live() == 0)
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
}

private struct DictionaryExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

private struct DictionaryInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}

/// The keys of the tasks a test runs, for a reader thread. (An NSLock: ThreadSanitizer, which this
/// test is run under too, does not see Synchronization.Mutex's ordering.)
private final class Keys: @unchecked Sendable {
    private let lock = NSLock()
    private var keys: [UInt64] = []

    func add(_ key: UInt64) { lock.withLock { keys.append(key) } }
    func all() -> [UInt64] { lock.withLock { keys } }
}

/// A fake runtime job (see requests.c): zeroed, so a task by its kind (the byte at 32), with its ID
/// at 36; freed with the object, which a test keeps alive while the table may read it.
private final class FakeJob {
    private let memory = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 64)

    init(id: UInt32) {
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: 128)
        self.id = id
    }

    deinit { memory.deallocate() }

    /// Its key in the table: its address.
    var key: UInt64 { UInt64(UInt(bitPattern: memory)) }

    var id: UInt32 {
        get { memory.load(fromByteOffset: 36, as: UInt32.self) }
        set { memory.storeBytes(of: newValue, toByteOffset: 36, as: UInt32.self) }
    }

    /// 0: a task; 1: an actor's job.
    var kind: UInt8 {
        get { memory.load(fromByteOffset: 32, as: UInt8.self) }
        set { memory.storeBytes(of: newValue, toByteOffset: 32, as: UInt8.self) }
    }
}
