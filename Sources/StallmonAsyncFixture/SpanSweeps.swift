import CStallCapture
import StallMonitorTracing
import StallmonFixtureKit
import Tracing

/// The `pool-spans` scenario: the pool's watchdog sweeps the table of open spans as it works, so
/// that the pool hook does nothing between requests and goes on inheriting inside them. One line
/// a moment (`type` "spans"), with whether a span may be open by the hook's sign, the sweeps that
/// looked at the table so far and the aliases the hook made:
/// - `before`: no span yet;
/// - `inside`: a span open for 2 s, the pool busy with short jobs for 1.5 s (the watchdog never
///   parks) then idle for 0.5 s (it parks), and a task made then (`child_found`: it serves the span);
/// - `after`: once the sign is clear after the span's end, or 3 s later (`cleared_ns`: how long
///   after, 0 if it stayed set);
/// - `again`: inside the next span, and a task made there.
enum SpanSweeps {
    static func run() async throws {
        let tracer = StallmonTracer()
        report("before")
        try await tracer.withSpan("GET /spans", ofKind: .server) { _ in
            let end = Fixture.now() + 1_500_000_000
            while Fixture.now() < end {
                PoolWork.crunch(cpuMilliseconds: 1)
                await Task.yield()
            }
            try await Task.sleep(for: .milliseconds(500))
            report("inside", ["child_found": await childFindsItsRequest()])
        }
        let ended = Fixture.now()
        while stallmon_request_may_be_open() != 0, Fixture.now() - ended < 3_000_000_000 {
            try await Task.sleep(for: .milliseconds(5))
        }
        report("after", ["cleared_ns": stallmon_request_may_be_open() == 0 ? Int(Fixture.now() - ended) : 0])
        await tracer.withSpan("GET /again", ofKind: .server) { _ in
            report("again", ["child_found": await childFindsItsRequest()])
        }
    }

    /// Whether a task made here serves the request this task serves, as a stall of it would say.
    private static func childFindsItsRequest() async -> Bool {
        await Task {
            var key = stallmon_request_current_key()
            var found = stallmon_request_found()
            return stallmon_request_find(&key, 1, &found) == 1 && found.depth == 0
        }.value
    }

    private static func report(_ moment: String, _ more: [String: Any] = [:]) {
        Fixture.print(
            [
                "type": "spans", "moment": moment, "may_be_open": stallmon_request_may_be_open() == 1,
                "sweeps": Int(stallmon_request_sweeps()), "inherited": Int(stallmon_request_inherited()),
            ].merging(more) { $1 })
    }
}
