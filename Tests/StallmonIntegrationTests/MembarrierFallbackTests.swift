import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// The park handshake where membarrier(2) is refused: a seccomp filter installed before the
    /// monitor starts leaves it with fences on both sides; one installed after makes it poll.
    @Suite
    struct MembarrierFallbackTests {
        @Test(arguments: ["before", "after"])
        func stallIsReportedWithMembarrierDenied(_ when: String) throws {
            let run = try FixtureRun.run("timer-cpu", arguments: ["--deny-membarrier", when])
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            try #require(run.detected.count == 1, "detected reports: \(run.detected.count)\n\(run.standardError)")
            try #require(run.ended.count == 1)
            let truth = try #require(run.truth("timer-cpu"))
            let duration = run.ended[0].milliseconds("STALL_DURATION_USEC")
            #expect(duration >= truth - 1 && duration <= truth + 15, "reported \(duration) ms, true \(truth) ms")
        }

        /// Denied before the start, the watchdog parks on an idle loop as it does with membarrier;
        /// denied after, it wakes once per threshold (100 ms) instead of spinning or parking unsafely.
        @Test(arguments: [("before", 0...2), ("after", 5...20)])
        func idleWatchdogWakeups(_ when: String, _ expected: ClosedRange<Int>) throws {
            var wakeups: Int?
            let run = try FixtureRun.run("idle", arguments: ["--seconds", "3", "--deny-membarrier", when]) { pid in
                usleep(1_000_000)
                wakeups = NamedThread(named: "stallmon-watch", in: pid)?.wakeups(over: 1_000_000)
            }
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty)
            let measured = try #require(wakeups, "no watchdog thread found")
            #expect(expected.contains(measured), "\(measured) watchdog wakeups in 1 s of idle")
        }
    }
}
