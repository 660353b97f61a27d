import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// An async service on swift-service-lifecycle (Sources/StallmonServiceFixture): its monitor is a
    /// `StallMonitorService` in a real `ServiceGroup`, started in `main()` before the group runs.
    @Suite
    struct ServiceLifecycleTests {
        struct Outcome {
            var lines: [[String: Any]]
            var status: Int32
            var errors: String

            func of(_ type: String) -> [[String: Any]] { lines.filter { $0.string("type") == type } }
            func index(_ type: String) -> Int? { lines.firstIndex { $0.string("type") == type } }
            /// The main actor's monitor's event (the cooperative pool, watched by default for an
            /// async main, has its own `started` and `stopped`).
            func mainIndex(_ type: String) -> Int? {
                lines.firstIndex { $0.string("type") == type && $0.string("STALL_LOOP") == "main" }
            }
        }

        /// Runs a scenario; with `sigterm`, sends SIGTERM once the worker has stalled and says it is ready.
        static func run(_ scenario: String, sigterm: Bool, arguments: [String] = []) throws -> Outcome {
            let running = try Executable.serviceFixture.start([scenario] + arguments)
            let ready = running.waitForOutput(timeout: 20) { output, _ in output.contains(#""type":"ready""#) }
            let result: Executable.Result
            if sigterm, ready {
                result = running.terminate(grace: 10)
            } else {
                let killer = DispatchWorkItem { if running.process.isRunning { running.signal(SIGKILL) } }
                DispatchQueue.global().asyncAfter(deadline: .now() + 20, execute: killer)
                result = running.wait()
                killer.cancel()
            }
            try #require(ready, "the worker never got ready\n\(result.output)\n\(result.errors)")
            let lines = result.output.split(separator: "\n").compactMap { line in
                (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            }
            return Outcome(lines: lines, status: result.status, errors: result.errors)
        }

        /// The stall the worker caused, as reported, against its truth.
        static func expectMainActorStallReported(_ outcome: Outcome) throws {
            let truth = try #require(outcome.of("truth").first)
            #expect(truth["main_thread"] as? Bool == true, "main-actor work ran off the main thread")
            try #require(outcome.of("detected").count == 1, "\(outcome.lines)\n\(outcome.errors)")
            let ended = try #require(outcome.of("ended").first)
            #expect(ended.string("STALL_CALLOUT") == "main-actor")
            #expect(ended.string("STALL_LOOP") == "main")
            #expect(
                ended.string("STALL_FRAME").hasPrefix("Work.render(milliseconds:)"), "\(ended.string("STALL_FRAME"))")
            let duration = ended.milliseconds("STALL_DURATION_USEC")
            let trueDuration = truth.number("duration_ns") / 1e6
            #expect(abs(duration - trueDuration) <= 15, "reported \(duration) ms, true \(trueDuration) ms")
        }

        @Test func sigtermShutsTheGroupDownGracefullyAndTheMonitorStopsLastWithItsSummary() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let identifier = "stallmon-service-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let outcome = try Self.run("sigterm", sigterm: true, arguments: ["--journal", "--identifier", identifier])
            // A graceful shutdown, not a death by signal.
            #expect(outcome.status == 0, "\(outcome.errors)")
            try Self.expectMainActorStallReported(outcome)

            // The worker shut down first, then the monitor stopped with its summary, then main() returned.
            let shutdown = try #require(outcome.index("worker-shutdown"), "\(outcome.lines)")
            let stopped = try #require(outcome.mainIndex("stopped"), "no stopped event\n\(outcome.errors)")
            let exited = try #require(outcome.index("exited"), "\(outcome.lines)")
            #expect(shutdown < stopped && stopped < exited)
            #expect(outcome.of("stopped").count == 2, "the main actor's and the pool's")
            #expect(outcome.lines[stopped].string(MonitorField.stalls) == "1")
            #expect(outcome.lines[exited]["running"] as? Bool == false)
            #expect(outcome.lines[exited].number("stalls") == 1)

            // The same from the journal.
            let ended = try Journald.host.entries(
                ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)"])
            #expect(ended.count == 1 && ended.first?["STALL_CALLOUT"] == "main-actor")
            let lifecycle = try Journald.host.entries(
                ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.monitorLifecycle)"], atLeast: 2)
            let main = lifecycle.filter { $0["STALL_LOOP"] == "main" }
            #expect(main.map { $0[MonitorField.event] } == ["started", "stopped"])
            #expect(main.last?[MonitorField.stalls] == "1")
            #expect(lifecycle.filter { $0["STALL_LOOP"] == "cooperative-pool" }.count == 2)
        }

        @Test func aServiceThatReturnsEndsTheGroupAndTheCancelledMonitorStillStops() throws {
            let outcome = try Self.run("return", sigterm: false)
            #expect(outcome.status == 0, "\(outcome.errors)")
            try Self.expectMainActorStallReported(outcome)
            let returned = try #require(outcome.index("worker-returned"))
            let stopped = try #require(outcome.mainIndex("stopped"), "no stopped event\n\(outcome.errors)")
            let groupError = try #require(outcome.index("group-error"), "\(outcome.errors)")
            let exited = try #require(outcome.index("exited"))
            #expect(returned < stopped && stopped < groupError && groupError < exited)
            #expect(outcome.lines[groupError].string("description").contains("finished unexpectedly"))
            #expect(outcome.of("stopped").count == 2, "the main actor's and the pool's")
            #expect(outcome.lines[exited]["running"] as? Bool == false)
        }
    }
}
