import Foundation

/// The parent side: runs every child in turn, alternating the variants within each round, and
/// reports the figures.
struct Bench {
    let options: Options
    private let runner = ChildRunner()
    private let plan: Plan

    /// The workloads whose throughput is compared, in the order each round runs them.
    static let throughputWorkloads: [Workload] = [.busy, .work, .timer, .io]

    init(options: Options) {
        self.options = options
        plan = Plan(scale: options.scale, workBytes: HashingWork.calibrate(microseconds: 50))
    }

    func run() throws -> Int32 {
        if options.collectorOnly {
            Report.emit(table: "", figures: CollectorCost.figures(scale: options.scale), json: true)
            return 0
        }
        if options.tracingOnly {
            Report.emit(table: "", figures: TracingCost.figures(scale: options.scale), json: true)
            return 0
        }
        if options.sinksOnly {
            Report.emit(table: "", figures: SinkCost.figures(scale: options.scale), json: true)
            return 0
        }
        let started = Kernel.now()
        defer { runner.removeLog() }
        if options.externalOnly {
            guard let external = try makeExternalWatchBench() else { return 1 }
            return try runExternalWatchOnly(external, started: started)
        }
        if options.hummingbirdOnly {
            guard let hummingbird = try makeHummingbirdBench() else { return 1 }
            return try runHummingbirdOnly(hummingbird, started: started)
        }
        let nio = try options.nio ? makeNIOBench() : nil
        if options.nioOnly, let nio { return try runNIOOnly(nio, started: started) }
        let hummingbird = try makeHummingbirdBench()
        let external = try makeExternalWatchBench()
        progress(
            "stallmon-bench: \(options.rounds) round\(options.rounds == 1 ? "" : "s") at scale \(Report.format(options.scale)); "
                + "work pass hashes \(plan.workBytes) bytes (about 50 µs)"
        )
        var rounds: [RoundResults] = []
        for round in 1...options.rounds {
            var results = RoundResults()
            for workload in Self.throughputWorkloads {
                for variant in Variant.allCases {
                    let result = try child(variant, workload, plan.parameters(workload))
                    results[workload, variant] = result
                    progress(
                        "[\(round)/\(options.rounds)] \(workload.rawValue) \(variant.rawValue): "
                            + "\(Report.grouped(result["rate"] ?? 0))/s"
                            + (result["wakeups_per_s"].map { ", watchdog \(Report.format($0)) wakeups/s" } ?? "")
                    )
                }
            }
            for variant in [Variant.stallmon, .blog] {
                let result = try child(variant, .idle, plan.idle(variant))
                results[.idle, variant] = result
                progress(
                    "[\(round)/\(options.rounds)] idle \(variant.rawValue): \(Report.format(result["wakeups_per_s"] ?? .nan)) wakeups/s"
                )
            }
            for workload in [Workload.mainActorHops, .poolTasks, .poolWork] {
                for variant in AsyncWorkloads.variants {
                    let result = try child(variant, workload, plan.parameters(workload))
                    results[workload, variant] = result
                    progress(
                        "[\(round)/\(options.rounds)] \(workload.rawValue) \(variant.rawValue): "
                            + "\(Report.grouped(result["rate"] ?? 0))/s"
                    )
                }
            }
            let stalls = try child(.stallmon, .stalls, plan.latency)
            results[.stalls, .stallmon] = stalls
            progress(
                "[\(round)/\(options.rounds)] stalls: detection p50 \(Report.format(stalls["latency_p50_ms"] ?? .nan)) ms, "
                    + "p99 \(Report.format(stalls["latency_p99_ms"] ?? .nan)) ms, "
                    + "duration error p99 \(Report.format(stalls["duration_error_p99_ms"] ?? .nan)) ms"
            )
            let longStall = try child(.stallmon, .longStall, plan.longStall)
            results[.longStall, .stallmon] = longStall
            progress(
                "[\(round)/\(options.rounds)] long stall: watchdog CPU \(Report.format(longStall["cpu_pct"] ?? .nan))%")
            let pause = try child(.unmonitored, .samplePause, plan.samplePause)
            results[.samplePause, .unmonitored] = pause
            progress(
                "[\(round)/\(options.rounds)] sample pause: p50 \(Report.format(pause["p50_us"] ?? .nan)) µs, "
                    + "p99 \(Report.format(pause["p99_us"] ?? .nan)) µs"
            )
            if let nio { results.nio = try nio.round(round, of: options.rounds) }
            if let hummingbird { results.hummingbird = try hummingbird.round(round, of: options.rounds) }
            if let external { results.external = try external.round(round, of: options.rounds) }
            rounds.append(results)
        }

        progress("memory: \(plan.memory["count"] ?? "?") stalls of 12 ms at a 10 ms threshold")
        let memory = try child(.stallmon, .stalls, plan.memory)
        progress(
            "memory: VmRSS grew \(Report.format(memory["rss_growth_kib"] ?? .nan)) KiB, its anonymous part "
                + "\(Report.format(memory["rss_anon_growth_kib"] ?? .nan)) KiB")

        progress("first stall: one 300 ms stall after the monitor settled")
        let firstStall = try child(.stallmon, .firstStall, [:])
        progress(
            "first stall: VmRSS grew \(Report.format(firstStall["rss_first_stall_kib"] ?? .nan)) KiB, "
                + "\(Report.format(firstStall["rss_first_stall_settled_kib"] ?? .nan)) KiB 2 s later"
        )

        var instructions: InstructionCounts?
        if options.callgrind ?? true, let valgrind = InstructionCounts.valgrindPath() {
            instructions = try InstructionCounts.measure(
                runner: runner, valgrind: valgrind, parameters: loopParameters, progress: progress
            )
        } else if options.callgrind == true {
            progress("valgrind not found: no instruction counts (apt-get install -y valgrind)")
        }
        if let nio, let counts = countNIOInstructions(nio) {
            var all = instructions ?? InstructionCounts()
            all.nioPerRequest = counts.process
            all.nioLoopPerRequest = counts.loop
            instructions = all
        }
        if let hummingbird {
            let counts = countHummingbirdInstructions(hummingbird)
            if !counts.isEmpty {
                var all = instructions ?? InstructionCounts()
                all.hummingbirdPerRequest = counts
                instructions = all
            }
        }

        progress(
            "collector: CPU and memory per journal entry, typical and the schema's worst; tracing: cost per span; "
                + "sinks: cost per report")
        let figures =
            Figures.compute(rounds: rounds, memory: memory, firstStall: firstStall, instructions: instructions)
            + CollectorCost.figures(scale: options.scale) + TracingCost.figures(scale: options.scale)
            + SinkCost.figures(scale: options.scale)
        let elapsed = Double(Kernel.now() - started) / 1e9
        var table = Report.table(
            figures: figures, rounds: rounds, memory: memory, instructions: instructions, plan: plan, options: options,
            elapsed: elapsed
        )
        if let hummingbird {
            table += HummingbirdBench.reportLines(
                rounds: rounds, instructions: instructions, service: hummingbird.service
            ).map { $0 + "\n" }.joined()
        }
        if let external {
            table += ExternalWatchBench.reportLines(rounds: rounds, service: external.watchPath).map { $0 + "\n" }
                .joined()
        }
        Report.emit(table: table, figures: figures, json: options.json)
        return 0
    }

    /// Runs one child; every child runs its loop the same way.
    private func child(_ variant: Variant, _ workload: Workload, _ parameters: [String: String]) throws -> [String:
        Double]
    {
        try runner.run(ChildRequest(variant, workload, parameters.merging(loopParameters) { $1 }))
    }

    private var loopParameters: [String: String] { options.cfRunLoop ? ["loop": "cf"] : [:] }

    func progress(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }
}

/// Pass counts, durations and stall settings of every child, at a scale.
struct Plan: Sendable {
    let scale: Double
    let workBytes: Int

    /// Settings of the latency and duration children: a 20 ms threshold (default sample interval,
    /// 20 ms) and 35 ms stalls 15 ms apart, every report let through the rate limit; the first two
    /// stalls warm the symbolicator and are not counted.
    static let latencySettings =
        "threshold 20 ms, sample interval 20 ms, 35 ms CPU stalls 15 ms apart, rate limit lifted, 2 warm-up stalls not counted"
    /// Settings of the memory child.
    static let memorySettings =
        "threshold 10 ms, sample interval 10 ms, 12 ms CPU stalls 1 ms apart, default rate limit, sink drops reports"

    private func count(_ value: Double, minimum: Int) -> String { "\(max(minimum, Int(value * scale)))" }
    private func seconds(_ value: Double, minimum: Double) -> String { "\(max(minimum, value * scale))" }

    /// Every throughput child waits `settle` seconds before its first pass: stallmon's reporter
    /// loads symbols in the background for the first few hundred milliseconds, which on 2 cores
    /// otherwise lands in some runs' measurement and not in others'.
    func parameters(_ workload: Workload) -> [String: String] {
        let settle = ["settle": "0.7"]
        return settle.merging(
            {
                switch workload {
                case .busy: ["passes": count(200_000, minimum: 2_000), "warmup": count(10_000, minimum: 200)]
                case .work:
                    [
                        "passes": count(25_000, minimum: 300), "warmup": count(1_000, minimum: 50),
                        "work-bytes": "\(workBytes)",
                    ]
                case .timer: ["passes": count(50_000, minimum: 1_000), "warmup": count(2_000, minimum: 100)]
                case .io: ["passes": count(60_000, minimum: 1_000), "warmup": count(2_000, minimum: 100)]
                case .mainActorHops:
                    ["operations": count(50_000, minimum: 1_000), "warmup": count(2_000, minimum: 100)]
                case .poolTasks:
                    ["operations": count(500_000, minimum: 10_000), "warmup": count(20_000, minimum: 1_000)]
                case .poolWork:
                    ["operations": count(20_000, minimum: 500), "warmup": count(500, minimum: 100)]
                default: [:]
                }
            }()
        ) { $1 }
    }

    /// The idle loop: 10 s for stallmon (whose target is no wakeups at all), 1 s for the blog
    /// design (which wakes every 10 ms by design), each after the watchdog has settled.
    func idle(_ variant: Variant) -> [String: String] {
        variant == .stallmon
            ? ["seconds": seconds(10, minimum: 0.5), "settle": "1"]
            : ["seconds": seconds(1, minimum: 0.5), "settle": "0.5"]
    }

    var latency: [String: String] {
        [
            "count": count(100, minimum: 10), "warmup": "2", "threshold-ms": "20", "sample-interval-ms": "20",
            "stall-ms": "35", "gap-ms": "15", "record": "1",
        ]
    }

    var memory: [String: String] {
        [
            "count": count(10_000, minimum: 400), "baseline": "100", "threshold-ms": "10", "sample-interval-ms": "10",
            "stall-ms": "12", "gap-ms": "1", "record": "0", "timeout": "900",
        ]
    }

    var longStall: [String: String] { ["seconds": seconds(5, minimum: 1)] }

    var samplePause: [String: String] { ["samples": count(2000, minimum: 200), "depth": "64", "max-frames": "64"] }
}
