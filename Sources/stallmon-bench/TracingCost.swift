import CStallCapture
import Foundation
import InMemoryTracing
import StallMonitorTracing
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
/// - `span_wrapped_cost_ns`: `StallmonTracer(wrapping: InMemoryTracer())` over `InMemoryTracer()`:
///   what it adds around a tracer that records.
/// - `span_cost_ns_all_cpus`: `span_cost_ns` with a task on every CPU starting spans at once.
/// - `pool_enqueue_idle_ns`: the pool hook's added work per job enqueued outside any request, in a
///   process that has opened spans (one that never did pays one load).
/// - `pool_enqueue_in_request_ns`: per job enqueued by a request's work (the job inherits it).
enum TracingCost {
    static func figures(scale: Double) -> [Figure] {
        let spans = max(20_000, Int(200_000 * scale))
        let runs = 5
        let (noop, alone) = inTask {
            (least(runs) { perSpan(NoOpTracer(), spans) }, least(runs) { perSpan(StallmonTracer(), spans) })
        }
        let outsideNoop = least(runs) { perSpan(NoOpTracer(), spans) }
        let outsideAlone = least(runs) { perSpan(StallmonTracer(), spans) }
        // InMemoryTracer keeps every span: fewer of them, cleared after each run, and runs of each in
        // turn (its spans cost about 2.6 µs, and drift between runs more than wrapping adds).
        let (memory, wrapped) = inTask {
            let recording = InMemoryTracer()
            let wrapping = StallmonTracer(wrapping: recording)
            var (memory, wrapped) = (Double.infinity, Double.infinity)
            for _ in 0..<9 {
                memory = min(memory, perSpan(recording, spans / 10))
                recording.clearAll()
                wrapped = min(wrapped, perSpan(wrapping, spans / 10))
                recording.clearAll()
            }
            return (memory, wrapped)
        }
        let jobs = max(100_000, Int(1_000_000 * scale))
        let idle = least(runs) { stallmon_request_measure_inherit_ns(jobs, 0) }
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
        add("span_wrapped_cost_ns", .atMost(100), wrapped - memory)
        add("pool_enqueue_idle_ns", .atMost(1), idle)
        add("pool_enqueue_in_request_ns", .atMost(10), inRequest)
        return figures
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
