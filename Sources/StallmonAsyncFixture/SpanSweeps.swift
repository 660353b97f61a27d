import CStallCapture
import StallMonitorTracing
import StallmonFixtureKit
import Tracing

/// The `pool-spans` scenario: the pool's watchdog sweeps the table of open spans as it works, so
/// that the pool hook does nothing between requests and goes on inheriting inside them. One line
/// a moment (`type` "spans"), with whether a task's span may be open by the hook's sign, the sweeps
/// that looked at the table so far and the aliases the hook made:
/// - `before`: no span yet;
/// - `busy`: inside a span, after 2.5 s of short pool jobs back to back (the watchdog never parks,
///   and sweeps once a second);
/// - `parked`: in the same span, after 0.4 s of an idle pool (the watchdog parks, and sweeps as it
///   does), and a task made then (`child_found`: it serves the span);
/// - `after`: 1 s after the span's end (`waited_ns`), the main actor waiting, so that no job runs on
///   the pool then (it parks, and the pool's watchdog makes no wakeup of its own);
/// - `again`: inside the next span, and a task made there.
@MainActor
enum SpanSweeps {
    static func run() async throws {
        let tracer = StallmonTracer()
        report("before")
        let ended = try await Task.detached {
            try await tracer.withSpan("GET /spans", ofKind: .server) { _ in
                let end = Fixture.now() + 2_500_000_000
                while Fixture.now() < end {
                    PoolWork.crunch(cpuMilliseconds: 1)
                    await Task.yield()
                }
                report("busy")
                try await Task.sleep(for: .milliseconds(400))
                report("parked", ["child_found": await childFindsItsRequest()])
            }
            return Fixture.now()
        }.value
        // One wait, with no job in between: the pool's idle.
        try await Task.sleep(for: .seconds(1))
        report("after", ["waited_ns": Int(Fixture.now() - ended)])
        await Task.detached {
            await tracer.withSpan("GET /again", ofKind: .server) { _ in
                report("again", ["child_found": await childFindsItsRequest()])
            }
        }.value
    }

    /// Whether a task made here serves the request this task serves, as a stall of it would say.
    nonisolated private static func childFindsItsRequest() async -> Bool {
        await Task {
            var key = stallmon_request_current_key()
            var found = stallmon_request_found()
            return stallmon_request_find(&key, 1, &found) == 1 && found.depth == 0
        }.value
    }

    nonisolated private static func report(_ moment: String, _ more: [String: Any] = [:]) {
        Fixture.print(
            [
                "type": "spans", "moment": moment, "may_be_open": stallmon_request_may_be_open() == 1,
                "sweeps": Int(stallmon_request_sweeps()), "inherited": Int(stallmon_request_inherited()),
            ].merging(more) { $1 })
    }
}
