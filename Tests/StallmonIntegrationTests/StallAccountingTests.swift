// timespec: MemberImportVisibility finds it in CStallCapture since stallmond-daemon brings in CStallWatch.
import CStallCapture
import CoreFoundation
import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

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

        /// The wall clock stepped back 150 ms in the middle of a 600 ms stall (as NTP or a VM's
        /// clock resync may), and forward again after it: the watchdog's semaphore wait, which ends
        /// at a wall-clock deadline, wakes 150 ms late, and that is no stop. Before, the stall was
        /// reported as 451 ms with 150 ms "paused". Sets the machine's clock (root; restored).
        @Test func aStepBackOfTheWallClockDuringAStallLeavesItsDurationWhole() throws {
            func stepWallClock(by seconds: Double) -> Bool {
                var now = timespec()
                clock_gettime(CLOCK_REALTIME, &now)
                let target = Double(now.tv_sec) + Double(now.tv_nsec) / 1e9 + seconds
                var stepped = timespec(
                    tv_sec: Int(target.rounded(.down)), tv_nsec: Int((target - target.rounded(.down)) * 1e9))
                return clock_settime(CLOCK_REALTIME, &stepped) == 0
            }
            var stepped = false
            // The stall runs from 0.3 s to 0.9 s after the start; it is detected at 0.4 s.
            let run = try FixtureRun.run("blocked-poll") { _ in
                usleep(650_000)
                stepped = stepWallClock(by: -0.15)
                usleep(700_000)
                if stepped { _ = stepWallClock(by: 0.15) }
            }
            try #require(stepped, "cannot set the wall clock: \(String(cString: strerror(errno)))")
            #expect(run.exitStatus == 0)
            let truth = try #require(run.truth("blocked-poll"))
            let ended = try #require(run.ended.first)
            let duration = ended.milliseconds("STALL_DURATION_USEC")
            #expect(abs(duration - truth) <= 15, "reported \(duration) ms, true \(truth) ms")
            #expect(ended.number("paused_ns") < 5e6, "\(ended.number("paused_ns") / 1e6) ms taken for a stop")
        }
    }
}
