import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// A user's sink that blocks 5 s in every event, beside the journal (a journald of the test's
    /// own): the journal's reports are on time, its `stopped` entry is there when `stop()`
    /// returns, and what the slow sink drops is counted and said once. Under systemd, see
    /// `SystemdTests.theFinalReportBeforeAWatchdogKillReachesTheJournalWhileASinkBlocks`.
    @Suite
    struct SlowSinkTests {
        @Test func aSinkThatBlocksFiveSecondsLeavesTheJournalOnTimeAndItsStoppedEntryIn() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.start(), "cannot start a journald")
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run(
                "stream",
                arguments: [
                    "--journal", "--journal-socket", journal.socketPath, "--identifier", identifier,
                    "--threshold-ms", "40", "--stall-ms", "70", "--period-ms", "300", "--seconds", "3",
                    "--slow-sink-ms", "5000", "--queue-capacity", "4",
                ])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            // stop() waited for the slow sink until its timeout (2 s) at most.
            let stop = try #require(run.lines.first { $0["type"] as? String == "stop" })
            let stopSeconds = stop.number("duration_ns") / 1e9
            #expect(stopSeconds < 2.5, "stop() took \(stopSeconds) s")

            // Every ended report (the fixture's own sink prints them) is in the journal, each
            // within half a second of its stall's end.
            let ended = run.ended
            try #require(ended.count >= 6, "\(ended.count) ended reports")
            let inJournal = try journal.entries(
                ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)"], atLeast: ended.count,
                timeout: 5)
            var lateness: [Double] = []
            for report in ended {
                let id = report.string("STALL_ID")
                let entry = try #require(inJournal.first { $0["STALL_ID"] == id }, "stall \(id) not in the journal")
                let received = try #require(Double(entry["__MONOTONIC_TIMESTAMP"] ?? "")) * 1000
                lateness.append((received - report.number("start_ns") - report.number("duration_ns")) / 1e6)
            }
            let latest = try #require(lateness.max())
            #expect(latest < 500, "ended reports reached the journal up to \(latest) ms late: \(lateness)")

            // The `stopped` entry is in the journal, with what the slow sink dropped.
            let stopped = try journal.entries(
                [
                    "SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.monitorLifecycle)",
                    "\(MonitorField.event)=stopped",
                ], timeout: 5)
            let entry = try #require(stopped.first, "no stopped entry in the journal")
            let dropped = try #require(Int(entry[MonitorField.dropped] ?? ""))
            #expect(dropped > 0)
            #expect(run.stopped.first?["dropped"] as? Int == dropped)
            // Said once, naming the sink.
            let said = run.standardError.split(separator: "\n").filter { $0.contains("does not keep up") }
            #expect(said.count == 1, "\(run.standardError)")
            #expect(said.first?.contains("stallmon.sink=SlowSink") == true, "\(said)")
        }
    }
}
