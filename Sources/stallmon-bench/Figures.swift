/// A target a figure should meet.
enum Target: Sendable {
    case atLeast(Double)
    case atMost(Double)

    func isMet(by value: Double) -> Bool {
        switch self {
        case .atLeast(let bound): value >= bound
        case .atMost(let bound): value <= bound
        }
    }

    var description: String {
        switch self {
        case .atLeast(let bound): "≥ \(Report.format(bound))"
        case .atMost(let bound): "≤ \(Report.format(bound))"
        }
    }
}

/// One reported figure: a value per round (or one value), summarized by median and min–max.
struct Figure: Sendable {
    /// The JSON key.
    let key: String
    let target: Target?
    var values: [Double] = []

    init(_ key: String, _ target: Target? = nil) {
        self.key = key
        self.target = target
    }

    var median: Double? { Statistics.median(values) }
    var minimum: Double? { values.min() }
    var maximum: Double? { values.max() }
    var isMet: Bool? { target.flatMap { target in median.map { target.isMet(by: $0) } } }
}

/// What one round measured: each child's result, by workload and variant.
struct RoundResults: Sendable {
    var results: [Workload: [Variant: [String: Double]]] = [:]
    /// The SwiftNIO benchmark's round (`nil` with --no-nio).
    var nio: NIORound?
    /// The Hummingbird benchmark's round (`nil` with --no-hummingbird or without the service built).
    var hummingbird: HummingbirdRound?
    /// The part watched from outside (`nil` with --no-external, or when it cannot run here).
    var external: ExternalWatchRound?

    subscript(workload: Workload, variant: Variant) -> [String: Double]? {
        get { results[workload]?[variant] }
        set { results[workload, default: [:]][variant] = newValue }
    }

    func rate(_ workload: Workload, _ variant: Variant) -> Double? { self[workload, variant]?["rate"] }

    /// The ratio of passes per second of main-thread CPU time.
    func cpuRatio(_ workload: Workload, _ numerator: Variant, over denominator: Variant) -> Double? {
        guard let top = self[workload, numerator]?["cpu_rate"], let bottom = self[workload, denominator]?["cpu_rate"],
            bottom > 0
        else { return nil }
        return top / bottom
    }

    /// Nanoseconds of wall time per operation.
    func nanoseconds(_ workload: Workload, _ variant: Variant) -> Double? {
        rate(workload, variant).flatMap { $0 > 0 ? 1e9 / $0 : nil }
    }

    /// What `variant` adds to an operation over `baseline`, in nanoseconds of the whole process's
    /// CPU time (steadier than wall time on a shared machine, and it counts every thread's share).
    func cost(_ workload: Workload, _ variant: Variant, over baseline: Variant) -> Double? {
        guard let with = self[workload, variant]?["cpu_rate"], let without = self[workload, baseline]?["cpu_rate"],
            with > 0, without > 0
        else { return nil }
        return 1e9 / with - 1e9 / without
    }

    func ratio(_ workload: Workload, _ numerator: Variant, over denominator: Variant) -> Double? {
        guard let top = rate(workload, numerator), let bottom = rate(workload, denominator), bottom > 0 else {
            return nil
        }
        return top / bottom
    }
}

/// The figures of the JSON object, in its order, computed from the rounds.
enum Figures {
    static func compute(
        rounds: [RoundResults], memory: [String: Double]?, firstStall: [String: Double]? = nil,
        instructions: InstructionCounts? = nil
    ) -> [Figure] {
        var figures: [Figure] = []
        func add(_ key: String, _ target: Target? = nil, _ value: (RoundResults) -> Double?) {
            var figure = Figure(key, target)
            figure.values = rounds.compactMap(value)
            figures.append(figure)
        }
        add("floor_busy_throughput_ratio") { $0.ratio(.busy, .noopObserver, over: .unmonitored) }
        add("busy_over_floor_ratio", .atLeast(0.97)) { $0.ratio(.busy, .stallmon, over: .noopObserver) }
        add("busy_throughput_ratio") { $0.ratio(.busy, .stallmon, over: .unmonitored) }
        add("blog_busy_throughput_ratio") { $0.ratio(.busy, .blog, over: .unmonitored) }
        add("work_throughput_ratio", .atLeast(0.98)) { $0.ratio(.work, .stallmon, over: .unmonitored) }
        add("timer_throughput_ratio", .atLeast(0.95)) { $0.ratio(.timer, .stallmon, over: .unmonitored) }
        add("io_throughput_ratio", .atLeast(0.95)) { $0.ratio(.io, .stallmon, over: .unmonitored) }
        add("main_actor_hop_ratio", .atLeast(0.97)) { $0.ratio(.mainActorHops, .stallmon, over: .unmonitored) }
        add("main_actor_over_floor_ratio") { $0.ratio(.mainActorHops, .stallmon, over: .noopObserver) }
        add("pool_tasks_ratio") { $0.ratio(.poolTasks, .stallmon, over: .unmonitored) }
        add("pool_work_ratio", .atLeast(0.98)) { $0.ratio(.poolWork, .stallmon, over: .unmonitored) }
        // The cooperative pool watched (cooperative_pool on), against the same drain without it
        // and against the runtime's own.
        add("pool_monitored_tasks_ratio") { $0.ratio(.poolTasks, .stallmonPool, over: .unmonitored) }
        add("pool_monitored_work_ratio", .atLeast(0.98)) { $0.ratio(.poolWork, .stallmonPool, over: .unmonitored) }
        add("pool_empty_job_ns") { $0.nanoseconds(.poolTasks, .stallmonPool) }
        add("pool_empty_job_unmonitored_ns") { $0.nanoseconds(.poolTasks, .unmonitored) }
        add("pool_job_cost_ns") { round in
            round[.poolTasks, .stallmonPool].flatMap { result in
                result["job_ns_timed"].flatMap { timed in result["job_ns_plain"].map { timed - $0 } }
            }
        }
        add("pool_tasks_cost_ns") { $0.cost(.poolTasks, .stallmonPool, over: .stallmon) }
        add("main_actor_empty_job_ns") { $0.nanoseconds(.mainActorHops, .stallmon) }
        add("main_actor_empty_job_unmonitored_ns") { $0.nanoseconds(.mainActorHops, .unmonitored) }
        add("main_actor_job_cost_ns") { $0.cost(.mainActorHops, .stallmon, over: .unmonitored) }
        add("pool_busy_watchdog_wakeups_per_s") { $0[.poolTasks, .stallmonPool]?["pool_wakeups_per_s"] }
        add("idle_watchdog_wakeups_per_s", .atMost(0)) { $0[.idle, .stallmon]?["wakeups_per_s"] }
        add("busy_watchdog_wakeups_per_s", .atMost(10)) { $0[.busy, .stallmon]?["wakeups_per_s"] }
        add("detection_latency_p50_ms") { $0[.stalls, .stallmon]?["latency_p50_ms"] }
        add("detection_latency_p99_ms", .atMost(2)) { $0[.stalls, .stallmon]?["latency_p99_ms"] }
        add("duration_error_p99_ms", .atMost(1)) { $0[.stalls, .stallmon]?["duration_error_p99_ms"] }
        add("sample_pause_p50_us") { $0[.samplePause, .unmonitored]?["p50_us"] }
        add("sample_pause_p99_us", .atMost(20)) { $0[.samplePause, .unmonitored]?["p99_us"] }
        add("sample_pause_max_us") { $0[.samplePause, .unmonitored]?["max_us"] }
        // Sleeps a sampled thread's handler ended with EINTR, per 100,000 of its system calls.
        add("sampled_syscall_eintr_per_100k") { figures in
            figures[.samplePause, .unmonitored].flatMap { result in
                result["pressure_syscalls"].flatMap { calls in
                    result["pressure_eintr"].map { calls > 0 ? $0 / calls * 100_000 : .nan }
                }
            }
        }
        add("stall_sampling_cpu_pct", .atMost(1)) { $0[.longStall, .stallmon]?["cpu_pct"] }
        var memoryFigure = Figure("rss_growth_kib_10k_stalls", .atMost(512))
        if let growth = memory?["rss_growth_kib"] { memoryFigure.values = [growth] }
        figures.append(memoryFigure)
        // Its anonymous part (heap, arenas, stacks): without the library code pages the kernel
        // reclaims and the process faults back in, which move VmRSS by hundreds of KiB.
        var anonymousFigure = Figure("rss_anon_growth_kib_10k_stalls", .atMost(512))
        if let growth = memory?["rss_anon_growth_kib"] { anonymousFigure.values = [growth] }
        figures.append(anonymousFigure)
        // By the main thread's CPU time instead of wall time: steadier on a shared machine.
        add("floor_busy_cpu_ratio") { $0.cpuRatio(.busy, .noopObserver, over: .unmonitored) }
        add("busy_over_floor_cpu_ratio") { $0.cpuRatio(.busy, .stallmon, over: .noopObserver) }
        add("busy_cpu_ratio") { $0.cpuRatio(.busy, .stallmon, over: .unmonitored) }
        add("work_cpu_ratio") { $0.cpuRatio(.work, .stallmon, over: .unmonitored) }
        add("timer_cpu_ratio") { $0.cpuRatio(.timer, .stallmon, over: .unmonitored) }
        add("io_cpu_ratio") { $0.cpuRatio(.io, .stallmon, over: .unmonitored) }
        for (key, target) in [("rss_first_stall_kib", Target.atMost(8192)), ("rss_first_stall_settled_kib", nil)] {
            var figure = Figure(key, target)
            if let value = firstStall?[key] { figure.values = [value] }
            figures.append(figure)
        }
        // The SwiftNIO server under wrk (not with --no-nio).
        if rounds.contains(where: { $0.nio != nil }) {
            add("nio_requests_ratio", .atLeast(0.99)) { $0.nio?.requestsRatio }
            add("nio_requests_cpu_ratio") { $0.nio?.requestsCPURatio }
            add("nio_p99_latency_ratio", .atMost(1.02)) { $0.nio?.p99LatencyRatio }
            add("nio_idle_wakeups_per_s", .atMost(0)) { $0.nio?.idleWakeupsPerSecond }
            add("nio_busy_wakeups_per_s", .atMost(8)) { $0.nio?.busyWakeupsPerSecond }
            add("nio_detection_latency_p50_ms") { $0.nio?.stalls?.latencyP50 }
            add("nio_detection_latency_p99_ms", .atMost(2)) { $0.nio?.stalls?.latencyP99 }
            add("nio_duration_error_p99_ms", .atMost(1)) { $0.nio?.stalls?.durationErrorP99 }
            add("nio_stalls_undetected", .atMost(0)) { $0.nio?.stalls.map { Double($0.count - $0.detected) } }
        }
        // The Hummingbird example service under wrk (when it is built).
        if rounds.contains(where: { $0.hummingbird != nil }) {
            add("hummingbird_requests_ratio", .atLeast(0.99)) { $0.hummingbird?.requestsRatio }
            add("hummingbird_requests_cpu_ratio") { $0.hummingbird?.requestsCPURatio }
            add("hummingbird_p99_latency_ratio") { $0.hummingbird?.p99LatencyRatio }
            add("hummingbird_idle_wakeups_per_s") { $0.hummingbird?.idleWakeupsPerSecond }
            add("hummingbird_idle_service_wakeups_per_s") { $0.hummingbird?.idleUnmonitoredWakeupsPerSecond }
            add("hummingbird_busy_wakeups_per_s") { $0.hummingbird?.busyWakeupsPerSecond }
            add("hummingbird_pool_detection_latency_p99_ms") { $0.hummingbird?.stalls?.latencyP99 }
            add("hummingbird_pool_duration_error_p99_ms") { $0.hummingbird?.stalls?.durationErrorP99 }
            add("hummingbird_pool_stalls_undetected", .atMost(0)) {
                $0.hummingbird?.stalls.map { Double($0.count - $0.detected) }
            }
        }
        // The Hummingbird fixture without stallmon, watched from outside by stallmond (when it can run).
        if rounds.contains(where: { $0.external != nil }) {
            add("external_watch_requests_ratio", .atLeast(0.98)) { $0.external?.requestsRatio }
            add("external_watch_requests_cpu_ratio", .atLeast(0.98)) { $0.external?.requestsCPURatio }
            add("external_watch_p99_latency_ratio", .atMost(1.02)) { $0.external?.p99LatencyRatio }
            add("external_watch_stallmond_cpu_ms_per_1k_ticks") { $0.external?.stallmondCPUMillisecondsPer1kTicks }
            add("external_watch_stallmond_cpu_pct") { $0.external?.stallmondCPUPercent }
            add("external_watch_ticks_per_request") { $0.external?.ticksPerRequest }
            add("external_watch_bpf_ns_per_program_run") { $0.external?.bpfNanosecondsPerRun }
            add("external_watch_detection_latency_p50_ms") { $0.external?.stalls?.latencyP50 }
            add("external_watch_detection_latency_p99_ms") { $0.external?.stalls?.latencyP99 }
            add("external_watch_duration_error_p99_ms", .atMost(10)) { $0.external?.stalls?.durationErrorP99 }
            add("external_watch_stalls_undetected", .atMost(0)) {
                $0.external?.stalls.map { Double($0.count - $0.detected) }
            }
        }
        // Only when counted (not in a quick run, nor without valgrind).
        if let instructions {
            // One value per repeat: the median and the spread of identical runs.
            for variant in HummingbirdInstructionCounts.variants {
                guard let values = instructions.hummingbirdPerRequest[variant] else { continue }
                var figure = Figure("callgrind_hummingbird_instructions_per_request_\(variant.rawValue)")
                figure.values = values
                figures.append(figure)
            }
            if let monitored = instructions.hummingbirdPerRequest[.stallmon],
                let bare = instructions.hummingbirdPerRequest[.unmonitored]
            {
                var figure = Figure("callgrind_hummingbird_added_pct", .atMost(1))
                figure.values = zip(monitored, bare).compactMap { $1 > 0 ? ($0 - $1) / $1 * 100 : nil }
                figures.append(figure)
            }
            for variant in Variant.allCases {
                guard let value = instructions.perPass[variant] else { continue }
                let name = String(variant.rawValue.map { $0 == "-" ? "_" : $0 })
                var figure = Figure("callgrind_busy_instructions_per_pass_\(name)")
                figure.values = [value]
                figures.append(figure)
            }
            for variant in InstructionCounts.hopVariants {
                guard let value = instructions.perHop[variant] else { continue }
                let name = String(variant.rawValue.map { $0 == "-" ? "_" : $0 })
                var figure = Figure("callgrind_main_actor_hop_instructions_\(name)")
                figure.values = [value]
                figures.append(figure)
            }
            // The loop-latency histogram (`loop_latency`, off by default), and its share over the floor.
            var overFloor: Double?
            if let with = instructions.perPassWithLoopLatency, let without = instructions.perPass[.stallmon],
                let floor = instructions.perPass[.noopObserver]
            {
                overFloor = (with - without) / floor * 100
            }
            for (key, value) in [
                ("callgrind_busy_instructions_per_pass_stallmon_loop_latency", instructions.perPassWithLoopLatency),
                ("callgrind_main_actor_hop_instructions_stallmon_loop_latency", instructions.perHopWithLoopLatency),
                ("callgrind_loop_latency_over_floor_pct", overFloor),
            ] {
                guard let value else { continue }
                var figure = Figure(key)
                figure.values = [value]
                figures.append(figure)
            }
            for variant in InstructionCounts.poolTaskVariants {
                guard let value = instructions.perPoolTask[variant] else { continue }
                let name = String(variant.rawValue.map { $0 == "-" ? "_" : $0 })
                var figure = Figure("callgrind_pool_task_instructions_\(name)")
                figure.values = [value]
                figures.append(figure)
            }
            for (key, value) in [
                ("callgrind_pool_trampoline_instructions_per_job", instructions.poolTrampoline),
                ("callgrind_pool_enqueue_instructions_per_job", instructions.poolEnqueue),
                ("callgrind_runtime_enqueue_instructions_per_job", instructions.runtimeEnqueue),
            ] {
                guard let value else { continue }
                var figure = Figure(key)
                figure.values = [value]
                figures.append(figure)
            }
            if let trampoline = instructions.poolTrampoline, let enqueue = instructions.poolEnqueue,
                let runtime = instructions.runtimeEnqueue
            {
                var figure = Figure("callgrind_pool_job_cost_instructions")
                figure.values = [trampoline + enqueue - runtime]
                figures.append(figure)
            }
            for variant in NIOInstructionCounts.variants {
                for (key, counts) in [
                    ("callgrind_nio_instructions_per_request", instructions.nioPerRequest),
                    ("callgrind_nio_loop_instructions_per_request", instructions.nioLoopPerRequest),
                ] {
                    guard let value = counts[variant] else { continue }
                    var figure = Figure("\(key)_\(variant.rawValue)")
                    figure.values = [value]
                    figures.append(figure)
                }
            }
        }
        return figures
    }
}
