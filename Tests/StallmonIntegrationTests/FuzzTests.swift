import ArgumentParser
import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

@testable import StallConfiguration
@testable import StallMonitor
@testable import stallmon
@testable import stallmond_daemon

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Randomized tests of everything that reads outside input: both configuration readers (files and
    /// variables), the journal-entry parsers and the two commands' argument parsing. Each input of the
    /// seed corpus in `fuzz/corpus/<reader>/` runs as it is, then mutated (bits, bytes, tokens that
    /// broke parsers before, splices of two inputs) and as random bytes, from a seeded generator.
    ///
    /// The property: no input traps. A reader either accepts it, and then every value lies inside its
    /// documented bounds (`config/README.md`, `README.md`), or throws its error naming the key or field.
    ///
    /// `FUZZ_ITERATIONS` (mutated inputs per reader, default 2000) and `FUZZ_SEED` (default fixed, so
    /// that a failure in CI reproduces) make longer or other runs. A trap prints the input that
    /// caused it and leaves it in `$TMPDIR/stallmon-fuzz-crash`. Serial: it keeps a core busy for
    /// seconds, which would change what the stall tests measure.
    @Suite
    struct FuzzTests {
        // MARK: The configuration readers

        @Test func monitorConfigurationFromJSONNeverTraps() throws {
            try Self.fuzz("monitor-json") { input in
                do throws(ConfigurationError) {
                    let configuration = try StallMonitor.Configuration(json: Data(input), source: "fuzz.json")
                    Self.checkBounds(configuration, input)
                } catch {
                    Self.check(error, keys: ConfigurationKey.allCases.map(\.rawValue), input)
                }
            }
        }

        @Test func monitorConfigurationFromTheEnvironmentNeverTraps() throws {
            let file = try Self.shippedFile("config/stallmon.json")
            try Self.fuzz("monitor-env") { input in
                var environment = Self.environment(input)
                // Any file named is read; keep to one that exists, and to the empty value.
                if let path = environment["STALLMON_CONFIG"], !path.isEmpty { environment["STALLMON_CONFIG"] = file }
                do throws(ConfigurationError) {
                    let configuration = try StallMonitor.Configuration.fromEnvironment(environment)
                    Self.checkBounds(configuration, input)
                } catch {
                    Self.check(error, keys: ConfigurationKey.allCases.map(\.rawValue), input)
                }
            }
        }

        @Test func collectorConfigurationFromJSONNeverTraps() throws {
            try Self.fuzz("collector-json") { input in
                do throws(ConfigurationError) {
                    let configuration = try CollectorConfiguration.parse(
                        json: Data(input), source: "fuzz.json", environment: [:])
                    Self.checkBounds(configuration, input)
                } catch {
                    Self.check(error, keys: CollectorConfiguration.Key.allCases.map(\.rawValue), input)
                }
            }
        }

        @Test func collectorConfigurationFromTheEnvironmentNeverTraps() throws {
            try Self.fuzz("collector-env") { input in
                let environment = Self.environment(input)
                do throws(ConfigurationError) {
                    _ = try CollectorConfiguration.Location.resolve(option: nil, environment: environment)
                    let configuration = try CollectorConfiguration.parse(
                        json: nil, source: "fuzz.json", environment: environment)
                    Self.checkBounds(configuration, input)
                } catch {
                    Self.check(error, keys: CollectorConfiguration.Key.allCases.map(\.rawValue), input)
                }
            }
        }

        // MARK: The journal-entry parsers

        @Test func journalEntryParsersNeverTrap() throws {
            try Self.fuzz("journal") { input in
                let fields = Self.environment(input)
                do throws(JournalDecodingError) {
                    let record = try StallRecord(journalFields: fields)
                    let again = try StallRecord(journalFields: Self.dictionary(record.fields))
                    #expect(again == record, "a record reads back as written: \(Self.shown(input))")
                    Self.checkCounts(
                        [
                            ("PRIORITY", record.priority), ("STALL_THREAD_TID", record.threadID),
                            ("STALL_SAMPLES", record.samples), ("STALL_SAMPLES_UNANSWERED", record.samplesUnanswered),
                            ("STALL_STACK_SAMPLES", record.stackSamples),
                        ], input)
                } catch {
                    Self.check(error, fields, input)
                }
                do throws(JournalDecodingError) {
                    let record = try SuppressionRecord(journalFields: fields)
                    let again = try SuppressionRecord(journalFields: Self.dictionary(record.fields))
                    #expect(again == record, "a record reads back as written: \(Self.shown(input))")
                    Self.checkCounts(
                        [
                            ("PRIORITY", record.priority), ("STALL_THREAD_TID", record.threadID),
                            ("STALL_SUPPRESSED_COUNT", record.count), ("STALL_RATE_LIMIT_BURST", record.rateLimitBurst),
                        ], input)
                } catch {
                    Self.check(error, fields, input)
                }
            }
        }

        // MARK: Argument parsing

        @Test func commandLineParsingNeverTraps() throws {
            try Self.fuzz("argv", dictionary: Self.argumentTokens) { input in
                var arguments = String(decoding: input, as: UTF8.self).split(
                    separator: "\n", omittingEmptySubsequences: false
                )
                .map(String.init)
                if arguments.last == "" { arguments.removeLast() }
                let program = arguments.first
                let rest = Array(arguments.dropFirst())
                // Parsing (and each command's validate()) either gives a command or throws: no trap.
                // Nothing runs: run() would read the journal or start a daemon.
                if program == "stallmond" {
                    _ = try? Stallmond.parseAsRoot(rest)
                    _ = try? Stallmon.parseAsRoot(rest)
                } else {
                    _ = try? Stallmon.parseAsRoot(rest)
                    _ = try? Stallmond.parseAsRoot(rest)
                }
            }
        }

        // MARK: Properties

        /// Every value of an accepted monitor configuration is inside the bounds `config/README.md` gives.
        static func checkBounds(_ c: StallMonitor.Configuration, _ input: [UInt8]) {
            let low = SignalName.parse("SIGRTMIN")!.number!
            let high = SignalName.parse("SIGRTMAX")!.number!
            let within: [(String, Bool)] = [
                ("threshold_ms", (Duration.milliseconds(10)...Duration.seconds(3600)).contains(c.threshold)),
                ("sample_interval_ms", (Duration.milliseconds(1)...c.threshold).contains(c.sampleInterval)),
                ("sample_timeout_ms", (Duration.milliseconds(1)...Duration.seconds(10)).contains(c.sampleTimeout)),
                ("max_frames", (1...128).contains(c.maximumFrames)),
                ("max_stacks", (1...4096).contains(c.maximumStacks)),
                ("startup_grace_period_ms", (Duration.zero...Duration.seconds(86400)).contains(c.startupGracePeriod)),
                (
                    "signal",
                    c.signal.map { [SIGUSR1, SIGUSR2, SIGPROF].contains($0) || (low...high).contains($0) } ?? true
                ),
                ("rate_limit_burst", (1...1000).contains(c.rateLimit.burst)),
                (
                    "rate_limit_interval_s",
                    (Duration.seconds(1)...Duration.seconds(86400)).contains(c.rateLimit.interval)
                ),
                ("report_queue_capacity", (1...10_000).contains(c.reportQueueCapacity)),
                (
                    "syslog_identifier",
                    c.syslogIdentifier.map { identifier in
                        (1...48).contains(identifier.utf8.count)
                            && identifier.utf8.allSatisfy { (0x21...0x7E).contains($0) && !"=[:".utf8.contains($0) }
                    } ?? true
                ),
                (
                    "additional_modes",
                    c.additionalModes.count <= 16
                        && c.additionalModes.allSatisfy { mode in
                            (1...255).contains(mode.utf8.count)
                                && !mode.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
                        }
                ),
            ]
            for (key, ok) in within where !ok {
                Issue.record("accepted \(key) outside its bounds: \(c.summary) from \(shown(input))")
            }
            #expect(throws: Never.self, "accepted, then refused: \(shown(input))") { try c.validate() }
            _ = c.summary
        }

        /// Every value of an accepted collector configuration is inside the bounds `config/README.md`
        /// gives, and stallmond's own monitor takes its part: what `--check-config` accepts, starts.
        static func checkBounds(_ c: CollectorConfiguration, _ input: [UInt8]) {
            func isPath(_ path: String) -> Bool {
                path.hasPrefix("/") && path.utf8.count <= 4096 && !path.unicodeScalars.contains { $0.value < 0x20 }
            }
            let within: [(String, Bool)] = [
                ("metrics_path", c.metricsPath.isEmpty || (isPath(c.metricsPath) && c.metricsPath.hasSuffix(".prom"))),
                ("metrics_interval_s", (Duration.seconds(1)...Duration.seconds(86400)).contains(c.metricsInterval)),
                (
                    "windows_s",
                    (1...8).contains(c.windows.count)
                        && c.windows.allSatisfy {
                            (Duration.seconds(10)...Duration.seconds(30 * 86400)).contains($0)
                                && $0.components.attoseconds == 0
                        } && zip(c.windows, c.windows.dropFirst()).allSatisfy { $0 < $1 }
                ),
                ("max_fingerprints_per_unit", (1...1000).contains(c.maximumFingerprintsPerUnit)),
                ("max_endpoints_per_unit", (1...1000).contains(c.maximumEndpointsPerUnit)),
                (
                    "histogram_buckets_ms",
                    (1...30).contains(c.histogramBuckets.count)
                        && c.histogramBuckets.allSatisfy {
                            (Duration.milliseconds(1)...Duration.seconds(86400)).contains($0)
                                && $0.components.attoseconds % 1_000_000_000_000 == 0
                        }
                        && zip(c.histogramBuckets, c.histogramBuckets.dropFirst()).allSatisfy { $0 < $1 }
                ),
                (
                    "digest_interval_s",
                    c.digestInterval == .zero
                        || (Duration.seconds(10)...Duration.seconds(30 * 86400)).contains(c.digestInterval)
                ),
                ("state_directory", c.stateDirectory.map(isPath) ?? true),
                (
                    "monitor_threshold_ms",
                    (Duration.milliseconds(10)...Duration.seconds(3600)).contains(c.monitorThreshold)
                ),
                ("max_tracked_stalls", (100...10_000_000).contains(c.maximumTrackedStalls)),
            ]
            for (key, ok) in within where !ok {
                Issue.record("accepted \(key) outside its bounds: \(c.summary) from \(shown(input))")
            }
            #expect(throws: Never.self, "accepted, then refused: \(shown(input))") { try c.validate() }
            #expect(throws: Never.self, "accepted, then stallmond's monitor refuses it: \(shown(input))") {
                _ = try StallMonitor(configuration: c.monitorConfiguration, sinks: [])
            }
            _ = c.summary
        }

        /// A refusal names a key the reader knows, the file, or the unknown key or variable, says why,
        /// says where, and stays short whatever the input.
        static func check(_ error: ConfigurationError, keys: [String], _ input: [UInt8]) {
            let namesTheKey = keys.contains(error.key) || error.key == "(file)" || error.reason.hasPrefix("unknown ")
            #expect(namesTheKey, "the error names no key: \(error) from \(shown(input))")
            #expect(!error.reason.isEmpty && error.source?.isEmpty == false, "\(error)")
            #expect(error.description.count < 1200, "a long input makes a long message: \(error.description.count)")
        }

        /// A refused entry names the field that is missing or malformed.
        static func check(_ error: JournalDecodingError, _ fields: [String: String], _ input: [UInt8]) {
            #expect(!error.field.isEmpty && !error.reason.isEmpty, "\(error) from \(shown(input))")
            #expect(
                (fields[error.field] == nil) == (error.value == nil),
                "the error's value is the field's, or none for a missing field: \(error) from \(shown(input))")
        }

        /// Counts, thread ids and priorities are never negative; a syslog priority is 0 to 7.
        static func checkCounts(_ values: [(String, Int)], _ input: [UInt8]) {
            for (field, value) in values where value < 0 || (field == "PRIORITY" && value > 7) {
                Issue.record("accepted \(field)=\(value) from \(shown(input))")
            }
        }

        // MARK: The harness

        static let corpusDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("fuzz/corpus")

        static func shippedFile(_ path: String) throws -> String {
            let url = corpusDirectory.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent(
                path)
            try #require(FileManager.default.fileExists(atPath: url.path))
            return url.path
        }

        /// Tokens that broke a reader before, or sit at the edge of a bound.
        static let tokens: [String] = [
            "1e10", "-1e300", "1e400", "1e-400", "0x10", "34.9", "-0", "0", "9", "1.0001", "3600001", "19",
            "9223372036854775807", "-9223372036854775809", "18446744073709551616", "SIGRTMIN+2147483647",
            "SIGRTMAX-2147483648", "SIGRTMIN", "auto", ",", ",,", ",]", ",}", "[", "]", "{", "}", ":", "\"", "\\",
            "\\u0000", "\\ud800", "null", "true", "false", "\"\"", "[]", "{}", "=", "\n", " ", "\u{0}", "\u{FF}",
            "STALLMON_", "STALLMOND_", "STALLMON_CONFIG=", "STALLMOND_CONFIG=", "_S", "_MS", "é",
            String(repeating: "a", count: 1000), String(repeating: "[", count: 64), String(repeating: "9", count: 400),
        ]

        static let argumentTokens: [String] =
            tokens + [
                "report", "follow", "demo", "--since", "--unit", "--json", "--lines", "--stall-ms", "--config",
                "--check-config", "--help", "-h", "--version", "--", "-", "--since=", "--lines=", "30s", "15m", "2h",
                "--folded", "--flamegraph", "--flamegraph=",
                "--by", "route", "fingerprint",
                "7d",
                "today", "yesterday", "2026-11-22", "2026-11-22 23:59:60", "99999999999999999999d", "-1", "1e10",
                "--generate-completion-script", "bash", "--experimental-dump-help",
            ]

        /// Runs `body` on every corpus input of `kind`, then on mutated and random inputs.
        static func fuzz(
            _ kind: String, dictionary: [String] = tokens, _ body: ([UInt8]) throws -> Void
        ) throws {
            let directory = corpusDirectory.appendingPathComponent(kind)
            let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
            let corpus = try names.map { Array(try Data(contentsOf: directory.appendingPathComponent($0))) }
            try #require(!corpus.isEmpty, "no corpus in \(directory.path)")
            let environment = ProcessInfo.processInfo.environment
            let iterations = environment["FUZZ_ITERATIONS"].flatMap(Int.init) ?? 2000
            let seed = environment["FUZZ_SEED"].flatMap { UInt64($0) } ?? 0x5EED_57A1
            var generator = SplitMix64(seed: seed ^ fnv(kind))
            let tokens = dictionary.map { Array($0.utf8) }
            CrashReport.install(kind: kind)
            defer { CrashReport.clear() }

            for input in corpus {
                CrashReport.remember(input)
                try body(input)
            }
            for _ in 0..<iterations {
                var input: [UInt8]
                if generator.next() % 16 == 0 {
                    input = (0..<Int(generator.next() % 256)).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
                } else {
                    input = corpus[Int(generator.next() % UInt64(corpus.count))]
                    for _ in 0..<(1 + Int(generator.next() % 4)) {
                        mutate(&input, corpus: corpus, tokens: tokens, &generator)
                    }
                }
                CrashReport.remember(input)
                try body(input)
            }
        }

        static func mutate(_ input: inout [UInt8], corpus: [[UInt8]], tokens: [[UInt8]], _ generator: inout SplitMix64)
        {
            func position(_ extra: Int = 0) -> Int { Int(generator.next() % UInt64(input.count + extra)) }
            switch generator.next() % 7 {
            case 0 where !input.isEmpty:  // flip a bit
                input[position()] ^= 1 << (generator.next() % 8)
            case 1 where !input.isEmpty:  // a random byte
                input[position()] = UInt8(truncatingIfNeeded: generator.next())
            case 2, 3:  // a token: insert, or replace a run
                let token = tokens[Int(generator.next() % UInt64(tokens.count))]
                let at = position(1)
                let length = generator.next() % 2 == 0 ? 0 : min(input.count - at, Int(generator.next() % 8))
                input.replaceSubrange(at..<at + length, with: token)
            case 4 where !input.isEmpty:  // delete a run
                let at = position()
                input.removeSubrange(at..<min(input.count, at + 1 + Int(generator.next() % 16)))
            case 5 where !input.isEmpty:  // repeat a run
                let at = position()
                let run = input[at..<min(input.count, at + 1 + Int(generator.next() % 32))]
                input.insert(contentsOf: run, at: position(1))
            default:  // splice: this input's start, another's end
                let other = corpus[Int(generator.next() % UInt64(corpus.count))]
                let cut = input.isEmpty ? 0 : position()
                let from = other.isEmpty ? 0 : Int(generator.next() % UInt64(other.count))
                input = Array(input[..<cut]) + other[from...]
            }
            if input.count > 256 * 1024 { input.removeLast(input.count - 256 * 1024) }
        }

        /// `NAME=VALUE` lines (split at the first `=`; lines without one are skipped).
        static func environment(_ input: [UInt8]) -> [String: String] {
            var result: [String: String] = [:]
            for line in String(decoding: input, as: UTF8.self).split(separator: "\n") {
                guard let equals = line.firstIndex(of: "=") else { continue }
                result[String(line[..<equals])] = String(line[line.index(after: equals)...])
            }
            return result
        }

        static func dictionary(_ fields: [JournalField]) -> [String: String] {
            Dictionary(fields.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
        }

        static func shown(_ input: [UInt8]) -> String {
            let text = String(decoding: input.prefix(300), as: UTF8.self).debugDescription
            return input.count > 300 ? text + "… (\(input.count) bytes)" : text
        }

        static func fnv(_ text: String) -> UInt64 {
            text.utf8.reduce(0xcbf2_9ce4_8422_2325) { ($0 ^ UInt64($1)) &* 0x100_0000_01b3 }
        }
    }
}

/// A small, fast, seedable generator (Steele, Lea and Flood's SplitMix64).
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// On a trap (SIGILL on x86-64, SIGTRAP on arm64) writes the input under test to standard error
/// and to `$TMPDIR/stallmon-fuzz-crash`, then lets the previous handler (Swift's backtracer) run.
/// The handler only reads memory set up beforehand and calls `write`, `open`, `close` and `sigaction`.
enum CrashReport {
    nonisolated(unsafe) static let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 * 1024, alignment: 1)
    nonisolated(unsafe) static var length = 0
    nonisolated(unsafe) static let header = UnsafeMutableRawBufferPointer.allocate(byteCount: 512, alignment: 1)
    nonisolated(unsafe) static var headerLength = 0
    nonisolated(unsafe) static let path = strdup(NSTemporaryDirectory() + "stallmon-fuzz-crash")!
    /// The handlers in place before ours: SIGILL's, then SIGTRAP's.
    nonisolated(unsafe) static let previous = UnsafeMutablePointer<sigaction>.allocate(capacity: 2)
    nonisolated(unsafe) static var installed = false

    static func install(kind: String) {
        let text = Array("\nfuzz (\(kind)): this input trapped; it is also in \(String(cString: path)):\n".utf8)
        headerLength = min(text.count, header.count)
        header.copyBytes(from: text.prefix(headerLength))
        guard !installed else { return }
        installed = true
        for (index, number) in [SIGILL, SIGTRAP].enumerated() {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { number in
                _ = write(2, CrashReport.header.baseAddress, CrashReport.headerLength)
                _ = write(2, CrashReport.buffer.baseAddress, CrashReport.length)
                _ = write(2, "\n", 1)
                let file = open(CrashReport.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                if file >= 0 {
                    _ = write(file, CrashReport.buffer.baseAddress, CrashReport.length)
                    close(file)
                }
                // The previous handler takes over when the trapping instruction runs again.
                sigaction(number, CrashReport.previous + (number == SIGILL ? 0 : 1), nil)
            }
            sigemptyset(&action.sa_mask)
            sigaction(number, &action, previous + index)
        }
    }

    static func remember(_ input: [UInt8]) {
        length = min(input.count, buffer.count)
        buffer.copyBytes(from: input.prefix(length))
    }

    static func clear() { length = 0 }
}
