import Foundation
import Testing

@testable import StallMonitor

struct ConfigurationTests {
    static var shippedFile: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .appendingPathComponent("config/stallmon.json").path
    }

    @Test func shippedFileHoldsTheDefaults() throws {
        let fromFile = try StallMonitor.Configuration(contentsOfFile: Self.shippedFile)
        #expect(fromFile == StallMonitor.Configuration())
    }

    @Test func defaultsAreValid() throws {
        try StallMonitor.Configuration().validate()
    }

    struct Invalid: Sendable, CustomTestStringConvertible {
        var key: String
        var value: String
        var reason: String
        var change: @Sendable (inout StallMonitor.Configuration) -> Void
        var testDescription: String { "\(key) = \(value)" }
    }

    static let invalid: [Invalid] = [
        Invalid(key: "threshold_ms", value: "0 ms", reason: "must be at least 10 ms") { $0.threshold = .zero },
        Invalid(key: "threshold_ms", value: "-5 ms", reason: "must be at least 10 ms") {
            $0.threshold = .milliseconds(-5)
        },
        Invalid(key: "threshold_ms", value: "9 ms", reason: "must be at least 10 ms") {
            $0.threshold = .milliseconds(9)
        },
        Invalid(key: "sample_interval_ms", value: "300 ms", reason: "must not exceed the threshold (250 ms)") {
            $0.sampleInterval = .milliseconds(300)
        },
        Invalid(key: "sample_interval_ms", value: "0 ms", reason: "must be at least 1 ms") {
            $0.sampleInterval = .zero
        },
        Invalid(key: "sample_timeout_ms", value: "0 ms", reason: "must be at least 1 ms") { $0.sampleTimeout = .zero },
        Invalid(key: "max_frames", value: "0", reason: "must be between 1 and 128") { $0.maximumFrames = 0 },
        Invalid(key: "max_frames", value: "500", reason: "must be between 1 and 128") { $0.maximumFrames = 500 },
        Invalid(key: "startup_grace_period_ms", value: "-1 ms", reason: "must not be negative") {
            $0.startupGracePeriod = .milliseconds(-1)
        },
        Invalid(key: "loop_start_timeout_ms", value: "50 ms", reason: "must be at least 100 ms") {
            $0.loopStartTimeout = .milliseconds(50)
        },
        Invalid(key: "signal", value: "9", reason: "must be SIGUSR1, SIGUSR2, SIGPROF or a real-time signal") {
            $0.signal = SIGKILL
        },
        Invalid(key: "rate_limit_burst", value: "0", reason: "must be between 1 and 1000") { $0.rateLimit.burst = 0 },
        Invalid(key: "report_queue_capacity", value: "0", reason: "must be between 1 and 10000") {
            $0.reportQueueCapacity = 0
        },
        Invalid(key: "syslog_identifier", value: "a=b", reason: "must be non-empty, without newlines or '='") {
            $0.syslogIdentifier = "a=b"
        },
    ]

    @Test(arguments: invalid)
    func invalidValueIsAnErrorNamingTheKeyTheValueAndWhy(_ invalid: Invalid) {
        var configuration = StallMonitor.Configuration()
        invalid.change(&configuration)
        #expect {
            try configuration.validate()
        } throws: { error in
            guard let error = error as? ConfigurationError else { return false }
            return error.key == invalid.key && error.value == invalid.value && error.reason.hasPrefix(invalid.reason)
        }
        // The monitor refuses it too: nothing starts.
        #expect(throws: ConfigurationError.self) { try StallMonitor(configuration: configuration, sinks: []) }
    }

    @Test func fileErrorsNameTheFileTheKeyAndTheValue() throws {
        func error(_ json: String) -> ConfigurationError? {
            do {
                _ = try StallMonitor.Configuration(json: Data(json.utf8), source: "/etc/x.json")
                return nil
            } catch {
                return error
            }
        }
        let unknown = try #require(error(#"{"treshold_ms": 100}"#))
        #expect(unknown.key == "treshold_ms")
        #expect(unknown.reason.hasPrefix("unknown key"))
        #expect(unknown.description.hasPrefix("/etc/x.json: treshold_ms"))

        let wrongType = try #require(error(#"{"threshold_ms": "fast"}"#))
        #expect(wrongType.key == "threshold_ms")
        #expect(wrongType.value == "\"fast\"")
        #expect(wrongType.reason == "must be a number of milliseconds")

        let outOfRange = try #require(error(#"{"threshold_ms": 100, "sample_interval_ms": 200}"#))
        #expect(outOfRange.key == "sample_interval_ms")
        #expect(outOfRange.source == "/etc/x.json")

        let notJSON = try #require(error("{threshold_ms: 1"))
        #expect(notJSON.reason.hasPrefix("not valid JSON"))

        let badSignal = try #require(error(#"{"signal": "SIGFOO"}"#))
        #expect(badSignal.key == "signal")
    }

    @Test func fileValuesAreRead() throws {
        let json =
            #"{"threshold_ms": 500, "sample_interval_ms": 12.5, "signal": "SIGRTMIN+3", "additional_modes": ["a"], "report_while_debugger_attached": true, "rate_limit_interval_s": 30}"#
        let configuration = try StallMonitor.Configuration(json: Data(json.utf8), source: "test")
        #expect(configuration.threshold == .milliseconds(500))
        #expect(configuration.sampleInterval == .microseconds(12_500))
        #expect(configuration.signal == stallmon_sigrtminForTests() + 3)
        #expect(configuration.additionalModes == ["a"])
        #expect(configuration.reportWhileDebuggerAttached)
        #expect(configuration.rateLimit.interval == .seconds(30))
    }

    @Test func environmentOverridesTheFile() throws {
        let configuration = try StallMonitor.Configuration.fromEnvironment([
            "STALLMON_CONFIG": Self.shippedFile,
            "STALLMON_THRESHOLD_MS": "400",
            "STALLMON_SIGNAL": "SIGUSR2",
            "STALLMON_ADDITIONAL_MODES": "one, two",
        ])
        #expect(configuration.threshold == .milliseconds(400))
        #expect(configuration.signal == SIGUSR2)
        #expect(configuration.additionalModes == ["one", "two"])

        #expect {
            _ = try StallMonitor.Configuration.fromEnvironment(["STALLMON_THRESHOLD_MS": "5"])
        } throws: { error in
            (error as? ConfigurationError)?.description
                == "STALLMON_THRESHOLD_MS: threshold_ms = 5 ms: must be at least 10 ms"
        }
        #expect(throws: ConfigurationError.self) {
            _ = try StallMonitor.Configuration.fromEnvironment(["STALLMON_CONFIG": "/nonexistent/stallmon.json"])
        }
    }
}

func stallmon_sigrtminForTests() -> Int32 { SignalName.parse("SIGRTMIN")!.number! }
