import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The part watched from outside: the Hummingbird fixture without stallmon (`EXAMPLE_STALLMON=off`)
/// under stallmond's BPF tick watcher (release, next to this executable). One service process for
/// the whole round: wrk on `/hello` in runs that alternate between stallmond watching it and no
/// stallmond at all (the system call tracepoints cost every process of the host while a program is
/// attached, so the runs without must have none loaded); stallmond's CPU time per 1,000 loop ticks
/// of the service under wrk, the ticks counted exactly by perf counters in a run of their own; and
/// the detection latency of event-loop stalls (`/loop-*`) seen from outside, at journald.
struct ExternalWatchBench {
    let service: String
    /// The executable as `watch` must name it: the file `/proc/PID/exe` links to.
    let watchPath: String
    let stallmond: String
    let wrk: String
    let plan: ExternalWatchPlan
    let progress: (String) -> Void

    /// Whether this process may load BPF programs and attach them to the system call tracepoints:
    /// root, the kernel's BTF and tracefs (mounted here when it is not yet); otherwise why not.
    static func bpfRefusal() -> String? {
        guard geteuid() == 0 else { return "not root (loading BPF programs needs CAP_BPF and CAP_PERFMON)" }
        guard FileManager.default.fileExists(atPath: "/sys/kernel/btf/vmlinux") else {
            return "no /sys/kernel/btf/vmlinux (the kernel has no BTF)"
        }
        let events = "/sys/kernel/tracing/events/syscalls"
        if !FileManager.default.fileExists(atPath: events) {
            _ = mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nil)
        }
        guard FileManager.default.fileExists(atPath: events) else {
            return "no tracefs at /sys/kernel/tracing (mount -t tracefs nodev /sys/kernel/tracing)"
        }
        return nil
    }

    func round(_ index: Int, of total: Int) throws -> ExternalWatchRound {
        var round = ExternalWatchRound()
        let service = try NIOServerChild([self.service], environment: ["PORT": "0", "EXAMPLE_STALLMON": "off"])
        defer { service.stop() }
        let pid = service.process.processIdentifier
        usleep(UInt32(plan.settle * 1e6))
        _ = try runWrk(service, seconds: plan.busySeconds + 1)

        // stallmond's cost per tick, in a watched run of its own with the tick counters open.
        do {
            // Before stallmond: the programs it loads are those loaded after.
            let runTime = BPFRunTime()
            let daemon = try watch(pid)
            defer { daemon.stop() }
            let counter = try TickCounter(process: pid)
            defer { counter.close() }
            let before = (daemon.cpuNanoseconds(), runTime?.sample())
            let result = try runWrk(service, seconds: plan.busySeconds)
            let ticks = Double(counter.count())
            let cpu = Double(daemon.cpuNanoseconds() - before.0) / 1e6
            round.ticksPerSecond = ticks / result.seconds
            round.ticksPerRequest = ticks / result.requests
            round.stallmondCPUMillisecondsPer1kTicks = ticks > 0 ? cpu / ticks * 1000 : nil
            round.stallmondCPUPercent = cpu / 1000 / result.seconds * 100
            if let start = before.1, let end = runTime?.sample(), end.runs > start.runs {
                round.bpfNanosecondsPerRun = Double(end.nanoseconds - start.nanoseconds) / Double(end.runs - start.runs)
            }
        }

        // The same process with and without the watcher, the order alternating as the other parts'.
        for segment in 0..<plan.segments {
            let order: [Variant] = (index + segment) % 2 == 1 ? [.unmonitored, .stallmon] : [.stallmon, .unmonitored]
            for variant in order {
                let daemon = variant == .stallmon ? try watch(pid) : nil
                defer { daemon?.stop() }
                let cpu = service.cpuNanoseconds()
                var result = try runWrk(service, seconds: 1)
                result.cpuSeconds = Double(service.cpuNanoseconds() - cpu) / 1e9
                round.segments[variant, default: []].append(result)
            }
        }
        for (variant, name) in [(Variant.unmonitored, "unwatched"), (.stallmon, "watched")] {
            progress(
                "[\(index)/\(total)] external watch hello \(name): \(Report.grouped(round.rate(variant) ?? .nan)) "
                    + "requests/s, \(Report.grouped(round.cpuRate(variant) ?? .nan)) per CPU second, "
                    + "p99 \(Report.format(round.p99(variant) ?? .nan)) µs"
                    + (variant == .stallmon
                        ? "; stallmond \(Report.format(round.stallmondCPUMillisecondsPer1kTicks ?? .nan)) ms CPU per "
                            + "1,000 ticks (\(Report.grouped(round.ticksPerSecond ?? .nan)) ticks/s, "
                            + "\(Report.format(round.stallmondCPUPercent ?? .nan))% of a CPU)"
                            + (round.bpfNanosecondsPerRun.map { ", BPF \(Report.format($0)) ns a program run" } ?? "")
                        : "")
            )
        }
        (round.stalls, round.onCPULatencies, round.blockedLatencies) = try stalls(service)
        if let stalls = round.stalls {
            progress(
                "[\(index)/\(total)] external watch loop stalls: \(stalls.detected) of \(stalls.count) detected, "
                    + "at journald past the threshold p50 \(Report.format(stalls.latencyP50 ?? .nan)) ms, p99 "
                    + "\(Report.format(stalls.latencyP99 ?? .nan)) ms; duration error p99 "
                    + "\(Report.format(stalls.durationErrorP99 ?? .nan)) ms"
            )
        }
        return round
    }

    /// stallmond watching the service, once its log says so, and a moment later (its start reads
    /// `/proc` and loads the program: none of that belongs to the run it precedes).
    private func watch(_ pid: Int32, threshold: Int? = nil) throws -> WatchDaemon {
        let daemon = try WatchDaemon(
            stallmond, watching: watchPath, thresholdMilliseconds: threshold ?? plan.thresholdMilliseconds)
        do {
            try daemon.waitUntilWatching(pid)
        } catch {
            daemon.stop()
            throw error
        }
        usleep(UInt32(plan.watchSettle * 1e6))
        return daemon
    }

    private func runWrk(_ service: NIOServerChild, seconds: Int) throws -> NIOBench.WrkResult {
        try NIOBench.runWrk(
            wrk, url: "http://127.0.0.1:\(service.port)/hello", connections: plan.connections, seconds: seconds)
    }

    // MARK: - Stalls

    /// `warmup` + `count` stalls of an event loop (`/loop-cpu`, `/loop-sleep`, `/loop-lock` in turn, each
    /// `stall` ms), `gap` apart, under stallmond with the threshold. A stall's detection latency is
    /// the arrival at journald of its `detected` entry (`__MONOTONIC_TIMESTAMP`, the clock the
    /// handler's start is in: no conversion from the wall clock) − (the handler's own start + the
    /// threshold); its duration error |the `ended` entry's duration − the handler's own
    /// measurement|, which the kernel's tick exceeds by the request's parsing and answer. The first
    /// stalls are not counted: stallmond loads the service's symbols at its first (its latency is
    /// kept apart).
    private func stalls(_ service: NIOServerChild) throws -> (NIOBench.Stalls, onCPU: [Double], blocked: [Double]) {
        let pid = service.process.processIdentifier
        let threshold = UInt64(plan.thresholdMilliseconds) * 1_000_000
        // Checked for every round's stalls: on a shared machine another user's journald may be gone.
        let journald = try BenchJournal.ensureListening()
        defer { journald.map(BenchJournal.stop) }
        if let journald {
            progress("external watch: started journald (pid \(journald.processIdentifier)) for the stalls")
        }
        let since = Kernel.now()
        let daemon = try watch(pid)
        defer { daemon.stop() }
        let connection = try HTTPConnection(port: service.port)
        let routes = ["/loop-cpu", "/loop-sleep", "/loop-lock"]
        var handlers: [(start: UInt64, truth: Double, tid: Int)] = []
        for index in 0..<(plan.stallWarmup + plan.stallCount) {
            let body = try connection.get("\(routes[index % routes.count])?ms=\(plan.stallMilliseconds)")
            guard let object = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
                let start = (object["start_ns"] as? NSNumber)?.uint64Value,
                let truth = (object["truth_us"] as? NSNumber)?.doubleValue,
                let tid = (object["tid"] as? NSNumber)?.intValue
            else { throw ChildRunner.Failure(description: "unexpected answer to /loop-*: \(body)") }
            handlers.append((start, truth, tid))
            usleep(UInt32(plan.stallGapMilliseconds * 1000))
        }
        var entries: [BenchJournal.Entry] = []
        let deadline = Date(timeIntervalSinceNow: 5)
        repeat {
            entries = try BenchJournal.externalEntries(of: pid, since: since)
            if entries.filter({ $0.event == "ended" }).count >= handlers.count { break }
            usleep(100_000)
        } while Date() < deadline
        var latencies: [Double] = []
        var durationErrors: [Double] = []
        var first: Double?
        var onCPU: [Double] = []
        var blocked: [Double] = []
        for (index, (start, truth, tid)) in handlers.enumerated() {
            // The stall's detected entry: of its thread, arrived while it lasted or within 2 s after.
            let end = start + UInt64(truth * 1000)
            guard
                let detected = entries.first(where: {
                    $0.event == "detected" && $0.tid == tid && $0.receivedNanoseconds >= start
                        && $0.receivedNanoseconds <= end + 2_000_000_000
                })
            else {
                if ProcessInfo.processInfo.environment["STALLMON_BENCH_DEBUG"] != nil {
                    FileHandle.standardError.write(
                        Data("external watch: none detected of the handler's \(start)+\(truth) µs on \(tid)\n".utf8))
                }
                continue
            }
            let latency = (Double(detected.receivedNanoseconds) - Double(start + threshold)) / 1e6
            if index == 0 { first = latency }
            guard index >= plan.stallWarmup else { continue }
            latencies.append(latency)
            if index % routes.count == 0 { onCPU.append(latency) } else { blocked.append(latency) }
            if let ended = entries.first(where: { $0.event == "ended" && $0.stallID == detected.stallID }) {
                durationErrors.append(abs(ended.durationMicroseconds - truth) / 1000)
            }
        }
        if ProcessInfo.processInfo.environment["STALLMON_BENCH_DEBUG"] != nil {
            FileHandle.standardError.write(
                Data(
                    "external watch: latencies \(latencies.map(Report.format)) ms, duration errors \(durationErrors.map(Report.format)) ms\n"
                        .utf8))
        }
        let stalls = NIOBench.Stalls(
            count: plan.stallCount, detected: latencies.count, latencies: latencies, durationErrors: durationErrors,
            firstLatency: first)
        return (stalls, onCPU, blocked)
    }
}

/// What one round of the part watched from outside measured.
struct ExternalWatchRound: WrkComparison, Sendable {
    /// `.stallmon`: the runs under stallmond; `.unmonitored`: those with no stallmond at all.
    var segments: [Variant: [NIOBench.WrkResult]] = [:]
    var stallmondCPUMillisecondsPer1kTicks: Double?
    var stallmondCPUPercent: Double?
    var ticksPerSecond: Double?
    var ticksPerRequest: Double?
    /// The tick watcher's programs: nanoseconds a run, over every process's waits.
    var bpfNanosecondsPerRun: Double?
    var stalls: NIOBench.Stalls?
    /// Detection latencies of the stalls on the CPU (`/loop-cpu`: stallmond takes the stack from a
    /// perf sample) and of those blocked (`/loop-sleep`, `/loop-lock`: unwound in place).
    var onCPULatencies: [Double] = []
    var blockedLatencies: [Double] = []
}

/// Durations and settings of the part watched from outside, at a scale.
struct ExternalWatchPlan: Sendable {
    let scale: Double
    var connections = 4

    /// One-second wrk runs of each variant a round.
    var segments: Int { max(2, Int((6 * scale).rounded())) }
    /// The watched run over which stallmond's CPU time and the ticks are counted.
    var busySeconds: Int { max(1, Int((4 * scale).rounded())) }
    var settle: Double { 1 }
    var watchSettle: Double { 0.3 }
    var thresholdMilliseconds: Int { 100 }
    var stallCount: Int { max(12, Int(100 * scale)) }
    var stallWarmup: Int { 2 }
    var stallMilliseconds: Int { 250 }
    var stallGapMilliseconds: Int { 100 }

    static let settings =
        "one service process, wrk with 1 thread and 4 keep-alive connections, nothing pinned; 1 s wrk runs "
        + "alternating between stallmond watching it (started for the run, watch_threshold_ms 100) and no stallmond"
    static let stallSettings =
        "watch_threshold_ms 100, 250 ms stalls of an event loop (/loop-cpu, /loop-sleep, /loop-lock in turn) 100 ms "
        + "apart, 2 warm-up stalls not counted"
}

extension Bench {
    /// The part watched from outside, unless --no-external, or what it needs is missing (then one
    /// line says what): the Hummingbird fixture, stallmond built next to this executable, BPF.
    func makeExternalWatchBench() throws -> ExternalWatchBench? {
        guard options.external else { return nil }
        let skip = "stallmon-bench: no figures watched from outside: "
        guard let service = try HummingbirdBench.executablePath(explicit: options.hummingbirdPath) else {
            progress(skip + "Examples/.build/{release,debug}/HummingbirdFixture is missing (or --hummingbird PATH)")
            return nil
        }
        guard let stallmond = WatchDaemon.executablePath() else {
            progress(
                skip + "stallmond is not built next to stallmon-bench (swift build -c release --product stallmond "
                    + "&& swift build -c release --product stallmond-daemon)")
            return nil
        }
        if let refusal = ExternalWatchBench.bpfRefusal() {
            progress(skip + refusal)
            return nil
        }
        let bench = ExternalWatchBench(
            service: service, watchPath: URL(fileURLWithPath: service).resolvingSymlinksInPath().path,
            stallmond: stallmond, wrk: try NIOBench.wrkPath(), plan: ExternalWatchPlan(scale: options.scale),
            progress: progress)
        progress(
            "stallmon-bench: watched from outside: \(bench.watchPath) with EXAMPLE_STALLMON=off, under \(stallmond)")
        return bench
    }

    /// --external-only: the rounds watched from outside, and their figures alone.
    func runExternalWatchOnly(_ external: ExternalWatchBench, started: UInt64) throws -> Int32 {
        progress("stallmon-bench: watched from outside only, \(options.rounds) round\(options.rounds == 1 ? "" : "s")")
        var rounds: [RoundResults] = []
        for round in 1...options.rounds {
            var results = RoundResults()
            results.external = try external.round(round, of: options.rounds)
            rounds.append(results)
        }
        let figures = Figures.compute(rounds: rounds, memory: nil).filter { $0.key.hasPrefix("external_watch_") }
        let elapsed = Int(Double(Kernel.now() - started) / 1e9)
        var lines = Report.partTable(flag: "--external-only", rounds: rounds.count, elapsed: elapsed, figures: figures)
        lines += ExternalWatchBench.reportLines(rounds: rounds, service: external.watchPath)
        Report.emit(table: lines.joined(separator: "\n") + "\n", figures: figures, json: options.json)
        return 0
    }
}

extension ExternalWatchBench {
    /// The lines of the table about the part watched from outside.
    static func reportLines(rounds: [RoundResults], service: String) -> [String] {
        let runs = rounds.compactMap(\.external)
        guard !runs.isEmpty else { return [] }
        func median(_ values: [Double], _ format: (Double) -> String = Report.format) -> String {
            Statistics.median(values).map(format) ?? "n/a"
        }
        func cells(_ value: (ExternalWatchRound, Variant) -> Double?, _ format: (Double) -> String = Report.format)
            -> String
        {
            [(Variant.unmonitored, "unwatched"), (.stallmon, "watched")].map { variant, name in
                "\(name) \(median(runs.compactMap { value($0, variant) }, format))"
            }.joined(separator: ", ")
        }
        let stalls = runs.compactMap(\.stalls)
        return [
            "",
            "Watched from outside: wrk against \(service) /hello, EXAMPLE_STALLMON=off (\(ExternalWatchPlan.settings)); "
                + "medians of rounds: requests/s " + cells({ $0.rate($1) }, Report.grouped)
                + "; per service CPU second " + cells({ $0.cpuRate($1) }, Report.grouped) + "; latency p99 µs "
                + cells { $0.p99($1) },
            "stallmond under that load (a watched run of its own, the service's epoll waits counted by perf "
                + "counters): \(median(runs.compactMap(\.ticksPerSecond), Report.grouped)) ticks/s, "
                + "\(median(runs.compactMap(\.ticksPerRequest))) a request; stallmond's CPU "
                + "\(median(runs.compactMap(\.stallmondCPUPercent)))% of a CPU, "
                + "\(median(runs.compactMap(\.stallmondCPUMillisecondsPer1kTicks))) ms per 1,000 ticks; BPF programs "
                + "\(median(runs.compactMap(\.bpfNanosecondsPerRun))) ns a run (any process's waits)",
            "Loop stalls seen from outside (\(stalls.first?.count ?? 0) a round; \(ExternalWatchPlan.stallSettings)): "
                + "detected \(stalls.map(\.detected).reduce(0, +)) of \(stalls.map(\.count).reduce(0, +)); latency = "
                + "detected entry at journald − (handler start + threshold) p50 "
                + median(stalls.compactMap(\.latencyP50)) + " ms, p99 " + median(stalls.compactMap(\.latencyP99))
                + " ms (on the CPU p50 " + median(runs.compactMap { Statistics.percentile($0.onCPULatencies, 0.5) })
                + " ms, blocked p50 " + median(runs.compactMap { Statistics.percentile($0.blockedLatencies, 0.5) })
                + " ms); duration error p99 " + median(stalls.compactMap(\.durationErrorP99)) + " ms; the first stall "
                + "(stallmond loads the service's symbols) " + median(stalls.compactMap(\.firstLatency)) + " ms",
        ]
    }
}
