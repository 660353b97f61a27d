import Foundation

/// The table and the JSON object.
enum Report {
    /// Four decimals below 1, three below 100, one above.
    static func format(_ value: Double) -> String {
        guard value.isFinite else { return "n/a" }
        let magnitude = abs(value)
        let decimals = magnitude >= 100 ? 1 : magnitude >= 1 ? 3 : 4
        return String(format: "%.\(decimals)f", value)
    }

    /// A whole number with thousands separators: `141,225`.
    static func grouped(_ value: Double) -> String {
        guard value.isFinite else { return "n/a" }
        let digits = String(Int(value.rounded()).magnitude)
        var result = ""
        for (index, digit) in digits.enumerated() {
            if index > 0 && (digits.count - index) % 3 == 0 { result.append(",") }
            result.append(digit)
        }
        return (value < 0 ? "-" : "") + result
    }

    /// One JSON object: each figure's median, in the figures' order (`null` if it was not measured).
    /// The run's output: with `--json`, the table on standard error and the figures as JSON on
    /// standard output; otherwise the table on standard output.
    static func emit(table: String, figures: [Figure], json: Bool) {
        if json {
            FileHandle.standardError.write(Data(table.utf8))
            print(Self.json(figures))
        } else {
            print(table, terminator: "")
        }
    }

    static func json(_ figures: [Figure]) -> String {
        let members = figures.map { figure in
            "  \"\(figure.key)\": \(figure.median.map(format) ?? "null")"
        }
        return "{\n" + members.joined(separator: ",\n") + "\n}"
    }

    /// The figures' rows under their heading: each figure's median, min–max, target and verdict.
    static func figureRows(_ figures: [Figure]) -> [String] {
        var lines = [row("figure", "median", "min–max", "target", "")]
        for figure in figures {
            let range = figure.minimum.flatMap { low in figure.maximum.map { "\(format(low))–\(format($0))" } } ?? "n/a"
            let verdict = figure.isMet.map { $0 ? "met" : "MISSED" } ?? ""
            lines.append(
                row(figure.key, figure.median.map(format) ?? "n/a", range, figure.target?.description ?? "—", verdict))
        }
        return lines
    }

    /// The first lines of a part run alone (`--nio-only`, …): its rounds, how long it took, and
    /// the figures' rows.
    static func partTable(flag: String, rounds: Int, elapsed: Int, figures: [Figure]) -> [String] {
        [
            "stallmon-bench \(flag): \(rounds) round\(rounds == 1 ? "" : "s"), "
                + "\(elapsed / 60)m\(elapsed % 60)s; medians of per-round values",
            "",
        ] + figureRows(figures)
    }

    static func table(
        figures: [Figure], rounds: [RoundResults], memory: [String: Double], instructions: InstructionCounts?,
        plan: Plan, options: Options, elapsed: Double
    ) -> String {
        var lines: [String] = []
        let minutes = Int(elapsed) / 60
        let seconds = Int(elapsed) % 60
        lines.append(
            "stallmon-bench: \(rounds.count) round\(rounds.count == 1 ? "" : "s") at scale \(format(options.scale)), "
                + "\(minutes)m\(seconds)s; loops run \(options.cfRunLoop ? "CFRunLoopRun()" : "RunLoop.main.run()"); "
                + "medians of per-round values"
        )
        lines.append("")
        lines += figureRows(figures)

        lines.append("")
        lines.append(
            "throughput /s (median)".padding(toLength: 26, withPad: " ", startingAt: 0)
                + Variant.allCases.map { $0.rawValue.leftPadded(15) }.joined()
        )
        let units: [Workload: String] = [
            .busy: "busy (passes)", .work: "work (passes)", .timer: "timer (fires)", .io: "io (round trips)",
        ]
        for workload in Bench.throughputWorkloads {
            let cells = Variant.allCases.map { variant in
                (Statistics.median(rounds.compactMap { $0.rate(workload, variant) }).map(grouped) ?? "n/a").leftPadded(
                    15)
            }
            lines.append(
                (units[workload] ?? workload.rawValue).padding(toLength: 26, withPad: " ", startingAt: 0)
                    + cells.joined())
        }

        func median(_ workload: Workload, _ variant: Variant, _ key: String) -> String {
            Statistics.median(rounds.compactMap { $0[workload, variant]?[key] }).map(format) ?? "n/a"
        }
        func count(_ workload: Workload, _ variant: Variant, _ key: String) -> String {
            Statistics.median(rounds.compactMap { $0[workload, variant]?[key] }).map(grouped) ?? "n/a"
        }
        func cpuRatio(_ workload: Workload, _ numerator: Variant, _ denominator: Variant) -> String {
            let ratios = rounds.compactMap { round -> Double? in
                guard let top = round[workload, numerator]?["cpu_rate"],
                    let bottom = round[workload, denominator]?["cpu_rate"]
                else {
                    return nil
                }
                return top / bottom
            }
            return Statistics.median(ratios).map(format) ?? "n/a"
        }
        lines.append(
            "by main-thread CPU time instead of wall time: busy stallmon ÷ noop \(cpuRatio(.busy, .stallmon, .noopObserver)), "
                + "noop ÷ unmonitored \(cpuRatio(.busy, .noopObserver, .unmonitored)), "
                + "stallmon ÷ unmonitored \(cpuRatio(.busy, .stallmon, .unmonitored)); "
                + "work \(cpuRatio(.work, .stallmon, .unmonitored)); timer \(cpuRatio(.timer, .stallmon, .unmonitored))"
        )
        for (workload, unit) in [
            (Workload.mainActorHops, "main-actor round trips"), (.poolTasks, "pool tasks"),
            (.poolWork, "pool tasks of ~50 µs"),
        ] {
            let cells = AsyncWorkloads.variants.map { variant in
                "\(variant.rawValue) \(Statistics.median(rounds.compactMap { $0.rate(workload, variant) }).map(grouped) ?? "n/a")"
            }
            lines.append(
                "async main, \(unit)/s (median; unmonitored = dispatch_main(), the others drain the main queue "
                    + "on the main thread as start(.asyncMain) does, noop-observer without a monitor): \(cells.joined(separator: ", ")); by process CPU time stallmon ÷ "
                    + "unmonitored \(cpuRatio(workload, .stallmon, .unmonitored))"
            )
        }
        lines.append("")
        lines.append(
            "watchdog wakeups/s: stallmon busy \(median(.busy, .stallmon, "wakeups_per_s")), "
                + "idle \(median(.idle, .stallmon, "wakeups_per_s")); blog busy \(median(.busy, .blog, "wakeups_per_s")), "
                + "idle \(median(.idle, .blog, "wakeups_per_s"))"
        )
        lines.append(
            "stalls (\(plan.latency["count"] ?? "?") a round; \(Plan.latencySettings)): "
                + "detected \(count(.stalls, .stallmon, "detected")), ended \(count(.stalls, .stallmon, "ended")), "
                + "durations matched \(count(.stalls, .stallmon, "matched")); "
                + "latency = watchdog wake + first sample p50 \(median(.stalls, .stallmon, "capture_p50_ms")) ms, "
                + "p99 \(median(.stalls, .stallmon, "capture_p99_ms")) ms, then reporter queue to sink p50 "
                + "\(median(.stalls, .stallmon, "delivery_p50_ms")) ms, p99 \(median(.stalls, .stallmon, "delivery_p99_ms")) ms; "
                + "first stall (cold symbolicator) \(median(.stalls, .stallmon, "first_latency_ms")) ms"
        )
        lines.append(
            "sample pause: 64-frame-deep spinning thread, max_frames 64, \(plan.samplePause["samples"] ?? "?") samples a round; "
                + "frames \(count(.samplePause, .unmonitored, "frames")), max \(median(.samplePause, .unmonitored, "max_us")) µs"
        )
        lines.append(
            "long stall: \(plan.longStall["seconds"] ?? "?") s, default configuration (250 ms threshold, 20 ms sample interval); "
                + "samples \(count(.longStall, .stallmon, "samples"))"
        )
        lines.append(
            "memory: \(plan.memory["count"] ?? "?") stalls, VmRSS after them − after 100 (\(Plan.memorySettings)); "
                + "the monitor counted \(grouped(memory["stalls"] ?? .nan))"
        )
        if let instructions {
            let base = instructions.perPass[.unmonitored]
            let cells = Variant.allCases.map { variant -> String in
                guard let value = instructions.perPass[variant] else { return "\(variant.rawValue) n/a" }
                let delta =
                    base.map { value - $0 }.map {
                        variant == .unmonitored ? "" : " (\($0 >= 0 ? "+" : "")\(grouped($0)))"
                    } ?? ""
                return "\(variant.rawValue) \(grouped(value))\(delta)"
            }
            lines.append(
                "callgrind instructions per busy pass on the loop's thread (\(InstructionCounts.passes.long) − "
                    + "\(InstructionCounts.passes.short) passes): "
                    + cells.joined(separator: ", ")
            )
            if let with = instructions.perPassWithLoopLatency, let without = instructions.perPass[.stallmon],
                let floor = instructions.perPass[.noopObserver]
            {
                lines.append(
                    "with loop_latency: stallmon \(grouped(with)) (+\(grouped(with - without)) a pass, "
                        + "\(format((with - without) / floor * 100)) % of the floor)"
                )
            }
        }
        lines += NIOBench.reportLines(rounds: rounds, instructions: instructions)
        return lines.joined(separator: "\n") + "\n"
    }

    static func row(_ key: String, _ median: String, _ range: String, _ target: String, _ verdict: String)
        -> String
    {
        (key.count < 42 ? key.padding(toLength: 42, withPad: " ", startingAt: 0) : key + " ") + median.leftPadded(10)
            + "  "
            + range.padding(toLength: 22, withPad: " ", startingAt: 0)
            + target.padding(toLength: 9, withPad: " ", startingAt: 0)
            + verdict
    }
}

extension String {
    func leftPadded(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
