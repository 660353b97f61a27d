import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond's configuration through the real executable: `--check-config` and the start
    /// accept and refuse the same configurations, and refusals exit 78 (EX_CONFIG), never a trap.
    @Suite
    struct ConfigurationEndToEndTests {
        struct Scratch {
            let directory = NSTemporaryDirectory() + "stallmond-config-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            var configuration: String { directory + "/stallmond.json" }

            init(_ json: String) throws {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                try json.write(toFile: configuration, atomically: true, encoding: .utf8)
            }

            func remove() { try? FileManager.default.removeItem(atPath: directory) }
        }

        struct Case: Sendable, CustomTestStringConvertible {
            var json: String
            var environment: [String: String] = [:]
            /// What the error names, as it should read.
            var message: String
            var testDescription: String { "\(json) \(environment)" }
        }

        static let cases: [Case] = [
            Case(
                json: #"{"windows_s": [1e10]}"#,
                message: "windows_s = [1e10]: each window must be between 10 s and 30 days"),
            Case(json: #"{"histogram_buckets_ms": [-1e300]}"#, message: "histogram_buckets_ms = [-1e300]: each bound"),
            Case(json: #"{"windows_s": [300, 3600],}"#, message: "(file): not valid JSON: a trailing comma before '}'"),
            Case(
                json: #"{"histogram_buckets_ms": [1.0001, 1.0002]}"#,
                message: "histogram_buckets_ms = [1.0001, 1.0002]: bounds must be strictly increasing"),
            Case(
                json: #"{"monitor_threshold_ms": 3600001}"#,
                message: "monitor_threshold_ms = 3600001: must be at most 1 hour"),
            Case(
                json: "{}", environment: ["STALLMOND_WINDOWS_S": "-1e19"],
                message: #"STALLMOND_WINDOWS_S: windows_s = "-1e19": each window must be between"#),
            Case(
                json: "{}", environment: ["STALLMOND_WINDOWS_S": "300,,3600"],
                message: #"STALLMOND_WINDOWS_S: windows_s = "300,,3600": must be a list of numbers"#),
            Case(
                json: "{}", environment: ["STALLMOND_DIGEST_INTERVALL_S": "60"],
                message:
                    "STALLMOND_DIGEST_INTERVALL_S: digest_intervall_s = \"60\": unknown variable; did you mean STALLMOND_DIGEST_INTERVAL_S?"
            ),
        ]

        @Test(arguments: cases)
        func invalidConfigurationExits78AtCheckConfigAndAtStartAlike(_ invalid: Case) throws {
            let scratch = try Scratch(invalid.json)
            defer { scratch.remove() }
            for arguments in [
                ["--config", scratch.configuration, "--check-config"], ["--config", scratch.configuration],
            ] {
                let result = try Executable.stallmond.run(arguments, environment: invalid.environment, timeout: 20)
                #expect(result.status == 78, "\(arguments): \(result.errors)")
                #expect(result.errors.contains("stallmond: invalid configuration: "), "\(result.errors)")
                #expect(result.errors.contains(invalid.message), "\(result.errors)")
            }
        }

        @Test func emptyConfigVariableExits78NamingIt() throws {
            for arguments in [["--check-config"], []] {
                let result = try Executable.stallmond.run(arguments, environment: ["STALLMOND_CONFIG": ""], timeout: 20)
                #expect(result.status == 78)
                #expect(result.errors.contains(#"STALLMOND_CONFIG: (file) = "": is set but empty"#), "\(result.errors)")
            }
        }

        @Test func monitorThresholdUnderTheSamplingIntervalPassesTheCheckAndStarts() throws {
            try #require(Journald.host.ensureRunning())
            let scratch = try Scratch("")
            defer { scratch.remove() }
            try #"{"metrics_path": "", "state_directory": "\#(scratch.directory)/state", "monitor_threshold_ms": 15}"#
                .write(toFile: scratch.configuration, atomically: true, encoding: .utf8)
            let check = try Executable.stallmond.run(["--config", scratch.configuration, "--check-config"])
            #expect(check.status == 0, "\(check.errors)")
            let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            defer { if daemon.process.isRunning { _ = daemon.terminate() } }
            #expect(daemon.waitForOutput { _, errors in errors.contains("stallmond ready") }, "\(daemon.errorsSoFar)")
            #expect(daemon.terminate().status == 0, "\(daemon.errorsSoFar)")
        }
    }
}
