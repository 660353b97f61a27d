import CStallCapture
import Foundation
import InMemoryTracing
import StallMonitorTracing
import StallmonBenchTracer
import Synchronization
import Tracing

/// What `StallmonTracer` adds to a span, and the pool hook to a job enqueued inside a request
/// (issue #20's goals: at most 100 ns a span; nothing for a job while no span is open, a few ns
/// while one is). In process, in a task, as a server's request spans start (a framework's
/// middleware runs in the request's task, and starts its span through `any LegacyTracer`): the
/// least of `runs` runs of `spans` spans, each with the two attributes a server span gets first,
/// set one at a time.
///
/// - `span_cost_ns`: `StallmonTracer()` alone, over `NoOpTracer`: the whole of a span of a service
///   without a tracing backend.
/// - `span_cost_outside_task_ns`: the same on a thread outside any task (a span a NIO handler
///   starts on its event loop), where a span allocates its registration's keeper.
/// - `span_wrapped_cost_ns`: `StallmonTracer(wrapping:)` around a tracer that records as
///   swift-otel's does (its span a class with a lock; `RecordingTracer`, in a module of its own and
///   handed out as an opaque `some Tracer`, as swift-otel's backend hands out its tracer), over that
///   tracer alone: what wrapping adds. Its spans cost a few hundred ns, so the difference stands above
///   the noise.
/// - `span_wrapped_in_memory_cost_ns`: the same around swift-distributed-tracing's `InMemoryTracer`,
///   whose span is a large struct: about 2.6 µs a span, which drifts between runs by more than
///   wrapping adds.
/// - `span_cost_ns_all_cpus`: `span_cost_ns` with a task on every CPU starting spans at once.
/// - `pool_enqueue_idle_ns`: the pool hook's added work per job enqueued outside any request, once
///   the spans have ended and a sweep has seen it (the pool's watchdog sweeps as it parks, and once
///   a second while the pool is busy).
/// - `pool_enqueue_in_request_ns`: per job enqueued by a request's work (the job inherits it).
/// - `pool_sweep_us`: a sweep of the table that finds no span open (a whole pass), which the
///   watchdog makes as it parks and at most once a second while the pool is busy, when a task's
///   span has started since its last.
enum TracingCost {
    static func figures(scale: Double) -> [Figure] {
        let spans = max(20_000, Int(200_000 * scale))
        let runs = 5
        let (noop, alone) = inTask { leastInTurns(runs, NoOpTracer(), StallmonTracer(), spans) }
        let (outsideNoop, outsideAlone) = leastInTurns(runs, NoOpTracer(), StallmonTracer(), spans)
        let (recorded, wrappedRecorded) = inTask {
            let recording = makeRecordingTracer()
            let least = leastInTurns(runs, recording.factory, StallmonTracer(wrapping: recording.factory), spans)
            // Every span ended, wrapped or not: the figure is of spans that did their work.
            check(
                recording.ended.spans == 2 * runs * spans, "\(recording.ended.spans) of \(2 * runs * spans) spans ended"
            )
            return least
        }
        // InMemoryTracer keeps every span: fewer of them, cleared after each run, and runs of each in
        // turn.
        let (memory, wrapped) = inTask {
            let recording = InMemoryTracer()
            let wrapping = StallmonTracer(wrapping: recording)
            var (memory, wrapped) = (Double.infinity, Double.infinity)
            for _ in 0..<9 {
                memory = min(memory, perSpan(recording, spans / 10))
                recording.clearAll()
                wrapped = min(wrapped, perSpan(wrapping, spans / 10))
                let finished = recording.finishedSpans
                check(
                    finished.count == spans / 10
                        && finished.last?.attributes["url.path"]?.toSpanAttribute() == "/users/42",
                    "the wrapped InMemoryTracer finished \(finished.count) of \(spans / 10) spans, the last with "
                        + "attributes \(finished.last.map { "\($0.attributes)" } ?? "none")")
                recording.clearAll()
            }
            return (memory, wrapped)
        }
        let jobs = max(100_000, Int(1_000_000 * scale))
        // Every span has ended: the sweep the watchdog makes next finds none open.
        check(stallmon_request_sweep() == 0, "a span is still open after the spans' runs")
        let idle = least(runs) { stallmon_request_measure_inherit_ns(jobs, 0) }
        let sweep = least(runs) {
            // A task's span (a thread's leaves the sign alone: the hook inherits from tasks only).
            inTask { StallmonTracer().withSpan("GET /sweep") { _ in } }
            let (sweeps, start) = (stallmon_request_sweeps(), DispatchTime.now().uptimeNanoseconds)
            let open = stallmon_request_sweep()
            let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e3
            check(open == 0, "a sweep found a span open after its end")
            check(stallmon_request_sweeps() == sweeps + 1, "the sweep did not look at the table")
            return elapsed
        }
        let inRequest = inTask {
            StallmonTracer().withSpan("GET /bench", ofKind: .server) { _ in
                least(runs) { stallmon_request_measure_inherit_ns(jobs, stallmon_request_current_key()) }
            }
        }
        var figures: [Figure] = []
        func add(_ key: String, _ target: Target?, _ value: Double) {
            var figure = Figure(key, target)
            figure.values = [value]
            figures.append(figure)
        }
        add("span_cost_ns", .atMost(100), alone - noop)
        add("span_cost_outside_task_ns", nil, outsideAlone - outsideNoop)
        // The same on every CPU at once: what the spans' shared state costs under contention.
        let tasks = ProcessInfo.processInfo.activeProcessorCount
        let parallelNoop = parallel(tasks) { perSpan(NoOpTracer(), spans) }
        let parallelAlone = parallel(tasks) { perSpan(StallmonTracer(), spans) }
        add("span_cost_ns_all_cpus", nil, parallelAlone - parallelNoop)
        add("span_wrapped_cost_ns", .atMost(100), wrappedRecorded - recorded)
        add("span_wrapped_in_memory_cost_ns", nil, wrapped - memory)
        add("pool_enqueue_idle_ns", .atMost(1), idle)
        add("pool_enqueue_in_request_ns", .atMost(10), inRequest)
        add("pool_sweep_us", nil, sweep)
        return figures
    }

    /// Stops the benchmark if what it measured did not do its work (a tracer's spans, a sweep): its
    /// figures would be of work skipped.
    private static func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        guard !condition else { return }
        FileHandle.standardError.write(Data("stallmon-bench: tracing: \(message())\n".utf8))
        exit(1)
    }

    /// `body`'s result, run in a task of its own (the benchmark's caller runs outside any).
    private static func inTask<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Mutex<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task.detached {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }

    /// The least over 3 runs of the mean of `measure` run in `tasks` tasks at once (the cooperative
    /// pool has a thread per CPU).
    private static func parallel(_ tasks: Int, _ measure: @escaping @Sendable () -> Double) -> Double {
        least(3) {
            let results = Results()
            let group = DispatchGroup()
            for _ in 0..<tasks {
                group.enter()
                Task.detached {
                    let value = measure()
                    results.values.withLock { $0.append(value) }
                    group.leave()
                }
            }
            group.wait()
            let values = results.values.withLock { $0 }
            return values.reduce(0, +) / Double(max(1, values.count))
        }
    }

    /// The least of `runs` runs of `spans` spans of each tracer, a run of each in turn: a burst of
    /// the machine's noise then weighs on both, not on every run of one.
    private static func leastInTurns(
        _ runs: Int, _ first: any Tracer, _ second: any Tracer, _ spans: Int
    ) -> (Double, Double) {
        var least = (Double.infinity, Double.infinity)
        for _ in 0..<runs {
            least.0 = min(least.0, perSpan(first, spans))
            least.1 = min(least.1, perSpan(second, spans))
        }
        return least
    }

    private final class Results: Sendable {
        let values = Mutex<[Double]>([])
    }

    private static func least(_ runs: Int, _ measure: () -> Double) -> Double {
        (0..<runs).map { _ in measure() }.min() ?? .nan
    }

    /// Nanoseconds per span: started, given a method and a path, ended. As an `any Span`, the way
    /// swift-distributed-tracing's global `withSpan` and `startSpan`, which the frameworks' tracing
    /// middlewares call, start spans with `InstrumentationSystem.legacyTracer` (a span larger than 3
    /// words is boxed).
    private static func perSpan(_ tracer: any Tracer, _ count: Int) -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<count {
            tracer.withAnySpan("GET /users/:id", ofKind: .server) { span in
                span.attributes["http.request.method"] = "GET"
                span.attributes["url.path"] = "/users/42"
            }
        }
        let elapsed = DispatchTime.now().uptimeNanoseconds - start
        return Double(elapsed) / Double(count)
    }
}
