import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// An async `@main` service (Sources/StallmonAsyncFixture) under a real systemd with `WatchdogSec=`:
/// monitored with `start(.asyncMain)` it keeps its watchdog fed; started as a run-loop service
/// would be, the monitor warns and feeds nothing, so systemd restarts it.
extension Serial {
    @Suite(.requires(.systemd))
    struct AsyncServiceSystemdTests {
        static func installService(
            _ systemd: SystemdNamespace, name: String, scenario: String, arguments: String = ""
        ) throws {
            let executable = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent("StallmonAsyncFixture")
            try systemd.copy(try Data(contentsOf: executable), to: "/usr/local/bin/StallmonAsyncFixture", mode: 0o755)
            try systemd.install(
                unit: "\(name).service",
                contents: """
                    [Unit]
                    Description=stallmon async test service \(name)

                    [Service]
                    ExecStart=/usr/local/bin/StallmonAsyncFixture \(scenario) --seconds 30 --loop-start-timeout-ms 10000 \(arguments)
                    WatchdogSec=2s
                    Restart=on-watchdog
                    NotifyAccess=main
                    TimeoutAbortSec=1s
                    """)
        }

        /// systemd's own messages about `unit`.
        static func systemdSaid(_ systemd: SystemdNamespace, _ unit: String) throws -> [String] {
            try systemd.journal(matches: ["_PID=1", "UNIT=\(unit)"]).compactMap { $0["MESSAGE"] }
        }

        @Test func asyncMainMonitoredWithStartAsyncMainKeepsItsWatchdogFed() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installService(systemd, name: "fed", scenario: "idle")
            try systemd.check(["systemctl", "start", "fed.service"])
            usleep(5_000_000)  // two and a half watchdog intervals
            #expect(try systemd.property("ActiveState", of: "fed.service") == "active")
            #expect(try systemd.property("NRestarts", of: "fed.service") == "0")
            #expect(try Self.systemdSaid(systemd, "fed.service").allSatisfy { !$0.contains("Watchdog timeout") })
            let output = try systemd.journal(matches: ["_SYSTEMD_UNIT=fed.service"]).compactMap { $0["MESSAGE"] }
            #expect(output.allSatisfy { !$0.contains("cannot see") })
        }

        @Test func asyncMainStartedLikeARunLoopServiceFailsAtOnceSayingWhatToCall() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installService(systemd, name: "unfed", scenario: "unwatched")
            try systemd.check(["systemctl", "start", "unfed.service"])
            var errors: [String] = []
            for _ in 0..<50 where errors.isEmpty {
                errors = try systemd.journal(matches: ["_SYSTEMD_UNIT=unfed.service"]).compactMap { $0["MESSAGE"] }
                    .filter { $0.contains("runLoopTargetInAsyncMain") }
                if errors.isEmpty { usleep(200_000) }
            }
            let error = try #require(errors.first, "no error in the journal")
            #expect(error.contains("call start(.asyncMain) in main() before its first await"))
            #expect(try Self.systemdSaid(systemd, "unfed.service").allSatisfy { !$0.contains("Watchdog timeout") })
        }

        /// systemd's watchdog vouches for every loop the monitors watch: an event loop, or the whole
        /// cooperative pool, held past half of `WatchdogSec=` stops the pings while the main actor
        /// idles, and the stall's final report lands before systemd's kill.
        @Test(arguments: [
            ("wedged-loop", "event-loop-wedge", "AsyncWork.wedgeEventLoop(seconds:)"),
            ("wedged-pool", "pool-wedge", "AsyncWork.holdPoolThread(seconds:)"),
        ])
        func aWedgedLoopStopsTheWatchdogPingsAfterItsFinalReport(name: String, scenario: String, function: String)
            throws
        {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installService(
                systemd, name: name, scenario: scenario,
                arguments: "--threshold-ms 200 --wedge-seconds 8 --journal --identifier \(name)")
            try systemd.check(["systemctl", "start", "\(name).service"])
            var said: [String] = []
            for _ in 0..<75 {
                said = try Self.systemdSaid(systemd, "\(name).service")
                if said.contains(where: { $0.contains("Watchdog timeout") }) { break }
                usleep(200_000)
            }
            let timeout = try #require(
                try systemd.journal(matches: ["_PID=1", "UNIT=\(name).service"]).first {
                    $0["MESSAGE"]?.contains("Watchdog timeout") == true
                }, "no watchdog timeout from systemd: \(said)")
            let finals = try systemd.journal(matches: [
                "SYSLOG_IDENTIFIER=\(name)", "MESSAGE_ID=\(MessageID.watchdogStall)",
            ])
            let final = try #require(finals.first, "no final report before the kill")
            #expect(final["STALL_FRAME"]?.contains(function) == true, "\(final["STALL_FRAME"] ?? "")")
            #expect(
                (UInt64(final["__REALTIME_TIMESTAMP"] ?? "") ?? .max)
                    < (UInt64(timeout["__REALTIME_TIMESTAMP"] ?? "") ?? 0))
        }
    }
}
