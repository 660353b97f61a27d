import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    @Suite
    struct ReportingThreadTests {
        /// Once the started event is out and the symbolicator's pages are released (a second after
        /// its last use), the reporting thread has nothing to do and waits without a timeout.
        @Test func reportingThreadStaysParkedWhileIdle() throws {
            var wakeups: Int?
            let run = try FixtureRun.run("idle", arguments: ["--seconds", "5"]) { pid in
                usleep(2_500_000)
                wakeups = NamedThread(named: "stallmon-report", in: pid)?.wakeups(over: 1_500_000)
            }
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            let measured = try #require(wakeups, "no reporting thread found")
            #expect(measured == 0, "\(measured) reporting thread wakeups in 1.5 s of idle")
        }
    }
}
