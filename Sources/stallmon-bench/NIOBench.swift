import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The SwiftNIO part: wrk against StallmonNIOServer's `/hello` on one event loop, the server
/// unmonitored against monitored by StallMonitorNIO (default configuration), alternating in every
/// round; the group watchdog's wakeups under that load and idle; and the detection latency of
/// deliberate handler stalls. The benchmark drives the server binary as a child process and never
/// links SwiftNIO itself.
struct NIOBench {
    let server: String
    let wrk: String
    let plan: NIOPlan
    let progress: (String) -> Void

    static func wrkPath() throws -> String {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        guard
            let found = path.split(separator: ":").map({ "\($0)/wrk" }).first(
                where: FileManager.default.isExecutableFile)
        else {
            throw ChildRunner.Failure(
                description:
                    "wrk not found: install it (apt-get install -y wrk), or skip the SwiftNIO benchmark with --no-nio")
        }
        return found
    }

    /// One round: both servers start and warm up, then take wrk in turn, `segments` runs each of a
    /// second (the order alternating, so that neighbouring runs share the machine's mood); then the
    /// monitored server idles, and the stalls run on a server of their own. The watchdog's wakeups
    /// under load are counted inside the monitored server's longer warm-up run, away from its start
    /// and end (a loop that becomes busy or idle costs a wakeup or two that steady load does not).
    func round(_ index: Int, of total: Int) throws -> NIORound {
        var round = NIORound()
        var servers: [Variant: NIOServerChild] = [:]
        defer { for server in servers.values { server.stop() } }
        for variant in [Variant.unmonitored, .stallmon] {
            servers[variant] = try start(variant == .stallmon ? [] : ["--no-monitor"])
        }
        guard let monitored = servers[.stallmon], let watchdog = monitored.thread(named: "stallmon-nio") else {
            throw ChildRunner.Failure(description: "the monitored server has no stallmon-nio thread")
        }
        usleep(UInt32(plan.settle * 1e6))
        // Both warm up as long.
        if let unmonitored = servers[.unmonitored] {
            _ = try runWrk(port: unmonitored.port, seconds: plan.busySeconds + 1)
        }
        _ = try runWrk(port: monitored.port, seconds: plan.busySeconds + 1) {
            usleep(500_000)
            let before = monitored.voluntarySwitches(ofThread: watchdog)
            let started = Kernel.now()
            usleep(UInt32(plan.busySeconds) * 1_000_000)
            if let before, let after = monitored.voluntarySwitches(ofThread: watchdog) {
                round.busyWakeupsPerSecond = Double(after - before) / (Double(Kernel.now() - started) / 1e9)
            }
        }
        round.segments = try Self.alternatingRuns(plan.segments, round: index, on: servers) {
            try runWrk(port: $0, seconds: 1)
        }
        usleep(UInt32(plan.idleSettle * 1e6))
        let idleBefore = monitored.voluntarySwitches(ofThread: watchdog)
        let idleStarted = Kernel.now()
        usleep(UInt32(plan.idleSeconds * 1e6))
        if let idleBefore, let idleAfter = monitored.voluntarySwitches(ofThread: watchdog) {
            round.idleWakeupsPerSecond = Double(idleAfter - idleBefore) / (Double(Kernel.now() - idleStarted) / 1e9)
        }
        for (variant, server) in servers {
            let stalls = Self.reports(in: server.stop()).filter { $0.event == "detected" }.count
            if variant == .stallmon { round.stallsUnderLoad = stalls }
        }
        for variant in [Variant.unmonitored, .stallmon] {
            progress(
                "[\(index)/\(total)] nio hello \(variant.rawValue): \(Report.grouped(round.rate(variant) ?? .nan)) requests/s, "
                    + "\(Report.grouped(round.cpuRate(variant) ?? .nan)) per CPU second, "
                    + "p99 \(Report.format(round.p99(variant) ?? .nan)) µs"
                    + (variant == .stallmon
                        ? "; watchdog \(Report.format(round.busyWakeupsPerSecond ?? .nan)) wakeups/s, idle "
                            + "\(Report.format(round.idleWakeupsPerSecond ?? .nan)) wakeups/s"
                            + (round.stallsUnderLoad > 0 ? ", \(round.stallsUnderLoad) stalls reported" : "")
                        : "")
            )
        }
        round.stalls = try stalls()
        if let stalls = round.stalls {
            progress(
                "[\(index)/\(total)] nio stalls: \(stalls.detected) of \(stalls.count) detected, past the threshold "
                    + "p50 \(Report.format(stalls.latencyP50 ?? .nan)) ms, p99 \(Report.format(stalls.latencyP99 ?? .nan)) ms; "
                    + "duration error p99 \(Report.format(stalls.durationErrorP99 ?? .nan)) ms"
            )
        }
        return round
    }

    /// The server on one event loop, its reports on its standard output.
    private func start(_ arguments: [String], environment: [String: String] = [:]) throws -> NIOServerChild {
        try NIOServerChild(
            [server, "--port", "0", "--threads", "1", "--print-reports"] + arguments, environment: environment)
    }

    // MARK: - wrk

    struct WrkResult: Sendable {
        var requests: Double
        var seconds: Double
        var p50Microseconds: Double
        var p99Microseconds: Double
        /// The server's CPU time (all its threads) during the run.
        var cpuSeconds = 0.0
    }

    /// wrk's own summary is rounded for people; this script prints what the figures need.
    static let script = """
        done = function(summary, latency, requests)
          local e = summary.errors
          io.write(string.format("wrk-result requests=%d duration_us=%d errors=%d p50_us=%.0f p99_us=%.0f\\n",
            summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
            latency:percentile(50), latency:percentile(99)))
        end
        """

    /// One wrk run of `seconds`; `meanwhile` runs while it does.
    private func runWrk(port: Int, seconds: Int, meanwhile: () -> Void = {}) throws -> WrkResult {
        try Self.runWrk(
            wrk, url: "http://127.0.0.1:\(port)/hello", connections: plan.connections, seconds: seconds,
            meanwhile: meanwhile)
    }

    /// One wrk run of `seconds` on `url`, its one thread keeping `connections` connections;
    /// `meanwhile` runs while it does.
    static func runWrk(
        _ wrk: String, url: String, connections: Int, seconds: Int, meanwhile: () -> Void = {}
    ) throws -> WrkResult {
        let scriptFile = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-bench-\(getpid())-wrk.lua")
        try Self.script.write(to: scriptFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: scriptFile) }
        let command = [
            wrk, "-t", "1", "-c", "\(connections)", "-d", "\(seconds)s", "--timeout", "5s", "-s", scriptFile.path, url,
        ]
        let process = Process()
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        meanwhile()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0,
            let line = text.split(separator: "\n").last(where: { $0.hasPrefix("wrk-result ") })
        else {
            throw ChildRunner.Failure(
                description: "wrk failed (status \(process.terminationStatus)): \(text.suffix(2000))")
        }
        let fields = Self.fields(line)
        guard let requests = fields["requests"], let duration = fields["duration_us"], duration > 0,
            let p50 = fields["p50_us"], let p99 = fields["p99_us"], fields["errors"] == 0
        else {
            throw ChildRunner.Failure(description: "wrk: unexpected result or errors: \(line)")
        }
        return WrkResult(requests: requests, seconds: duration / 1e6, p50Microseconds: p50, p99Microseconds: p99)
    }

    /// `name=value` pairs of a line.
    static func fields(_ line: Substring) -> [String: Double] {
        var fields: [String: Double] = [:]
        for pair in line.split(separator: " ") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let value = Double(parts[1]) { fields[String(parts[0])] = value }
        }
        return fields
    }

    // MARK: - Stalls

    struct PrintedReport {
        var event: String
        var start: UInt64
        var emitted: UInt64
        var duration: UInt64 = 0
    }

    /// The `report …` lines of the server's standard output.
    static func reports(in output: String) -> [PrintedReport] {
        output.split(separator: "\n").compactMap { line in
            let words = line.split(separator: " ")
            guard words.count >= 2, words[0] == "report" else { return nil }
            let fields = fields(line)
            guard let start = fields["start_ns"], let emitted = fields["emitted_ns"] else { return nil }
            return PrintedReport(
                event: String(words[1]), start: UInt64(start), emitted: UInt64(emitted),
                duration: UInt64(fields["duration_ns"] ?? 0))
        }
    }

    struct Stalls: Sendable {
        var count: Int
        var detected: Int
        /// Milliseconds from the handler's start + the threshold to the detected report at the sink.
        var latencies: [Double]
        /// Of that, until the watchdog captured the stall (woke and took the first sample), and from
        /// there to the sink; for the stalls detected while they lasted.
        var captures: [Double] = []
        var deliveries: [Double] = []
        /// Milliseconds between the ended report's duration and the handler's own measurement.
        var durationErrors: [Double] = []
        /// The latency of the first stall, a warm-up one, where a part keeps it apart.
        var firstLatency: Double?
        var latencyP50: Double? { Statistics.percentile(latencies, 0.5) }
        var latencyP99: Double? { Statistics.percentile(latencies, 0.99) }
        var durationErrorP99: Double? { Statistics.percentile(durationErrors, 0.99) }
    }

    /// `warmup` + `count` requests to `/cpu?ms=stall`, `gap` apart, on a monitored server with the
    /// stall threshold; each stall's latency is the detected report's arrival at the sink − (the
    /// handler's own start + threshold). The first stalls warm the symbolicator and are not counted;
    /// the counted ones begin once their reports are out.
    private func stalls() throws -> Stalls {
        let threshold = UInt64(plan.stallThresholdMilliseconds) * 1_000_000
        let server = try start(
            ["--threshold-ms", "\(plan.stallThresholdMilliseconds)"], environment: ["STALLMON_RATE_LIMIT_BURST": "1000"]
        )
        defer { server.stop() }
        usleep(UInt32(plan.settle * 1e6))
        let connection = try HTTPConnection(port: server.port)
        var handlers: [(start: UInt64, end: UInt64)] = []
        for index in 0..<(plan.stallWarmup + plan.stallCount) {
            if index == plan.stallWarmup {
                let deadline = Date(timeIntervalSinceNow: 10)
                while Self.reports(in: server.text).filter({ $0.event == "ended" }).count < plan.stallWarmup,
                    Date() < deadline
                {
                    usleep(10_000)
                }
                usleep(UInt32(plan.stallGapMilliseconds * 1000))
            }
            let body = try connection.get("/cpu?ms=\(plan.stallMilliseconds)")
            guard let object = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
                let start = (object["start_ns"] as? NSNumber)?.uint64Value,
                let truth = (object["truth_us"] as? NSNumber)?.uint64Value
            else { throw ChildRunner.Failure(description: "unexpected answer to /cpu: \(body)") }
            handlers.append((start, start + truth * 1000))
            usleep(UInt32(plan.stallGapMilliseconds * 1000))
        }
        let reports = Self.reports(in: server.stop())
        // A stall's report is the detected one the watchdog captured while the handler ran (its own
        // idea of the cycle's start may be off either way); failing that, an ended one that covers
        // the handler (the watchdog looked only after the stall ended): it told when it was emitted.
        var latencies: [Double] = []
        var captures: [Double] = []
        var deliveries: [Double] = []
        var durationErrors: [Double] = []
        for (start, end) in handlers.dropFirst(plan.stallWarmup) {
            if let ended = reports.first(where: {
                $0.event == "ended" && $0.start <= end && $0.start + $0.duration >= start
            }) {
                durationErrors.append(abs(Double(ended.duration) - Double(end - start)) / 1e6)
            }
            let report =
                reports.first {
                    $0.event == "detected" && $0.start + $0.duration >= start && $0.start + $0.duration <= end
                }
                ?? reports.first { $0.event == "ended" && $0.start <= end && $0.start + $0.duration >= start }
            guard let report else {
                if ProcessInfo.processInfo.environment["STALLMON_BENCH_DEBUG"] != nil {
                    FileHandle.standardError.write(
                        Data("nio stalls: none reported of the handler's \(start)–\(end) among \(reports)\n".utf8))
                }
                continue
            }
            latencies.append((Double(report.emitted) - Double(start + threshold)) / 1e6)
            if report.event == "detected" {
                let captured = Double(report.start + report.duration)
                captures.append((captured - Double(start + threshold)) / 1e6)
                deliveries.append((Double(report.emitted) - captured) / 1e6)
            }
        }
        let found = latencies.count
        return Stalls(
            count: plan.stallCount, detected: found, latencies: latencies, captures: captures, deliveries: deliveries,
            durationErrors: durationErrors)
    }
}

extension NIOBench {
    /// `count` one-second wrk runs on each server, the order alternating from run to run and from
    /// round to round (so that neighbouring runs share the machine's mood), each with the CPU time
    /// the server spent meanwhile.
    static func alternatingRuns(
        _ count: Int, round index: Int, on servers: [Variant: NIOServerChild], run: (_ port: Int) throws -> WrkResult
    ) throws -> [Variant: [WrkResult]] {
        var runs: [Variant: [WrkResult]] = [:]
        for segment in 0..<count {
            let order: [Variant] = (index + segment) % 2 == 1 ? [.unmonitored, .stallmon] : [.stallmon, .unmonitored]
            for variant in order {
                guard let server = servers[variant] else { continue }
                let cpu = server.cpuNanoseconds()
                var result = try run(server.port)
                result.cpuSeconds = Double(server.cpuNanoseconds() - cpu) / 1e9
                runs[variant, default: []].append(result)
            }
        }
        return runs
    }
}

/// A round's wrk runs of the monitored and the unmonitored server, and the figures compared
/// between them: the SwiftNIO and the Hummingbird benchmarks' alike.
protocol WrkComparison {
    /// Each variant's one-second wrk runs, in order.
    var segments: [Variant: [NIOBench.WrkResult]] { get }
}

extension WrkComparison {
    /// Requests per second over all of a variant's runs.
    func rate(_ variant: Variant) -> Double? {
        guard let runs = segments[variant], !runs.isEmpty else { return nil }
        return runs.map(\.requests).reduce(0, +) / runs.map(\.seconds).reduce(0, +)
    }

    /// Requests per second of the server's CPU time.
    func cpuRate(_ variant: Variant) -> Double? {
        guard let runs = segments[variant], !runs.isEmpty else { return nil }
        let cpu = runs.map(\.cpuSeconds).reduce(0, +)
        return cpu > 0 ? runs.map(\.requests).reduce(0, +) / cpu : nil
    }

    /// The median of the runs' p99 latencies, in µs.
    func p99(_ variant: Variant) -> Double? { Statistics.median(segments[variant]?.map(\.p99Microseconds) ?? []) }

    private func ratio(_ value: (Variant) -> Double?) -> Double? {
        guard let monitored = value(.stallmon), let bare = value(.unmonitored), bare > 0 else { return nil }
        return monitored / bare
    }

    var requestsRatio: Double? { ratio(rate) }
    var requestsCPURatio: Double? { ratio(cpuRate) }
    var p99LatencyRatio: Double? { ratio(p99) }
}

/// What one round of the SwiftNIO benchmark measured.
struct NIORound: WrkComparison, Sendable {
    var segments: [Variant: [NIOBench.WrkResult]] = [:]
    var busyWakeupsPerSecond: Double?
    var idleWakeupsPerSecond: Double?
    /// Stalls the monitored server reported while under wrk (none expected).
    var stallsUnderLoad = 0
    var stalls: NIOBench.Stalls?
}

/// Durations and settings of the SwiftNIO benchmark, at a scale.
struct NIOPlan: Sendable {
    let scale: Double
    /// wrk's connections, on its one thread.
    var connections = 4

    /// One-second wrk runs of each variant a round.
    var segments: Int { max(1, Int((4 * scale).rounded())) }
    /// Steady load over which the watchdog's wakeups are counted.
    var busySeconds: Int { max(1, Int((4 * scale).rounded())) }
    /// After the servers listen, before their warm-up runs.
    var settle: Double { 0.5 }
    var idleSettle: Double { 1 }
    var idleSeconds: Double { max(2, 10 * scale) }
    var stallCount: Int { max(10, Int(100 * scale)) }
    var stallWarmup: Int { 2 }
    var stallThresholdMilliseconds: Int { 20 }
    var stallMilliseconds: Int { 35 }
    var stallGapMilliseconds: Int { 15 }

    static let settings =
        "1 event loop, wrk with 1 thread and 4 keep-alive connections, nothing pinned; both servers up at once, "
        + "1 s wrk runs alternating between them"
    static let stallSettings =
        "threshold 20 ms, sample interval 20 ms, 35 ms CPU stalls in a request handler 15 ms apart, "
        + "rate limit lifted, 2 warm-up stalls not counted"
}

extension Bench {
    /// The SwiftNIO benchmark, once its server and wrk are found (before anything runs).
    func makeNIOBench() throws -> NIOBench {
        NIOBench(
            server: try NIOServerChild.executablePath(), wrk: try NIOBench.wrkPath(),
            plan: NIOPlan(scale: options.scale), progress: progress)
    }

    /// Instructions per request, unless a quick run, --no-callgrind or no valgrind; `nil` with a
    /// note when the server cannot run under valgrind.
    func countNIOInstructions(_ nio: NIOBench) -> NIOInstructionCounts.PerRequest? {
        guard options.callgrind ?? true, let valgrind = InstructionCounts.valgrindPath() else { return nil }
        do {
            return try NIOInstructionCounts.measure(server: nio.server, valgrind: valgrind, progress: progress)
        } catch {
            progress("callgrind: no instruction counts per SwiftNIO request: \(error)")
            return nil
        }
    }

    /// --nio-only: the SwiftNIO rounds, and their figures alone.
    func runNIOOnly(_ nio: NIOBench, started: UInt64) throws -> Int32 {
        progress("stallmon-bench: SwiftNIO only, \(options.rounds) round\(options.rounds == 1 ? "" : "s")")
        var rounds: [RoundResults] = []
        for round in 1...options.rounds {
            var results = RoundResults()
            results.nio = try nio.round(round, of: options.rounds)
            rounds.append(results)
        }
        var instructions: InstructionCounts?
        if let counts = countNIOInstructions(nio) {
            instructions = InstructionCounts()
            instructions?.nioPerRequest = counts.process
            instructions?.nioLoopPerRequest = counts.loop
        }
        let figures = Figures.compute(rounds: rounds, memory: nil, instructions: instructions).filter {
            $0.key.hasPrefix("nio_") || $0.key.hasPrefix("callgrind_nio_")
        }
        let elapsed = Int(Double(Kernel.now() - started) / 1e9)
        var lines = Report.partTable(flag: "--nio-only", rounds: rounds.count, elapsed: elapsed, figures: figures)
        lines += NIOBench.reportLines(rounds: rounds, instructions: instructions)
        let table = lines.joined(separator: "\n") + "\n"
        Report.emit(table: table, figures: figures, json: options.json)
        return 0
    }
}

extension NIOBench {
    /// The SwiftNIO lines of the table.
    static func reportLines(rounds: [RoundResults], instructions: InstructionCounts?) -> [String] {
        let nio = rounds.compactMap(\.nio)
        guard !nio.isEmpty else { return [] }
        func median(_ values: [Double], _ format: (Double) -> String = Report.format) -> String {
            Statistics.median(values).map(format) ?? "n/a"
        }
        func cells(_ value: (NIORound, Variant) -> Double?, _ format: (Double) -> String = Report.format) -> String {
            [Variant.unmonitored, .stallmon].map { variant in
                "\(variant.rawValue) \(median(nio.compactMap { value($0, variant) }, format))"
            }.joined(separator: ", ")
        }
        let stalls = nio.compactMap(\.stalls)
        var lines = [
            "",
            "SwiftNIO: wrk against StallmonNIOServer's /hello (\(NIOPlan.settings)), unmonitored and monitored "
                + "(default configuration); medians of rounds: requests/s " + cells({ $0.rate($1) }, Report.grouped)
                + "; per server CPU second " + cells({ $0.cpuRate($1) }, Report.grouped) + "; latency p99 µs "
                + cells { $0.p99($1) } + "; stalls reported under load \(nio.map(\.stallsUnderLoad).reduce(0, +))",
            "SwiftNIO watchdog wakeups/s (voluntary context switches of stallmon-nio): under wrk "
                + "\(median(nio.compactMap(\.busyWakeupsPerSecond))), idle \(median(nio.compactMap(\.idleWakeupsPerSecond)))",
            "SwiftNIO stalls (\(stalls.first?.count ?? 0) a round; \(NIOPlan.stallSettings)): detected "
                + "\(stalls.map(\.detected).reduce(0, +)) of \(stalls.map(\.count).reduce(0, +)); latency = detected "
                + "report at the sink − (handler start + threshold) = watchdog wake + first sample p50 "
                + median(stalls.compactMap { Statistics.percentile($0.captures, 0.5) }) + " ms, p99 "
                + median(stalls.compactMap { Statistics.percentile($0.captures, 0.99) }) + " ms, then to the sink p50 "
                + median(stalls.compactMap { Statistics.percentile($0.deliveries, 0.5) }) + " ms, p99 "
                + median(stalls.compactMap { Statistics.percentile($0.deliveries, 0.99) }) + " ms",
        ]
        if let instructions, !instructions.nioPerRequest.isEmpty {
            let cells = NIOInstructionCounts.variants.map { variant in
                "\(variant.rawValue) \(instructions.nioPerRequest[variant].map(Report.grouped) ?? "n/a")"
            }
            let loopCells = NIOInstructionCounts.variants.map { variant in
                "\(variant.rawValue) \(instructions.nioLoopPerRequest[variant].map(Report.grouped) ?? "n/a")"
            }
            lines.append(
                "callgrind instructions per /hello request, io_uring denied "
                    + "(\(NIOInstructionCounts.requests.long) − \(NIOInstructionCounts.requests.short) requests on one "
                    + "connection): whole server process " + cells.joined(separator: ", ") + "; its event loop thread "
                    + loopCells.joined(separator: ", "))
        }
        return lines
    }
}
