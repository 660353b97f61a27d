import Foundation
import Testing

extension Serial {
    /// A report's CPU time and duration against what the stalled code measured itself: its own
    /// CPU clock (`CLOCK_THREAD_CPUTIME_ID`), and the wall time it was neither running nor
    /// waiting for a CPU (stopped).
    @Suite
    struct StallAccountingTests {
        @Test func cpuTimeOfABusyStallIsTheThreadsCPUClock() throws {
            let run = try FixtureRun.run("timer-cpu")
            #expect(run.exitStatus == 0)
            let truth = try #require(run.truths.first).number("cpu_ns") / 1e6
            let ended = try #require(run.ended.first).milliseconds("STALL_CPU_USEC")
            // The window holds the callout and a little of the loop around it. Readings between
            // samples leave an error of a millisecond or two on a busy machine.
            #expect(abs(ended - truth) <= truth * 0.005 + 1.5, "reported \(ended) ms, thread used \(truth) ms")
        }

        @Test(arguments: ["lock-wait", "main-queue-syscall"])
        func cpuTimeOfAWaitGrowsFromDetectedToEndedReport(_ scenario: String) throws {
            let run = try FixtureRun.run(scenario)
            #expect(run.exitStatus == 0)
            let truth = try #require(run.truths.first).number("cpu_ns") / 1e6
            let detected = try #require(run.detected.first).milliseconds("STALL_CPU_USEC")
            let ended = try #require(run.ended.first).milliseconds("STALL_CPU_USEC")
            #expect(detected <= ended, "detected \(detected) ms, ended \(ended) ms")
            #expect(ended >= truth - 1 && ended <= truth + 1.5, "reported \(ended) ms, thread used \(truth) ms")
        }

        /// Three stops of 200 ms inside a 2 s stall, sampled every 50 ms: each stop begins
        /// anywhere between two samples, and may come during one.
        @Test func stopsDuringAStallAreLeftOutOfItsDuration() throws {
            let run = try FixtureRun.run("stopped-stall", arguments: ["--sample-interval-ms", "50"])
            #expect(run.exitStatus == 0)
            let truth = try #require(run.truths.first).number("duration_ns") / 1e6
            let stopped = try #require(run.lines.first { $0["type"] as? String == "pause" }).number("duration_ns") / 1e6
            let ended = try #require(run.ended.first)
            let duration = ended.number("duration_ns") / 1e6
            try #require(stopped >= 550, "the shell stopped the process for \(stopped) ms only")
            let error = duration - (truth - stopped)
            #expect(error > -5 && error < 20, "reported \(duration) ms, stalled \(truth - stopped) ms")
        }
    }
}
