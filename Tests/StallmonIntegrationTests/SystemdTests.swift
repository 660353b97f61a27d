import Foundation
import StallCollector
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The units, the watchdog and stallmond under a real systemd (PID 1 of a private PID and mount
/// namespace), driven with systemctl and read back from that systemd's own journal.
extension Serial {
    @Suite(.requires(.systemd))
    struct SystemdTests {
        static var buildDirectory: String {
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
        }

        static func file(_ path: String) throws -> String {
            try String(contentsOf: Repository.root.appendingPathComponent(path), encoding: .utf8)
        }

        /// Copies the project's executables into the namespace's /usr/local/bin, where the units
        /// expect them (the build folder may not be visible inside: /tmp there is private).
        /// node_exporter's textfile directory, writable by stallmond's dynamic user: a tmpfs of the
        /// namespace's own over it, so that the host's (made root-only by the prometheus-node-exporter
        /// package) is neither used nor changed.
        static func makeTextfileDirectory(_ systemd: SystemdNamespace) throws {
            try systemd.check(["mkdir", "-p", "/var/lib/prometheus/node-exporter"])
            try systemd.check(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/var/lib/prometheus/node-exporter"])
        }

        static func installExecutables(_ systemd: SystemdNamespace) throws {
            if try systemd.run(["test", "-x", "/usr/local/bin/stallmon"]).status == 0 { return }
            for name in ["StallmonFixture", "stallmond", "stallmond-daemon", "stallmon"] {
                let data = try Data(contentsOf: URL(fileURLWithPath: buildDirectory).appendingPathComponent(name))
                try systemd.copy(data, to: "/usr/local/bin/\(name)", mode: 0o755)
            }
        }

        /// A monitored service: the fixture's `service` scenario, with the shipped drop-in.
        static func installMonitoredService(_ systemd: SystemdNamespace, name: String, arguments: String) throws {
            try installExecutables(systemd)
            try systemd.install(
                unit: "\(name).service",
                contents: """
                    [Unit]
                    Description=stallmon test service \(name)

                    [Service]
                    Type=notify
                    ExecStart=/usr/local/bin/StallmonFixture service \(arguments)
                    """)
            try systemd.install(
                unit: "\(name).service.d/stallmon.conf", contents: try file("systemd/stallmon-monitored.conf"))
            try systemd.install(
                unit: "\(name).service.d/test.conf",
                contents: """
                    [Service]
                    WatchdogSec=2s
                    Environment=STALLMON_THRESHOLD_MS=100
                    Environment=STALLMON_RATE_LIMIT_BURST=100
                    """)
        }

        @Test func briefStallsAreReportedWithoutARestart() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installMonitoredService(systemd, name: "brief", arguments: "--stall-ms 300")
            try systemd.check(["systemctl", "start", "brief.service"])
            let ended = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=brief.service", "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6"], atLeast: 3,
                timeout: 20)
            #expect(ended.count >= 3)
            #expect(ended.allSatisfy { $0["STALL_FRAME"]?.hasPrefix("Stalls.sleepInSyscall(milliseconds:)") == true })
            #expect(
                ended.allSatisfy { ($0["STALL_BACKTRACE"] ?? "").contains("ServiceWork.handleRequest(milliseconds:)") })
            #expect(
                ended.allSatisfy { $0["STALL_THRESHOLD_USEC"] == "100000" },
                "the drop-in's STALLMON_THRESHOLD_MS applies")
            #expect(try systemd.property("NRestarts", of: "brief.service") == "0")
            #expect(try systemd.property("ActiveState", of: "brief.service") == "active")
            #expect(try systemd.property("StatusText", of: "brief.service").hasPrefix("main loop healthy; "))
            let watchdog = try systemd.journal(matches: [
                "_SYSTEMD_UNIT=brief.service", "MESSAGE_ID=6111fbc730f244c8897baf9d136e610c",
            ])
            #expect(watchdog.isEmpty)
        }

        @Test func loopBlockedForGoodIsReportedThenKilledByTheWatchdogAndRestarted() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installMonitoredService(systemd, name: "stuck", arguments: "--stall-ms 150 --block-after 3")
            try systemd.check(["systemctl", "start", "stuck.service"])
            let finals = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=stuck.service", "MESSAGE_ID=6111fbc730f244c8897baf9d136e610c"], atLeast: 1,
                timeout: 20)
            let final = try #require(finals.first)
            #expect(final["STALL_WATCHDOG_USEC"] == "2000000")
            #expect(final["STALL_BACKTRACE"]?.contains("ServiceWork.deadlock()") == true)
            #expect(
                final["MESSAGE"]?.contains("past the service watchdog (2000 ms): systemd will kill the service") == true
            )
            #expect(final["PRIORITY"] == "2")

            // systemd's own account: watchdog timeout, SIGABRT, restart.
            func systemdSaid(_ text: String) throws -> [String: String]? {
                for _ in 0..<100 {
                    let said = try systemd.journal(matches: ["_PID=1", "UNIT=stuck.service"])
                    if let entry = said.first(where: { $0["MESSAGE"]?.contains(text) == true }) { return entry }
                    usleep(200_000)
                }
                return nil
            }
            let timeout = try #require(try systemdSaid("Watchdog timeout"), "no watchdog timeout from systemd")
            // The final report landed before systemd's deadline.
            #expect(
                (UInt64(final["__REALTIME_TIMESTAMP"] ?? "") ?? .max)
                    < (UInt64(timeout["__REALTIME_TIMESTAMP"] ?? "") ?? 0))
            #expect(try systemdSaid("SIGABRT") != nil)
            var restarts = 0
            for _ in 0..<100 {
                restarts = Int(try systemd.property("NRestarts", of: "stuck.service")) ?? 0
                if restarts >= 1 { break }
                usleep(200_000)
            }
            #expect(restarts >= 1)
        }

        /// A sink of the service's own that blocks 5 s in every event, beside the journal: the brief
        /// stall's reports reach the journal on time, and the final report before the watchdog kill
        /// before systemd's deadline.
        @Test func theFinalReportBeforeAWatchdogKillReachesTheJournalWhileASinkBlocks() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installMonitoredService(
                systemd, name: "slowsink", arguments: "--stall-ms 150 --block-after 3 --slow-sink-ms 5000")
            try systemd.check(["systemctl", "start", "slowsink.service"])
            let finals = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=slowsink.service", "MESSAGE_ID=6111fbc730f244c8897baf9d136e610c"],
                atLeast: 1, timeout: 20)
            let final = try #require(finals.first, "no final report in the journal")
            #expect(final["STALL_BACKTRACE"]?.contains("ServiceWork.deadlock()") == true)

            var timeout: [String: String]?
            for _ in 0..<100 {
                let said = try systemd.journal(matches: ["_PID=1", "UNIT=slowsink.service"])
                timeout = said.first { $0["MESSAGE"]?.contains("Watchdog timeout") == true }
                if timeout != nil { break }
                usleep(200_000)
            }
            let killedAt = try #require(
                timeout.flatMap { UInt64($0["__REALTIME_TIMESTAMP"] ?? "") }, "no watchdog timeout from systemd")
            let finalAt = try #require(UInt64(final["__REALTIME_TIMESTAMP"] ?? ""))
            #expect(
                finalAt < killedAt, "final report \(Double(finalAt) / 1e6 - Double(killedAt) / 1e6) s after the kill")

            // The brief stall before it (at 2 s): ended in the journal moments after detected, not
            // after the sink's 5 s.
            let first = try #require(
                try systemd.journal(matches: ["_SYSTEMD_UNIT=slowsink.service", "STALL_EVENT=ended"], atLeast: 1)
                    .first, "no ended report")
            let detected = try #require(
                try systemd.journal(matches: [
                    "_SYSTEMD_UNIT=slowsink.service", "STALL_EVENT=detected", "STALL_ID=\(first["STALL_ID"] ?? "")",
                ]).first)
            let gap =
                (Double(first["__MONOTONIC_TIMESTAMP"] ?? "") ?? .infinity)
                - (Double(detected["__MONOTONIC_TIMESTAMP"] ?? "") ?? 0)
            #expect(gap / 1000 < 500, "ended \(gap / 1000) ms after detected")
        }

        @Test func stallmondCollectsUnderItsSandboxSurvivesRestartsAndKeepsItsConfigurationOnABadReload() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installExecutables(systemd)
            try systemd.install(unit: "stallmond.service", contents: try Self.file("systemd/stallmond.service"))
            try Self.makeTextfileDirectory(systemd)
            let configuration = #"{"metrics_interval_s": 1, "monitor_threshold_ms": 250}"#
            try systemd.copy(Data(configuration.utf8), to: "/etc/stallmon/stallmond.json")
            try Self.installMonitoredService(systemd, name: "brief", arguments: "--stall-ms 300")
            try systemd.check(["systemctl", "start", "brief.service"])
            _ = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=brief.service", "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6"], atLeast: 2,
                timeout: 20)

            try systemd.check(["systemctl", "start", "stallmond.service"])
            #expect(try systemd.property("ActiveState", of: "stallmond.service") == "active")
            // Ready at once; the status says "collecting" once the backlog is read.
            var status = ""
            for _ in 0..<100 {
                status = try systemd.property("StatusText", of: "stallmond.service")
                if status.hasPrefix("collecting: ") { break }
                usleep(100_000)
            }
            #expect(status.hasPrefix("collecting: "), "\(status)")

            // Stop the stalls, then compare what stallmond counted with what the journal holds.
            try systemd.check(["systemctl", "stop", "brief.service"])
            let journalCount = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=brief.service", "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6"]
            ).count
            let series = #"stallmon_stalls_total{unit="brief.service"}"#
            func counted() throws -> Int? {
                let metrics = try systemd.run(["cat", "/var/lib/prometheus/node-exporter/stallmon.prom"]).output
                return metrics.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap {
                    Int($0.split(separator: " ").last!)
                }
            }
            func waitForCount(_ expected: Int) throws -> Int? {
                var value: Int?
                for _ in 0..<100 {
                    value = try counted()
                    if value == expected { break }
                    usleep(200_000)
                }
                return value
            }
            #expect(try waitForCount(journalCount) == journalCount)

            // The CLI, through the same schema, agrees.
            let report = try systemd.check([
                "/usr/local/bin/stallmon", "report", "--unit", "brief.service", "--json",
            ])
            let groups = try JSONSerialization.jsonObject(with: Data(report.utf8)) as? [[String: Any]] ?? []
            #expect(groups.map { $0["count"] as? Int ?? 0 }.reduce(0, +) == journalCount)

            // Restarted, it resumes from its cursor: no stall counted twice, none lost.
            try systemd.check(["systemctl", "stop", "stallmond.service"])
            try systemd.check(["rm", "-f", "/var/lib/prometheus/node-exporter/stallmon.prom"])
            try systemd.check(["systemctl", "start", "stallmond.service"])
            #expect(try waitForCount(journalCount) == journalCount)
            let state = try systemd.run(["ls", "/var/lib/stallmond/state.json"])
            #expect(state.status == 0, "the state lives in StateDirectory=")

            // A broken configuration: the reload fails and says why; the daemon keeps running.
            try systemd.copy(Data(#"{"windows_s": "soon"}"#.utf8), to: "/etc/stallmon/stallmond.json")
            let reload = try systemd.systemctl(["reload", "stallmond.service"])
            #expect(reload.status != 0)
            #expect(try systemd.property("ActiveState", of: "stallmond.service") == "active")
            let complaint = try systemd.journal(matches: ["_SYSTEMD_UNIT=stallmond.service"], atLeast: 1)
                .contains { $0["MESSAGE"]?.contains(#"windows_s = "soon": must be a list of numbers"#) == true }
            #expect(complaint)
            // A good one is taken.
            try systemd.copy(Data(#"{"metrics_interval_s": 2}"#.utf8), to: "/etc/stallmon/stallmond.json")
            #expect(try systemd.systemctl(["reload", "stallmond.service"]).status == 0)
            #expect(try systemd.property("NRestarts", of: "stallmond.service") == "0")
        }

        /// Any local user can write entries with our MESSAGE_IDs. As `nobody`, four units write
        /// 5,000 distinct fingerprints each plus values past every bound (a suppression count of
        /// Int64.max followed by 1, durations near 2^64 µs), before stallmond starts and again while
        /// it runs. It is ready at once over the backlog, never restarts, keeps its state small, and
        /// counts exactly what the journal holds.
        @Test func anUnprivilegedFloodLeavesStallmondReadyFedAndExact() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try Self.installExecutables(systemd)
            try systemd.install(unit: "stallmond.service", contents: try Self.file("systemd/stallmond.service"))
            try Self.makeTextfileDirectory(systemd)
            // The backlog (20,004 entries) is read whole: this test counts every entry it holds.
            try systemd.copy(
                Data(#"{"metrics_interval_s": 1, "cold_start_entries": 100000}"#.utf8),
                to: "/etc/stallmon/stallmond.json")
            let floodScript = try Data(contentsOf: Repository.root.appendingPathComponent("Scripts/journal-flood.py"))
            try systemd.copy(floodScript, to: "/usr/local/bin/journal-flood", mode: 0o755)
            let ended = "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6"

            func flood(_ unit: String, count: Int, first: Int, overflow: Bool) throws {
                try systemd.check(
                    [
                        "systemd-run", "--quiet", "--wait", "--uid=65534", "--gid=65534", "--unit=\(unit)",
                        "/usr/local/bin/journal-flood", "--count", "\(count)", "--first", "\(first)",
                    ] + (overflow ? ["--overflow"] : []), timeout: 300)
            }
            /// Entries the journal holds for `unit` with `match`.
            func held(_ unit: String, _ match: String) throws -> Int {
                let output = try systemd.check([
                    "sh", "-c", "journalctl -q --no-pager -o cat _SYSTEMD_UNIT=\(unit) \(match) | wc -l",
                ])
                return Int(output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            }
            func metrics() throws -> [String: Int] {
                let text = try systemd.run(["cat", "/var/lib/prometheus/node-exporter/stallmon.prom"]).output
                var values: [String: Int] = [:]
                for line in text.split(separator: "\n") where !line.hasPrefix("#") {
                    guard let space = line.lastIndex(of: " ") else { continue }
                    values[String(line[..<space])] = Int(line[line.index(after: space)...])
                }
                return values
            }
            func waitForMetrics(_ expected: [String: Int], timeout: Double = 120) throws -> [String: Int] {
                let deadline = Date(timeIntervalSinceNow: timeout)
                var seen: [String: Int] = [:]
                while Date() < deadline {
                    seen = try metrics()
                    if expected.allSatisfy({ seen[$0.key] == $0.value }) { break }
                    usleep(250_000)
                }
                return seen.filter { expected[$0.key] != nil }
            }

            // A backlog before stallmond starts.
            let units = (0..<4).map { "flood-\($0).service" }
            for (index, unit) in units.enumerated() {
                try flood(unit, count: 5000, first: index * 5000, overflow: index == 0)
            }
            let started = Date()
            try systemd.check(["systemctl", "start", "stallmond.service"])
            let readyAfter = Date().timeIntervalSince(started)
            #expect(readyAfter < 10, "ready after \(readyAfter) s")

            // Exactly what the journal holds: the sane stalls counted, the insane entries malformed.
            func expectation() throws -> [String: Int] {
                var expected: [String: Int] = [:]
                for unit in units {
                    // The two overflowing durations of flood-0 are malformed, not stalls.
                    expected[#"stallmon_stalls_total{unit="\#(unit)"}"#] =
                        try held(unit, ended) - (unit == units[0] ? 2 : 0)
                }
                expected[#"stallmon_suppressed_reports_total{unit="\#(units[0])"}"#] = 1
                expected["stallmond_malformed_entries_total"] = 3
                return expected
            }
            let backlog = try expectation()
            #expect(backlog[#"stallmon_stalls_total{unit="flood-3.service"}"#] == 5000, "journald kept every entry")
            let countedBacklog = try waitForMetrics(backlog)
            #expect(countedBacklog == backlog, "counted \(countedBacklog), the journal holds \(backlog)")
            #expect(
                try metrics()[#"stallmond_folded_stalls_total{what="fingerprint"}"#] == backlog.filter {
                    $0.key.hasPrefix("stallmon_stalls_total")
                }.values.reduce(0, +) - 4 * CollectorConfiguration().maximumFingerprintsPerUnit)

            // Again while it runs.
            for (index, unit) in units.enumerated() {
                try flood(unit, count: 2500, first: 20_000 + index * 2500, overflow: false)
            }
            let live = try expectation()
            let countedLive = try waitForMetrics(live)
            #expect(countedLive == live, "counted \(countedLive), the journal holds \(live)")

            #expect(try systemd.property("ActiveState", of: "stallmond.service") == "active")
            #expect(try systemd.property("NRestarts", of: "stallmond.service") == "0")
            #expect(try systemd.property("StatusText", of: "stallmond.service").hasPrefix("collecting: "))
            let stateBytes = try systemd.check(["stat", "-L", "-c", "%s", "/var/lib/stallmond/state.json"])
            #expect((Int(stateBytes.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .max) < 4_000_000)
            // stallmond's own monitor never saw its loop stall past the threshold.
            let ownStalls = try systemd.journal(matches: ["_SYSTEMD_UNIT=stallmond.service", ended])
            #expect(
                ownStalls.isEmpty, "\(ownStalls.map { ($0["STALL_DURATION_USEC"] ?? "", $0["STALL_BACKTRACE"] ?? "") })"
            )
        }

        @Test func catalogExplainsEveryStallEntry() throws {
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try systemd.copy(
                Data(try Self.file("systemd/stallmon.catalog").utf8), to: "/usr/lib/systemd/catalog/stallmon.catalog")
            try systemd.check(["journalctl", "--update-catalog"])
            let catalog = try systemd.check(["journalctl", "--list-catalog"])
            for messageID in [
                "8da8468ee8f843a2994203fbc71ab06c", "28beac6e882f46aaa40f2556557097a6",
                "1332568df10e41a0927f220ff4dc212b",
                "d73ddae2d6c44436813f07f52018475b", "6111fbc730f244c8897baf9d136e610c",
                "7836eefd2ec44eddb4acc5b97a7da338",
            ] {
                #expect(catalog.contains(messageID), "no catalog entry for \(messageID)")
            }
            try Self.installMonitoredService(systemd, name: "brief", arguments: "--stall-ms 300")
            try systemd.check(["systemctl", "start", "brief.service"])
            _ = try systemd.journal(
                matches: ["_SYSTEMD_UNIT=brief.service", "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6"], atLeast: 1,
                timeout: 20)
            let explained = try systemd.check([
                "journalctl", "-x", "--no-pager", "_SYSTEMD_UNIT=brief.service",
                "MESSAGE_ID=28beac6e882f46aaa40f2556557097a6",
            ])
            #expect(explained.contains("Subject: Main run loop of StallmonFixture stalled for "))
            #expect(explained.contains("Stalls.sleepInSyscall(milliseconds:)"))
        }

        @Test func unitFilesPassVerifyAndTheSecurityScoreIsAtMostOne() throws {
            let verify = Process()
            verify.executableURL = SystemdNamespace.script
            verify.arguments = ["verify", Repository.root.appendingPathComponent("systemd/stallmond.service").path]
            let verifyOutput = Pipe()
            verify.standardOutput = verifyOutput
            verify.standardError = verifyOutput
            try verify.run()
            let verifyText = String(decoding: verifyOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            verify.waitUntilExit()
            #expect(verify.terminationStatus == 0, "\(verifyText)")

            let security = Process()
            security.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-analyze")
            security.arguments = [
                "security", "--offline=yes", Repository.root.appendingPathComponent("systemd/stallmond.service").path,
            ]
            let output = Pipe()
            security.standardOutput = output
            security.standardError = FileHandle.nullDevice
            try security.run()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            security.waitUntilExit()
            let line = try #require(text.split(separator: "\n").first { $0.contains("Overall exposure level") })
            let score = line.split(separator: " ").compactMap { Double($0) }.first
            #expect((score ?? 10) <= 1.0, "\(line)")
        }
    }
}
