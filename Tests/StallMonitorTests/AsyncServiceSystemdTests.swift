import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// An async `@main` service (Sources/StallmonAsyncFixture) under a real systemd with `WatchdogSec=`:
/// monitored with `start(.asyncMain)` it keeps its watchdog fed; started as a run-loop service
/// would be, the monitor warns and feeds nothing, so systemd restarts it.
extension Serial {
    @Suite(.enabled(if: SystemdNamespace.isSupported, "needs root, systemd, unshare and nsenter"))
    struct AsyncServiceSystemdTests {
        static func installService(_ systemd: SystemdNamespace, name: String, scenario: String) throws {
            let executable = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent("StallmonAsyncFixture")
            try systemd.copy(try Data(contentsOf: executable), to: "/usr/local/bin/StallmonAsyncFixture", mode: 0o755)
            try systemd.install(
                unit: "\(name).service",
                contents: """
                    [Unit]
                    Description=stallmon async test service \(name)

                    [Service]
                    ExecStart=/usr/local/bin/StallmonAsyncFixture \(scenario) --seconds 30 --loop-start-timeout-ms 10000
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

        @Test func asyncMainStartedLikeARunLoopServiceIsWarnedAboutThenRestartedByTheWatchdog() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installService(systemd, name: "unfed", scenario: "unwatched")
            try systemd.check(["systemctl", "start", "unfed.service"])
            var warnings: [[String: String]] = []
            for _ in 0..<50 where warnings.isEmpty {
                warnings = try systemd.journal(matches: ["_SYSTEMD_UNIT=unfed.service"]).filter {
                    $0["MESSAGE"]?.contains("stallmon cannot see the main loop") == true
                }
                if warnings.isEmpty { usleep(200_000) }
            }
            let warning = try #require(warnings.first, "no warning in the journal")
            #expect(warning["MESSAGE"]?.contains("call start(.asyncMain) in main() before its first await") == true)

            var said: [String] = []
            for _ in 0..<50 {
                said = try Self.systemdSaid(systemd, "unfed.service")
                if said.contains(where: { $0.contains("Watchdog timeout") }) { break }
                usleep(200_000)
            }
            let timeout = try #require(
                try systemd.journal(matches: ["_PID=1", "UNIT=unfed.service"]).first {
                    $0["MESSAGE"]?.contains("Watchdog timeout") == true
                }, "no watchdog timeout from systemd: \(said)")
            // The warning came first: the journal says why the service was killed.
            #expect(
                (UInt64(warning["__REALTIME_TIMESTAMP"] ?? "") ?? .max)
                    < (UInt64(timeout["__REALTIME_TIMESTAMP"] ?? "") ?? 0))
        }
    }
}
