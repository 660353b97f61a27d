import Foundation
import StallJournal
import StallmonTestSupport
import Synchronization
import Testing

@testable import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    @Suite
    struct ReportingThreadTests {
        /// Once the started event is out and the symbolicator's pages are released (a second after
        /// its last use), the reporting thread has nothing to do and waits without a timeout, and
        /// the fixture's own sink, once it has the event, has no thread left to wake.
        @Test func reportingThreadStaysParkedWhileIdle() throws {
            var wakeups: Int?
            var sinkThread: Int?
            let run = try FixtureRun.run("idle", arguments: ["--seconds", "5"]) { pid in
                usleep(2_500_000)
                wakeups = NamedThread(named: "stallmon-report", in: pid)?.wakeups(over: 1_500_000)
                sinkThread = NamedThread(named: "stallmon-sink", in: pid)?.tid
            }
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            let measured = try #require(wakeups, "no reporting thread found")
            #expect(measured == 0, "\(measured) reporting thread wakeups in 1.5 s of idle")
            #expect(sinkThread == nil, "a sink's thread outlived its queue")
            #expect(run.lines.contains { $0["type"] as? String == "started" })
        }

        /// The final report before a watchdog kill waits for the reporting thread until systemd's
        /// deadline at most: held by a slow sink, the watchdog thread goes on, and the report is
        /// written in its turn.
        @Test func aSyncJobWaitsUntilItsDeadlineAtMostAndStillRuns() {
            let thread = ReportingThread.shared
            let release = DispatchSemaphore(value: 0)
            let ran = Atomic<Int>(0)
            thread.async { release.wait() }
            let start = MonotonicClock.now()
            let answered = thread.sync(waitingUntil: start + 100_000_000) { ran.add(1, ordering: .relaxed) }
            let waited = MonotonicClock.now() - start
            #expect(!answered)
            #expect(waited >= 100_000_000 && waited < 2_000_000_000, "waited \(waited) ns")
            #expect(ran.load(ordering: .relaxed) == 0)
            release.signal()
            #expect(thread.sync(waitingUntil: MonotonicClock.now() + 10_000_000_000) {})
            #expect(ran.load(ordering: .relaxed) == 1)
        }
    }
}
