import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The Hummingbird part: `Examples/Sources/HummingbirdFixture` (the example service with the
/// benchmark's switches) on its defaults (`MultiThreadedEventLoopGroup.singleton`, async handlers on
/// the cooperative pool), monitored by `startService()` against the same binary with
/// `EXAMPLE_STALLMON=off`, both up at once, wrk on `/hello` alternating between them; stallmon's
/// watchdog wakeups under that load and idle; and the detection latency and duration error of stalls
/// in an async handler (the cooperative pool). The benchmark runs the service as a child process and
/// never links Hummingbird.
struct HummingbirdBench {
    let service: String
    let wrk: String
    let plan: HummingbirdPlan
    let progress: (String) -> Void

    static let executableName = "HummingbirdFixture"
    /// The threads of stallmon's watchdogs: the event loops', the pool's and the main actor's.
    static let watchdogThreads: Set<String> = ["stallmon-nio", "stallmon-pool", "stallmon-watch"]

    /// `explicit`, or the Examples package's release build, else its debug build, under the current
    /// directory or the repository this executable was built in; `nil` when there is none.
    static func executablePath(explicit: String?) throws -> String? {
        if let explicit {
            guard FileManager.default.isExecutableFile(atPath: explicit) else {
                throw ChildRunner.Failure(description: "--hummingbird \(explicit): no such executable")
            }
            return explicit
        }
        // .build/<configuration>/stallmon-bench, or .build/<triple>/<configuration>/stallmon-bench.
        var roots = [FileManager.default.currentDirectoryPath]
        var directory = URL(fileURLWithPath: ChildRunner.executablePath).deletingLastPathComponent()
        for _ in 0..<4 {
            directory = directory.deletingLastPathComponent()
            if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Examples/Package.swift").path) {
                roots.append(directory.path)
                break
            }
        }
        for root in roots {
            for configuration in ["release", "debug"] {
                let path = "\(root)/Examples/.build/\(configuration)/\(executableName)"
                if FileManager.default.isExecutableFile(atPath: path) { return path }
            }
        }
        return nil
    }

    /// Whether the service is a debug build (its path says so): the figures the README gives come
    /// from a release build.
    var isDebugBuild: Bool { service.contains("/debug/") }

    /// One round, as NIOBench's: both services start and warm up, then take wrk in turn; then both
    /// idle; then the stalls run on a service of their own.
    func round(_ index: Int, of total: Int) throws -> HummingbirdRound {
        var round = HummingbirdRound()
        var services: [Variant: NIOServerChild] = [:]
        defer { for service in services.values { service.stop() } }
        for variant in [Variant.unmonitored, .stallmon] {
            services[variant] = try start(variant == .stallmon ? [:] : ["EXAMPLE_STALLMON": "off"])
        }
        guard let monitored = services[.stallmon], let unmonitored = services[.unmonitored] else { return round }
        usleep(UInt32(plan.settle * 1e6))
        _ = try runWrk(port: unmonitored.port, seconds: plan.busySeconds + 1)
        _ = try runWrk(port: monitored.port, seconds: plan.busySeconds + 1) {
            usleep(500_000)
            let before = Self.wakeups(of: monitored)
            let started = Kernel.now()
            usleep(UInt32(plan.busySeconds) * 1_000_000)
            round.busyWakeupsPerSecond = Self.rate(before, Self.wakeups(of: monitored), since: started).watchdog
        }
        round.segments = try NIOBench.alternatingRuns(plan.segments, round: index, on: services) {
            try runWrk(port: $0, seconds: 1)
        }
        usleep(UInt32(plan.idleSettle * 1e6))
        let idleBefore = (Self.wakeups(of: monitored), Self.wakeups(of: unmonitored))
        let idleStarted = Kernel.now()
        usleep(UInt32(plan.idleSeconds * 1e6))
        let monitoredIdle = Self.rate(idleBefore.0, Self.wakeups(of: monitored), since: idleStarted)
        let unmonitoredIdle = Self.rate(idleBefore.1, Self.wakeups(of: unmonitored), since: idleStarted)
        round.idleWakeupsPerSecond = monitoredIdle.watchdog
        round.idleServiceWakeupsPerSecond = monitoredIdle.service
        round.idleUnmonitoredWakeupsPerSecond = unmonitoredIdle.service
        round.stallsUnderLoad = NIOBench.reports(in: monitored.stop()).filter { $0.event == "detected" }.count
        for variant in [Variant.unmonitored, .stallmon] {
            progress(
                "[\(index)/\(total)] hummingbird hello \(variant.rawValue): "
                    + "\(Report.grouped(round.rate(variant) ?? .nan)) requests/s, "
                    + "\(Report.grouped(round.cpuRate(variant) ?? .nan)) per CPU second, "
                    + "p99 \(Report.format(round.p99(variant) ?? .nan)) µs"
                    + (variant == .stallmon
                        ? "; stallmon's threads \(Report.format(round.busyWakeupsPerSecond ?? .nan)) wakeups/s, idle "
                            + "\(Report.format(round.idleWakeupsPerSecond ?? .nan)) (the service's own threads "
                            + "\(Report.format(round.idleServiceWakeupsPerSecond ?? .nan)); unmonitored "
                            + "\(Report.format(round.idleUnmonitoredWakeupsPerSecond ?? .nan)))"
                            + (round.stallsUnderLoad > 0 ? ", \(round.stallsUnderLoad) stalls reported" : "")
                        : "")
            )
        }
        round.stalls = try stalls()
        if let stalls = round.stalls {
            progress(
                "[\(index)/\(total)] hummingbird pool stalls: \(stalls.detected) of \(stalls.count) detected, past the "
                    + "threshold p50 \(Report.format(stalls.latencyP50 ?? .nan)) ms, p99 "
                    + "\(Report.format(stalls.latencyP99 ?? .nan)) ms; duration error p99 "
                    + "\(Report.format(stalls.durationErrorP99 ?? .nan)) ms"
            )
        }
        return round
    }

    /// The service on a free port, its reports on its standard output.
    private func start(_ environment: [String: String]) throws -> NIOServerChild {
        try NIOServerChild(
            [service], environment: ["PORT": "0", "EXAMPLE_PRINT_REPORTS": "1"].merging(environment) { $1 })
    }

    private func runWrk(port: Int, seconds: Int, meanwhile: () -> Void = {}) throws -> NIOBench.WrkResult {
        try NIOBench.runWrk(
            wrk, url: "http://127.0.0.1:\(port)/hello", connections: plan.connections, seconds: seconds,
            meanwhile: meanwhile)
    }

    // MARK: - Wakeups

    /// Voluntary context switches (one per wakeup of a thread that sleeps between its turns) of
    /// each thread of the service now, by kernel id, and whether it is one of stallmon's watchdogs.
    static func wakeups(of service: NIOServerChild) -> [Int32: (switches: Int, watchdog: Bool)] {
        var result: [Int32: (switches: Int, watchdog: Bool)] = [:]
        for (tid, name) in service.threads() {
            if let switches = service.voluntarySwitches(ofThread: tid) {
                result[tid] = (switches, watchdogThreads.contains(name))
            }
        }
        return result
    }

    /// Wakeups per second since `started`, of stallmon's watchdog threads and of all the others; a
    /// thread that started meanwhile counts whole, one that ended counts no more.
    static func rate(
        _ before: [Int32: (switches: Int, watchdog: Bool)], _ after: [Int32: (switches: Int, watchdog: Bool)],
        since started: UInt64
    ) -> (watchdog: Double, service: Double) {
        let seconds = Double(Kernel.now() - started) / 1e9
        var watchdog = 0
        var service = 0
        for (tid, now) in after {
            let count = now.switches - (before[tid]?.switches ?? 0)
            if now.watchdog { watchdog += count } else { service += count }
        }
        return (Double(watchdog) / seconds, Double(service) / seconds)
    }

    // MARK: - Stalls

    /// `warmup` + `count` requests to `/cpu?ms=stall`, `gap` apart, on a monitored service with
    /// lowered thresholds. A stall's detection latency is its detected report's arrival at the sink −
    /// (the handler's own start + the pool threshold); its duration error, |the ended report's
    /// duration − the handler's own measurement|. The first stalls warm the symbolicator and are not
    /// counted.
    private func stalls() throws -> NIOBench.Stalls {
        let threshold = UInt64(plan.poolThresholdMilliseconds) * 1_000_000
        let service = try start([
            "STALLMON_THRESHOLD_MS": "\(plan.thresholdMilliseconds)",
            "STALLMON_COOPERATIVE_POOL_THRESHOLD_MS": "\(plan.poolThresholdMilliseconds)",
            "STALLMON_RATE_LIMIT_BURST": "1000",
        ])
        defer { service.stop() }
        usleep(UInt32(plan.settle * 1e6))
        let connection = try HTTPConnection(port: service.port)
        var handlers: [(start: UInt64, end: UInt64, tid: Int)] = []
        for index in 0..<(plan.stallWarmup + plan.stallCount) {
            if index == plan.stallWarmup {
                let deadline = Date(timeIntervalSinceNow: 10)
                while NIOBench.reports(in: service.text).filter({ $0.event == "ended" }).count < plan.stallWarmup,
                    Date() < deadline
                {
                    usleep(10_000)
                }
                usleep(UInt32(plan.stallGapMilliseconds * 1000))
            }
            let body = try connection.get("/cpu?ms=\(plan.stallMilliseconds)")
            guard let object = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
                let start = (object["start_ns"] as? NSNumber)?.uint64Value,
                let truth = (object["truth_us"] as? NSNumber)?.doubleValue,
                let tid = (object["tid"] as? NSNumber)?.intValue
            else { throw ChildRunner.Failure(description: "unexpected answer to /cpu: \(body)") }
            handlers.append((start, start + UInt64(truth * 1000), tid))
            usleep(UInt32(plan.stallGapMilliseconds * 1000))
        }
        let output = service.stop()
        let reports = Self.reports(in: output)
        var latencies: [Double] = []
        var captures: [Double] = []
        var deliveries: [Double] = []
        var durationErrors: [Double] = []
        for (start, end, tid) in handlers.dropFirst(plan.stallWarmup) {
            // The handler runs inside a pool job that began a little before it: the stall's reports
            // are those of the handler's thread whose window began within 50 ms of the handler.
            let covering = reports.filter {
                $0.tid == tid && abs(Double($0.report.start) - Double(start)) <= 50e6
            }
            if let detected = covering.first(where: { $0.report.event == "detected" })?.report {
                latencies.append((Double(detected.emitted) - Double(start + threshold)) / 1e6)
                let captured = Double(detected.start + detected.duration)
                captures.append((captured - Double(start + threshold)) / 1e6)
                deliveries.append((Double(detected.emitted) - captured) / 1e6)
            } else if ProcessInfo.processInfo.environment["STALLMON_BENCH_DEBUG"] != nil {
                FileHandle.standardError.write(
                    Data("hummingbird stalls: none detected of the handler's \(start)–\(end) on \(tid)\n".utf8))
            }
            if let ended = covering.first(where: { $0.report.event == "ended" })?.report {
                durationErrors.append(abs(Double(ended.duration) - Double(end - start)) / 1e6)
            }
        }
        return NIOBench.Stalls(
            count: plan.stallCount, detected: latencies.count, latencies: latencies, captures: captures,
            deliveries: deliveries, durationErrors: durationErrors)
    }

    /// The `report …` lines, with the kernel id of the thread that stalled.
    static func reports(in output: String) -> [(report: NIOBench.PrintedReport, tid: Int)] {
        output.split(separator: "\n").compactMap { line in
            guard let report = NIOBench.reports(in: String(line)).first, let tid = NIOBench.fields(line)["tid"] else {
                return nil
            }
            return (report, Int(tid))
        }
    }
}

/// What one round of the Hummingbird benchmark measured.
struct HummingbirdRound: WrkComparison, Sendable {
    var segments: [Variant: [NIOBench.WrkResult]] = [:]
    /// Of stallmon's watchdog threads.
    var busyWakeupsPerSecond: Double?
    var idleWakeupsPerSecond: Double?
    /// Of the monitored service's other threads (Hummingbird's, SwiftNIO's, the pool's), and of all
    /// the unmonitored service's threads, idle.
    var idleServiceWakeupsPerSecond: Double?
    var idleUnmonitoredWakeupsPerSecond: Double?
    /// Stalls the monitored service reported while under wrk (none expected).
    var stallsUnderLoad = 0
    var stalls: NIOBench.Stalls?
}

/// Durations and settings of the Hummingbird benchmark, at a scale.
struct HummingbirdPlan: Sendable {
    let scale: Double
    var connections = 4

    var segments: Int { max(1, Int((4 * scale).rounded())) }
    var busySeconds: Int { max(1, Int((4 * scale).rounded())) }
    var settle: Double { 1 }
    var idleSettle: Double { 1 }
    var idleSeconds: Double { max(2, 10 * scale) }
    var stallCount: Int { max(5, Int(30 * scale)) }
    var stallWarmup: Int { 2 }
    var thresholdMilliseconds: Int { 100 }
    var poolThresholdMilliseconds: Int { 100 }
    var stallMilliseconds: Int { 150 }
    var stallGapMilliseconds: Int { 100 }

    static let settings =
        "Hummingbird's defaults (the NIO singleton, one loop per core; handlers on the cooperative pool), wrk with "
        + "1 thread and 4 keep-alive connections, nothing pinned; both services up at once, 1 s wrk runs alternating"
    static let stallSettings =
        "event-loop and pool thresholds 100 ms, sample interval 20 ms, 150 ms CPU stalls in an async handler "
        + "100 ms apart, rate limit lifted, 2 warm-up stalls not counted"
}

extension Bench {
    /// The Hummingbird benchmark, unless --no-hummingbird, or the service is not built (then a note
    /// says how to build it).
    func makeHummingbirdBench() throws -> HummingbirdBench? {
        guard options.hummingbird else { return nil }
        guard let service = try HummingbirdBench.executablePath(explicit: options.hummingbirdPath) else {
            progress(
                "stallmon-bench: no Hummingbird figures: Examples/.build/{release,debug}/HummingbirdFixture is missing "
                    + "(swift build -c release --package-path Examples --product HummingbirdFixture, or --hummingbird PATH)"
            )
            return nil
        }
        let bench = HummingbirdBench(
            service: service, wrk: try NIOBench.wrkPath(), plan: HummingbirdPlan(scale: options.scale),
            progress: progress)
        progress(
            "stallmon-bench: Hummingbird: \(service)"
                + (bench.isDebugBuild ? " (a debug build: its figures are not the release build's)" : ""))
        return bench
    }

    /// Instructions per Hummingbird request, unless a quick run, --no-callgrind or no valgrind.
    func countHummingbirdInstructions(_ hummingbird: HummingbirdBench) -> [Variant: [Double]] {
        guard options.callgrind ?? true else { return [:] }
        guard let valgrind = InstructionCounts.valgrindPath() else {
            progress("valgrind not found: no instruction counts per Hummingbird request (apt-get install -y valgrind)")
            return [:]
        }
        do {
            return try HummingbirdInstructionCounts.measure(
                service: hummingbird.service, valgrind: valgrind, repeats: max(1, Int((3 * options.scale).rounded())),
                progress: progress)
        } catch {
            progress("callgrind: no instruction counts per Hummingbird request: \(error)")
            return [:]
        }
    }

    /// --hummingbird-only: the Hummingbird rounds, and their figures alone.
    func runHummingbirdOnly(_ hummingbird: HummingbirdBench, started: UInt64) throws -> Int32 {
        progress("stallmon-bench: Hummingbird only, \(options.rounds) round\(options.rounds == 1 ? "" : "s")")
        var rounds: [RoundResults] = []
        for round in 1...options.rounds {
            var results = RoundResults()
            results.hummingbird = try hummingbird.round(round, of: options.rounds)
            rounds.append(results)
        }
        var instructions = InstructionCounts()
        instructions.hummingbirdPerRequest = countHummingbirdInstructions(hummingbird)
        let figures = Figures.compute(rounds: rounds, memory: nil, instructions: instructions).filter {
            $0.key.hasPrefix("hummingbird_") || $0.key.hasPrefix("callgrind_hummingbird_")
        }
        let elapsed = Int(Double(Kernel.now() - started) / 1e9)
        var lines = Report.partTable(
            flag: "--hummingbird-only", rounds: rounds.count, elapsed: elapsed, figures: figures)
        lines += HummingbirdBench.reportLines(rounds: rounds, instructions: instructions, service: hummingbird.service)
        Report.emit(table: lines.joined(separator: "\n") + "\n", figures: figures, json: options.json)
        return 0
    }
}

extension HummingbirdBench {
    /// The Hummingbird lines of the table.
    static func reportLines(rounds: [RoundResults], instructions: InstructionCounts?, service: String) -> [String] {
        let runs = rounds.compactMap(\.hummingbird)
        guard !runs.isEmpty else { return [] }
        func median(_ values: [Double], _ format: (Double) -> String = Report.format) -> String {
            Statistics.median(values).map(format) ?? "n/a"
        }
        func cells(_ value: (HummingbirdRound, Variant) -> Double?, _ format: (Double) -> String = Report.format)
            -> String
        {
            [Variant.unmonitored, .stallmon].map { variant in
                "\(variant.rawValue) \(median(runs.compactMap { value($0, variant) }, format))"
            }.joined(separator: ", ")
        }
        let stalls = runs.compactMap(\.stalls)
        var lines = [
            "",
            "Hummingbird: wrk against \(service) /hello (\(HummingbirdPlan.settings)), EXAMPLE_STALLMON=off and "
                + "startService() (default configuration); medians of rounds: requests/s "
                + cells({ $0.rate($1) }, Report.grouped) + "; per service CPU second "
                + cells({ $0.cpuRate($1) }, Report.grouped) + "; latency p99 µs " + cells { $0.p99($1) }
                + "; stalls reported under load \(runs.map(\.stallsUnderLoad).reduce(0, +))",
            "Hummingbird wakeups/s (voluntary context switches): stallmon's threads (stallmon-nio, -pool, -watch) under "
                + "wrk \(median(runs.compactMap(\.busyWakeupsPerSecond))), idle "
                + "\(median(runs.compactMap(\.idleWakeupsPerSecond))); idle, the monitored service's other threads "
                + "\(median(runs.compactMap(\.idleServiceWakeupsPerSecond))), the unmonitored service's "
                + "\(median(runs.compactMap(\.idleUnmonitoredWakeupsPerSecond))) (Hummingbird's 1 s date timer)",
            "Hummingbird pool stalls (\(stalls.first?.count ?? 0) a round; \(HummingbirdPlan.stallSettings)): detected "
                + "\(stalls.map(\.detected).reduce(0, +)) of \(stalls.map(\.count).reduce(0, +)); latency = detected "
                + "report at the sink − (handler start + threshold) = watchdog wake + first sample p50 "
                + median(stalls.compactMap { Statistics.percentile($0.captures, 0.5) }) + " ms, p99 "
                + median(stalls.compactMap { Statistics.percentile($0.captures, 0.99) }) + " ms, then to the sink p50 "
                + median(stalls.compactMap { Statistics.percentile($0.deliveries, 0.5) }) + " ms, p99 "
                + median(stalls.compactMap { Statistics.percentile($0.deliveries, 0.99) }) + " ms",
        ]
        if let counts = instructions?.hummingbirdPerRequest, !counts.isEmpty {
            let cells = HummingbirdInstructionCounts.variants.map { variant in
                "\(variant.rawValue) " + (counts[variant] ?? []).map(Report.grouped).joined(separator: " ")
            }
            lines.append(
                "callgrind instructions per Hummingbird /hello request, whole process, io_uring denied "
                    + "(\(HummingbirdInstructionCounts.requests.long) − \(HummingbirdInstructionCounts.requests.short) "
                    + "requests on one connection), each repeat: " + cells.joined(separator: "; "))
        }
        return lines
    }
}
