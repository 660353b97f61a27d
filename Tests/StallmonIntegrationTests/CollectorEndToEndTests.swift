import Foundation
import Logging
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond and the CLI against a real journald, on stalls of the fixture service.
    @Suite
    struct CollectorEndToEndTests {
        /// A scratch directory with a stallmond configuration writing into it.
        struct Scratch {
            let directory = NSTemporaryDirectory() + "stallmond-e2e-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            var configuration: String { directory + "/stallmond.json" }
            var metrics: String { directory + "/metrics/stallmon.prom" }

            init(extra: String = "") throws {
                try FileManager.default.createDirectory(
                    atPath: directory + "/metrics", withIntermediateDirectories: true)
                try writeConfiguration(extra: extra)
            }

            /// The unit limit is the largest allowed: stallmond reads this machine's whole journal, and
            /// where earlier runs left more than the default 500 units there, this test's unit would
            /// be folded into `(other units)`.
            func writeConfiguration(extra: String = "") throws {
                let json =
                    #"{"metrics_path": "\#(metrics)", "state_directory": "\#(directory)/state", "metrics_interval_s": 1, "max_units": 100000\#(extra)}"#
                try json.write(toFile: configuration, atomically: true, encoding: .utf8)
            }

            func metricValue(_ series: String) -> Int? {
                guard let text = try? String(contentsOfFile: metrics, encoding: .utf8) else { return nil }
                for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
                    return Int(line.dropFirst(series.count + 1))
                }
                return nil
            }

            func waitForMetric(_ series: String, toBe value: Int, timeout: Double = 20) -> Bool {
                let deadline = Date(timeIntervalSinceNow: timeout)
                while Date() < deadline {
                    if metricValue(series) == value { return true }
                    usleep(100_000)
                }
                return false
            }

            func remove() { try? FileManager.default.removeItem(atPath: directory) }
        }

        static func identifier() -> String { "stallmon-e2e-\(getpid())-\(UInt32.random(in: 0...UInt32.max))" }

        @Test func stallmondCountsStallsAndARestartNeitherLosesNorDoubleCounts() throws {
            try #require(Journald.host.ensureRunning())
            let scratch = try Scratch()
            defer { scratch.remove() }
            let identifier = Self.identifier()
            let series = #"stallmon_stalls_total{unit="(\#(identifier))"}"#
            let first = try FixtureRun.run("restart", arguments: ["--journal", "--identifier", identifier])
            #expect(first.ended.count == 2)

            var daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            defer { if daemon.process.isRunning { _ = daemon.terminate() } }
            #expect(
                scratch.waitForMetric(series, toBe: 2),
                "metrics: \(String(describing: try? String(contentsOfFile: scratch.metrics, encoding: .utf8)))")
            #expect(daemon.terminate().status == 0)

            // Restarted: the saved cursor and counts agree, so the same two stalls stay two.
            try FileManager.default.removeItem(atPath: scratch.metrics)
            daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            #expect(daemon.waitForOutput { _, errors in errors.contains("caught up with the journal") })
            #expect(scratch.waitForMetric(series, toBe: 2))
            #expect(
                daemon.errorsSoFar.split(separator: "\n").contains {
                    $0.contains("caught up with the journal") && $0.contains("entries=0")
                },
                "the restart re-read entries: \(daemon.errorsSoFar)")

            // A new stall while it runs: exactly one more.
            _ = try FixtureRun.run("timer-cpu", arguments: ["--journal", "--identifier", identifier])
            #expect(scratch.waitForMetric(series, toBe: 3))
            #expect(scratch.metricValue(#"stallmon_stall_duration_seconds_count{unit="(\#(identifier))"}"#) == 3)

            // A broken configuration on reload: logged, and the previous one stays in force.
            try #"{"metrics_interval_s": -1}"#.write(toFile: scratch.configuration, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("reload failed, keeping the previous configuration")
                })
            #expect(daemon.errorsSoFar.contains("metrics_interval_s = -1: must be at least 1 s"))
            _ = try FixtureRun.run("timer-cpu", arguments: ["--journal", "--identifier", identifier])
            #expect(scratch.waitForMetric(series, toBe: 4), "still collecting into the old metrics path")
            #expect(daemon.process.isRunning)
            #expect(daemon.terminate().status == 0)
        }

        @Test func windowGaugeFallsBackToZeroWhenItsStallsAgeOutWithNoNewEntry() throws {
            try #require(Journald.host.ensureRunning())
            let scratch = try Scratch(extra: #", "windows_s": [10]"#)
            defer { scratch.remove() }
            let identifier = Self.identifier()
            let series = #"stallmon_window_stalls{unit="(\#(identifier))",window="10s"}"#
            let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            defer { if daemon.process.isRunning { _ = daemon.terminate() } }
            _ = try FixtureRun.run("timer-cpu", arguments: ["--journal", "--identifier", identifier])
            #expect(scratch.waitForMetric(series, toBe: 1))
            // Nothing else reaches the journal for this unit: the gauge still falls once the
            // stall is older than the window.
            #expect(
                scratch.waitForMetric(series, toBe: 0, timeout: 20),
                "metrics: \(String(describing: try? String(contentsOfFile: scratch.metrics, encoding: .utf8)))")
            #expect(daemon.terminate().status == 0)
        }

        @Test func checkConfigExitsWith78AndNamesTheProblem() throws {
            let scratch = try Scratch(extra: #", "max_fingerprints_per_unit": 0"#)
            defer { scratch.remove() }
            let bad = try Executable.stallmond.run(["--config", scratch.configuration, "--check-config"])
            #expect(bad.status == 78)
            #expect(
                bad.errors.contains(
                    "\(scratch.configuration): max_fingerprints_per_unit = 0: must be between 1 and 1000"))
            try scratch.writeConfiguration()
            let good = try Executable.stallmond.run(["--config", scratch.configuration, "--check-config"])
            #expect(good.status == 0)
            #expect(good.output.hasPrefix("stallmond: configuration OK"))
            let typo = try Executable.stallmond.run(
                ["--check-config"],
                environment: ["STALLMOND_CONFIG": scratch.configuration, "STALLMOND_WINDOWS_S": "soon"])
            #expect(typo.status == 78)
            #expect(typo.errors.contains("STALLMOND_WINDOWS_S: windows_s = \"soon\": must be a list of numbers"))
        }

        @Test func digestEntryLandsInTheJournal() throws {
            try #require(Journald.host.ensureRunning())
            let scratch = try Scratch()
            defer { scratch.remove() }
            let configuration = try CollectorConfiguration.load(
                path: scratch.configuration, required: true, environment: [:])
            let collector = try Collector(configuration: configuration, logger: Logger(label: "test"))
            collector.catchUp()
            let digest = collector.writeDigest()
            let entries = try Journald.host.entries(["MESSAGE_ID=\(MessageID.collectorDigest)", "_PID=\(getpid())"])
            let written = try DigestRecord(journalFields: try #require(entries.last))
            #expect(written == digest)
            #expect(written.message.hasPrefix("stall digest for the last 1h: "))
            #expect(written.windowMicroseconds == 3_600_000_000)
        }

        @Test func reportGroupsTheJournalsStallsAndFollowPrintsNewOnes() throws {
            try #require(Journald.host.ensureRunning())
            let identifier = Self.identifier()
            let follow = try Executable.stallmon.start(["follow", "--json"])
            defer { _ = follow.terminate() }
            usleep(500_000)
            let run = try FixtureRun.run("restart", arguments: ["--journal", "--identifier", identifier])
            let truths = [run.truth("restart-1"), run.truth("restart-2")].compactMap { $0 }
            #expect(truths.count == 2)

            // follow: both stalls, detected and ended, as they happened.
            #expect(follow.waitForOutput { output, _ in output.components(separatedBy: identifier).count - 1 >= 4 })
            let followed = follow.outputSoFar.split(separator: "\n").compactMap { line in
                (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: String]
            }.filter { $0["SYSLOG_IDENTIFIER"] == identifier }
            #expect(followed.map { $0["STALL_EVENT"] ?? "" } == ["detected", "ended", "detected", "ended"])

            // report: one group per fingerprint, durations from the journal.
            let report = try Executable.stallmon.run(["report", "--since", "10m", "--json"])
            #expect(report.status == 0, "\(report.errors)")
            let groups = try JSONDecoder().decode([StallGroup].self, from: Data(report.output.utf8)).filter {
                $0.unit == "(\(identifier))"
            }
            #expect(groups.count == 2)
            #expect(groups.allSatisfy { $0.count == 1 && $0.callout == "timer" })
            let maxima = groups.map { Double($0.maxMicroseconds) / 1000 }.sorted()
            for (reported, truth) in zip(maxima, truths.sorted()) {
                #expect(abs(reported - truth) <= 15)
            }
            #expect(groups.contains { $0.heaviestFrame.hasPrefix("Stalls.burnCPU(milliseconds:) (Stalls.swift:") })

            let table = try Executable.stallmon.run(["report", "--since", "10m"])
            #expect(table.output.hasPrefix("UNIT"))
            #expect(table.output.contains("(\(identifier))"))
        }

        @Test func badFlagsAreUsageErrors() throws {
            let since = try Executable.stallmon.run(["report", "--since", "soonish"])
            #expect(since.status == 64)
            #expect(since.errors.contains("--since 'soonish' is not a time"))
            let lines = try Executable.stallmon.run(["follow", "--lines", "-3"])
            #expect(lines.status == 64)
            let demo = try Executable.stallmon.run(["demo", "--stall-ms", "100"])
            #expect(demo.status == 64)
            #expect(demo.errors.contains("does not exceed the threshold"))
        }

        @Test func helpIsShortAndExact() throws {
            let help = try Executable.stallmon.run(["--help"])
            #expect(
                help.output == """
                    OVERVIEW: Main run loop stall monitor for Swift services on Linux.

                    Exit codes: 0 success, 64 usage error, 65 malformed journal data, 69 journal
                    unavailable, 70 internal error, 73 output file not writable, 78 invalid
                    configuration.

                    USAGE: stallmon <subcommand>

                    OPTIONS:
                      -h, --help              Show help information.

                    SUBCOMMANDS:
                      demo                    Run a small service that stalls its main run loop
                                              three ways, and show the reports.
                      report                  Summarize the journal's stall reports by unit and
                                              fingerprint.
                      follow                  Print new stall reports as they reach the journal.

                      See 'stallmon help <subcommand>' for detailed help.

                    """)
        }
    }
}
