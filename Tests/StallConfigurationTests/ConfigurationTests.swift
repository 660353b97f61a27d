import Foundation
import StallConfiguration
import StallMonitor
import Testing

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
        Invalid(key: "syslog_identifier", value: "\"a=b\"", reason: "must be 1 to 48 printable ASCII characters") {
            $0.syslogIdentifier = "a=b"
        },
        Invalid(key: "syslog_identifier", value: "\"foo bar\"", reason: "must be 1 to 48 printable ASCII characters") {
            $0.syslogIdentifier = "foo bar"
        },
        Invalid(
            key: "syslog_identifier", value: "\"" + String(repeating: "x", count: 60) + "… (100000 characters)",
            reason: "must be 1 to 48 printable ASCII characters"
        ) {
            $0.syslogIdentifier = String(repeating: "x", count: 100_000)
        },
        Invalid(key: "startup_grace_period_ms", value: "86400001 ms", reason: "must be at most 1 day") {
            $0.startupGracePeriod = .milliseconds(86_400_001)
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
        #expect(
            notJSON.description
                == "/etc/x.json: (file): not valid JSON: a key in double quotes was expected at line 1, column 2")

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
                == #"STALLMON_THRESHOLD_MS: threshold_ms = "5": must be at least 10 ms"#
        }
        #expect(throws: ConfigurationError.self) {
            _ = try StallMonitor.Configuration.fromEnvironment(["STALLMON_CONFIG": "/nonexistent/stallmon.json"])
        }
    }

    static func error(json: String) -> ConfigurationError? {
        do {
            _ = try StallMonitor.Configuration(json: Data(json.utf8), source: "/etc/x.json")
            return nil
        } catch {
            return error
        }
    }

    static func error(environment: [String: String]) -> ConfigurationError? {
        do {
            _ = try StallMonitor.Configuration.fromEnvironment(environment)
            return nil
        } catch {
            return error
        }
    }

    @Test(arguments: [
        #"{"signal": 1e300}"#, #"{"signal": -1e300}"#, #"{"signal": 34.9}"#, #"{"signal": "SIGRTMIN+2147483647"}"#,
        #"{"signal": "SIGRTMAX-2147483648"}"#, #"{"signal": "SIGRTMIN++4"}"#, #"{"signal": "SIGRTMIN4"}"#,
        #"{"signal": "34.9"}"#, #"{"signal": true}"#,
    ])
    func signalThatIsNoSignalIsAnErrorNotACrash(_ json: String) throws {
        let error = try #require(Self.error(json: json))
        #expect(error.key == "signal")
        #expect(error.source == "/etc/x.json")
        #expect(error.reason.hasPrefix("must be"))
    }

    @Test func signalFromTheEnvironmentThatIsNoSignalIsAnError() throws {
        for text in ["SIGRTMIN+2147483647", "SIGRTMAX-99999999999", "34.9", "0x22"] {
            let error = try #require(Self.error(environment: ["STALLMON_SIGNAL": text]), "\(text)")
            #expect(error.key == "signal")
            #expect(error.source == "STALLMON_SIGNAL")
            #expect(error.value == "\"\(text)\"")
        }
        // Still read: the forms the README names.
        let rtmin = stallmon_sigrtminForTests()
        for (text, number) in [
            ("SIGRTMIN+3", rtmin + 3), ("sigrtmax-2", SignalName.parse("SIGRTMAX")!.number! - 2),
            ("SIGUSR2", SIGUSR2), ("\(rtmin + 1)", rtmin + 1),
        ] {
            #expect(try StallMonitor.Configuration.fromEnvironment(["STALLMON_SIGNAL": text]).signal == number)
        }
        #expect(try StallMonitor.Configuration(json: Data(#"{"signal": 36}"#.utf8), source: "x").signal == 36)
    }

    @Test func jsonThatIsNotStrictlyJSONIsRefusedWithLineAndColumn() throws {
        let trailing = try #require(Self.error(json: "{\n  \"threshold_ms\": 300,\n}"))
        #expect(trailing.key == "(file)")
        #expect(trailing.reason == "not valid JSON: a trailing comma before '}' at line 3, column 1")
        let trailingInList = try #require(Self.error(json: #"{"additional_modes": ["a",]}"#))
        #expect(trailingInList.reason.contains("a trailing comma before ']'"))
        let twice = try #require(Self.error(json: #"{"threshold_ms": 300, "threshold_ms": 20}"#))
        #expect(twice.reason.contains(#"the key "threshold_ms" appears more than once"#))
        for text in [
            #"{"threshold_ms": 0x10}"#, #"{"threshold_ms": 01}"#, #"{"threshold_ms": .5}"#,
            #"{"threshold_ms": NaN}"#, "{\"threshold_ms\": 300}\n{}", String(repeating: "[", count: 100_000),
        ] {
            let error = try #require(Self.error(json: text), "\(text.prefix(40))")
            #expect(error.reason.hasPrefix("not valid JSON"), "\(text.prefix(40))")
        }
        // A boolean is not a number, and a number is not a boolean.
        #expect(Self.error(json: #"{"threshold_ms": true}"#)?.key == "threshold_ms")
        #expect(Self.error(json: #"{"notify_status": 1}"#)?.key == "notify_status")
    }

    @Test func numbersOutsideEveryRangeAreRefusedWithTheValueAsWritten() throws {
        let huge = try #require(Self.error(json: #"{"threshold_ms": 1e13}"#))
        #expect(huge.description == "/etc/x.json: threshold_ms = 1e13: must be at most 1 hour")
        let infinite = try #require(Self.error(json: #"{"rate_limit_interval_s": 1e400}"#))
        #expect(infinite.description == "/etc/x.json: rate_limit_interval_s = 1e400: must be at most 1 day")
        let negative = try #require(Self.error(json: #"{"max_frames": -1e300}"#))
        #expect(negative.description == "/etc/x.json: max_frames = -1e300: must be between 1 and 128")
        let hexadecimal = try #require(Self.error(environment: ["STALLMON_THRESHOLD_MS": "0x10"]))
        #expect(
            hexadecimal.description
                == #"STALLMON_THRESHOLD_MS: threshold_ms = "0x10": must be a number of milliseconds"#)
        for text in ["+300", ".5", "300ms", "inf", "nan", "1_000", "3e"] {
            #expect(Self.error(environment: ["STALLMON_THRESHOLD_MS": text])?.key == "threshold_ms", "\(text)")
        }
        #expect(
            try StallMonitor.Configuration.fromEnvironment(["STALLMON_THRESHOLD_MS": " 1e3 "]).threshold == .seconds(1))
    }

    @Test func cooperativePoolIsAutomaticByDefaultAndTurnsOnWithItsOwnThreshold() throws {
        #expect(StallMonitor.Configuration().cooperativePool == nil)
        #expect(StallMonitor.Configuration().summary.contains("cooperative_pool=auto"))
        #expect(
            try StallMonitor.Configuration.fromEnvironment(["STALLMON_COOPERATIVE_POOL": "auto"]).cooperativePool == nil
        )
        #expect(
            try StallMonitor.Configuration.fromEnvironment(["STALLMON_COOPERATIVE_POOL": "false"]).cooperativePool
                == false)
        let configuration = try StallMonitor.Configuration.fromEnvironment([
            "STALLMON_COOPERATIVE_POOL": "true", "STALLMON_COOPERATIVE_POOL_THRESHOLD_MS": "40",
        ])
        #expect(configuration.cooperativePool == true)
        #expect(configuration.cooperativePoolThreshold == .milliseconds(40))
        #expect(configuration.threshold == .milliseconds(250))
        #expect(configuration.summary.hasSuffix("cooperative_pool=true cooperative_pool_threshold_ms=40"))
        let low = try #require(Self.error(environment: ["STALLMON_COOPERATIVE_POOL_THRESHOLD_MS": "5"]))
        #expect(
            low.description
                == #"STALLMON_COOPERATIVE_POOL_THRESHOLD_MS: cooperative_pool_threshold_ms = "5": must be at least 10 ms"#
        )
        #expect(Self.error(json: #"{"cooperative_pool": "maybe"}"#)?.key == "cooperative_pool")
    }

    @Test func misspelledVariableIsAnErrorNamingTheKeyItResembles() throws {
        let typo = try #require(Self.error(environment: ["STALLMON_TRESHOLD_MS": "500"]))
        #expect(typo.source == "STALLMON_TRESHOLD_MS")
        #expect(typo.key == "treshold_ms")
        #expect(typo.reason.hasPrefix("unknown variable; did you mean STALLMON_THRESHOLD_MS?"))
        let lowercase = try #require(Self.error(environment: ["stallmon_notify_status": "1"]))
        #expect(lowercase.reason.hasPrefix("unknown variable; did you mean STALLMON_NOTIFY_STATUS?"))
        let unlike = try #require(Self.error(environment: ["STALLMON_COLOUR": "blue"]))
        #expect(unlike.reason.hasPrefix("unknown variable (known: STALLMON_THRESHOLD_MS"))
        let config = try #require(Self.error(environment: ["STALLMON_CONFG": "/etc/x.json"]))
        #expect(config.reason.hasPrefix("unknown variable; did you mean STALLMON_CONFIG?"))
        // Variables of other prefixes are none of the monitor's business.
        #expect(Self.error(environment: ["STALLMOND_WINDOWS_S": "60", "STALLMONX": "1", "PATH": "/bin"]) == nil)
        let unknownKey = try #require(Self.error(json: #"{"sample_intervall_ms": 5}"#))
        #expect(unknownKey.reason.hasPrefix("unknown key; did you mean sample_interval_ms?"))
    }

    @Test func emptyListElementsAndAnEmptyConfigPathAreErrors() throws {
        let modes = try #require(Self.error(environment: ["STALLMON_ADDITIONAL_MODES": "a,,b"]))
        #expect(modes.key == "additional_modes")
        #expect(modes.reason == "must be a list of run-loop mode names (an element between commas is empty)")
        #expect(Self.error(environment: ["STALLMON_ADDITIONAL_MODES": "a,"])?.key == "additional_modes")
        let empty = try #require(Self.error(environment: ["STALLMON_CONFIG": ""]))
        #expect(empty.source == "STALLMON_CONFIG")
        #expect(empty.reason.hasPrefix("is set but empty"))
    }

    @Test func syslogIdentifierIsBoundedTo48PrintableCharacters() throws {
        let longest = String(repeating: "a", count: 48)
        #expect(
            try StallMonitor.Configuration.fromEnvironment(["STALLMON_SYSLOG_IDENTIFIER": longest]).syslogIdentifier
                == longest)
        let long = try #require(
            Self.error(json: #"{"syslog_identifier": ""# + String(repeating: "a", count: 100_000) + #""}"#))
        #expect(long.key == "syslog_identifier")
        #expect(long.description.count < 200, "the message shows the start of the value and its length")
        #expect(long.value.hasSuffix("(100000 characters)"))
        #expect(Self.error(environment: ["STALLMON_SYSLOG_IDENTIFIER": longest + "a"])?.key == "syslog_identifier")
        #expect(Self.error(json: #"{"syslog_identifier": "café"}"#)?.key == "syslog_identifier")
        #expect(Self.error(json: #"{"syslog_identifier": "a\u0000b"}"#)?.key == "syslog_identifier")
    }
}

func stallmon_sigrtminForTests() -> Int32 { SignalName.parse("SIGRTMIN")!.number! }
