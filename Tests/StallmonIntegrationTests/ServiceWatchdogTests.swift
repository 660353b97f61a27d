import CoreFoundation
import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// The service-manager protocol, against a notify socket of the test's own (the real systemd
    /// tests are in SystemdTests): pings only while the loop makes progress, and a final report
    /// before the deadline when it does not.
    @Suite
    struct ServiceWatchdogTests {
        @Test func pingsStopDuringAStallAndAFinalReportPrecedesTheDeadline() throws {
            let socket = try NotifySocket()
            defer { socket.close() }
            let run = try FixtureRun.run(
                "watchdog", arguments: ["--seconds", "4"],
                environment: ["NOTIFY_SOCKET": socket.path, "WATCHDOG_USEC": "1000000"]
            )
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let messages = socket.messages()
            // READY=1 goes out before the loop runs: not called healthy until its first turn, which
            // sends a fresh status.
            let ready = try #require(messages.firstIndex { $0.text.hasPrefix("READY=1\n") })
            #expect(messages[ready].text == "READY=1\nSTATUS=main loop not seen running yet")
            #expect(
                messages[ready...].contains { $0.text.hasPrefix("STATUS=main loop healthy") },
                "\(messages.map(\.text).filter { $0 != "WATCHDOG=1" })")

            let truth = try #require(run.truths.first)
            let stallStart = UInt64((truth["start_ns"] as? NSNumber)?.uint64Value ?? 0)
            let stallEnd = UInt64((truth["end_ns"] as? NSNumber)?.uint64Value ?? 0)
            let pings = messages.filter { $0.text == "WATCHDOG=1" }.map(\.time)
            let before = pings.filter { $0 < stallStart }
            let after = pings.filter { $0 > stallEnd }
            // Healthy: a ping every half interval.
            #expect(before.count >= 2)
            for (earlier, later) in zip(before, before.dropFirst()) {
                #expect(Double(later - earlier) / 1e6 < 700, "pings \(Double(later - earlier) / 1e6) ms apart")
            }
            // Stalled: none once the stall passes the threshold (100 ms), until it ends.
            #expect(
                pings.allSatisfy { $0 < stallStart + 100_000_000 || $0 >= stallEnd }, "a ping went out during the stall"
            )
            // Recovered: the overdue ping goes out at once.
            let firstAfter = try #require(after.first)
            #expect(Double(firstAfter - stallEnd) / 1e6 < 100)

            // The final report: once, before systemd's deadline (last ping + WatchdogSec).
            let finals = run.lines.filter { $0["type"] as? String == "watchdog" }
            try #require(finals.count == 1)
            let final = finals[0]
            let lastPing = try #require(before.last)
            let reportedAt = UInt64((final["reported_ns"] as? NSNumber)?.uint64Value ?? 0)
            #expect(
                reportedAt < lastPing + 1_000_000_000,
                "final report \(Double(reportedAt - lastPing) / 1e6) ms after the last ping")
            #expect(reportedAt > lastPing + 500_000_000)
            #expect(final.string("MESSAGE_ID") == "6111fbc730f244c8897baf9d136e610c")
            #expect(final.string("STALL_WATCHDOG_USEC") == "1000000")
            #expect(
                final.string("MESSAGE").contains("past the service watchdog (1000 ms): systemd will kill the service"))
            #expect(final.string("STALL_BACKTRACE").contains("Stalls.sleepInSyscall(milliseconds:)"))
            // The stall still gets its ended report with the true duration.
            let ended = try #require(run.ended.first)
            #expect(abs(ended.milliseconds("STALL_DURATION_USEC") - Double(stallEnd - stallStart) / 1e6) <= 15)
        }

        @Test func withoutANotifySocketNothingIsSent() throws {
            let run = try FixtureRun.run(
                "watchdog", arguments: ["--seconds", "3"], environment: ["WATCHDOG_USEC": "1000000"])
            #expect(run.exitStatus == 0)
            #expect(run.ended.count == 1)
        }
    }
}
