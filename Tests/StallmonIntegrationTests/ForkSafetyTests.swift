import Foundation
import StallmonTestSupport
import Testing

extension Serial {
    /// `fork()` in a service the monitor watches (the async fixture's `pool-forks` scenario, as a
    /// child process): the child has the forking thread alone, and must not find a lock held, or a
    /// pool thread named, by a thread it does not have.
    @Suite
    struct ForkSafetyTests {
        /// Forks in a loop from a pool task while spans start and end on other threads (some ended
        /// under their slot's lock, held as a reader's copy holds it) and the main actor's stall is
        /// sampled: every child starts spans under the keys the parent was using and one of its
        /// own, finds the pool's slots naming no thread but itself, and exits.
        @Test func everyChildOfForkWithSpansAndSamplesInFlightExits() throws {
            let run = try FixtureRun.run(
                "pool-forks", arguments: ["--seconds", "4", "--threshold-ms", "100"], timeout: 60,
                executable: .asyncFixture)
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let forks = try #require(run.lines.first { $0.string("type") == "forks" }, "\(run.standardError)")
            #expect(forks.number("forked") >= 50, "\(forks)")
            #expect(forks.number("hung") == 0, "\(forks)")
            #expect((forks["failed"] as? [Any])?.isEmpty == true, "\(forks)")
            #expect(forks.number("exited") == forks.number("forked"), "\(forks)")
            // Samples ran meanwhile: the main actor's stall was reported with stacks.
            let stall = try #require(run.ended.first { $0.string("STALL_LOOP") == "main" })
            #expect(stall.number("STALL_SAMPLES") >= 10, "\(stall.string("MESSAGE"))")
        }
    }
}
