import CStallCapture
import Foundation
import InMemoryTracing
import StallMonitorTracing
import Synchronization
import Tracing

/// What `StallmonTracer` adds to a span, and the pool hook to a job enqueued inside a request
/// (issue #20's goals: at most 100 ns a span; nothing for a job while no span is open, a few ns
/// while one is). In process, on one thread: the least of `runs` runs of `spans` spans, each with
/// the two attributes a server span gets first, through `withSpan`.
///
/// - `span_cost_ns`: `StallmonTracer()` alone, over `NoOpTracer` (which costs next to nothing):
///   the whole of a span of a service without a tracing backend.
/// - `span_wrapped_cost_ns`: `StallmonTracer(wrapping: InMemoryTracer())` over `InMemoryTracer()`:
///   what it adds around a tracer that records.
/// - `span_cost_ns_all_cpus`: `span_cost_ns` with a thread on every CPU starting spans at once.
/// - `pool_enqueue_idle_ns`: the pool hook's added work per job enqueued outside any request, in a
///   process that has opened spans (one that never did pays one load).
/// - `pool_enqueue_in_request_ns`: per job enqueued by a request's work (the job inherits it).
enum TracingCost {
    static func figures(scale: Double) -> [Figure] {
        let spans = max(20_000, Int(200_000 * scale))
        let runs = 5
        let noop = least(runs) { perSpan(NoOpTracer(), spans) }
        let alone = least(runs) { perSpan(StallmonTracer(), spans) }
        // InMemoryTracer keeps every span: fewer of them, and cleared after each run.
        let recording = InMemoryTracer()
        let memory = least(runs) {
            defer { recording.clearAll() }
            return perSpan(recording, spans / 10)
        }
        let wrapped = least(runs) {
            defer { recording.clearAll() }
            return perSpan(StallmonTracer(wrapping: recording), spans / 10)
        }
        let jobs = max(100_000, Int(1_000_000 * scale))
        let idle = least(runs) { stallmon_request_measure_inherit_ns(jobs, 0) }
        let tracer = StallmonTracer()
        let inRequest = tracer.withSpan("GET /bench", ofKind: .server) { _ in
            least(runs) { stallmon_request_measure_inherit_ns(jobs, stallmon_request_current_key()) }
        }
        var figures: [Figure] = []
        func add(_ key: String, _ target: Target?, _ value: Double) {
            var figure = Figure(key, target)
            figure.values = [value]
            figures.append(figure)
        }
        add("span_cost_ns", .atMost(100), alone - noop)
        // The same on every CPU at once: what the spans' shared counters cost under contention.
        let threads = ProcessInfo.processInfo.activeProcessorCount
        let parallelNoop = parallel(threads) { perSpan(NoOpTracer(), spans) }
        let parallelAlone = parallel(threads) { perSpan(StallmonTracer(), spans) }
        add("span_cost_ns_all_cpus", nil, parallelAlone - parallelNoop)
        add("span_wrapped_cost_ns", .atMost(100), wrapped - memory)
        add("pool_enqueue_idle_ns", .atMost(1), idle)
        add("pool_enqueue_in_request_ns", .atMost(10), inRequest)
        return figures
    }

    /// The least over 3 runs of the mean of `measure` run on `threads` threads at once.
    private static func parallel(_ threads: Int, _ measure: @escaping @Sendable () -> Double) -> Double {
        least(3) {
            let results = Mutex<[Double]>([])
            let group = DispatchGroup()
            for _ in 0..<threads {
                group.enter()
                Thread.detachNewThread {
                    let value = measure()
                    results.withLock { $0.append(value) }
                    group.leave()
                }
            }
            group.wait()
            let values = results.withLock { $0 }
            return values.reduce(0, +) / Double(max(1, values.count))
        }
    }

    private static func least(_ runs: Int, _ measure: () -> Double) -> Double {
        (0..<runs).map { _ in measure() }.min() ?? .nan
    }

    /// Nanoseconds per span: started, given a method and a path, ended.
    private static func perSpan<T: Tracer>(_ tracer: T, _ count: Int) -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<count {
            tracer.withSpan("GET /users/:id", ofKind: .server) { span in
                span.attributes["http.request.method"] = "GET"
                span.attributes["url.path"] = "/users/42"
            }
        }
        let elapsed = DispatchTime.now().uptimeNanoseconds - start
        return Double(elapsed) / Double(count)
    }
}
