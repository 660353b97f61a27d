import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Loops that are healthy must never be reported, however they spend their time.
    @Suite
    struct FalsePositiveTests {
        @Test func idleLoopIsNeverAStall() throws {
            let run = try FixtureRun.run("idle", arguments: ["--seconds", "4"])
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty)
            #expect(run.stopped.first?["stalls"] as? Int == 0)
        }

        @Test func busyLoopOfShortPassesIsNeverAStall() throws {
            let run = try FixtureRun.run("busy", arguments: ["--seconds", "3"])
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty)
        }

        @Test func nestedRunInAnUnobservedModeIdlingIsNotAStall() throws {
            let run = try FixtureRun.run("nested-private-mode")
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty)
        }

        /// Without CoreFoundation's symbols the loop's wait function has no name: the thread's
        /// wait call and the loop's mode tell the idle nested run, with no signal sent.
        @Test func nestedRunInAnUnobservedModeIdlingIsNotAStallWithoutCoreFoundationSymbols() throws {
            let run = try FixtureRun.run("nested-private-mode", environment: try StrippedFoundation.environment())
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty, "\(run.detected.map { $0.string("MESSAGE") })")
            #expect(run.stopped.first?["stalls"] as? Int == 0)
            #expect(run.standardError.components(separatedBy: StrippedFoundation.warning).count == 2)
        }

        @Test(arguments: ["busy", "idle"])
        func processStoppedLongerThanTheThresholdIsNotAStall(_ scenario: String) throws {
            let run = try FixtureRun.run(scenario, arguments: ["--seconds", "3"]) { pid in
                usleep(1_000_000)
                kill(pid, SIGSTOP)
                usleep(1_000_000)  // ten times the threshold
                kill(pid, SIGCONT)
            }
            #expect(run.exitStatus == 0)
            #expect(run.detected.isEmpty, "\(run.detected.map { $0.string("MESSAGE") })")
        }
    }
}
