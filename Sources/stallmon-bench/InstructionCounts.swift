import Foundation

/// Instructions per busy pass of each variant on the loop's own (main) thread, counted by
/// valgrind's callgrind: what the variant costs the loop it watches. Each variant runs twice with
/// different pass counts; the difference cancels start-up and leaves the cost of the passes alone,
/// which wall time on a noisy machine cannot resolve at the level of one observer callout.
///
/// Main-actor round trips are counted the same way for the whole process (a hop runs on the pool and
/// on the main thread): the light drain alone (noop-observer) and monitored (stallmon). valgrind
/// cannot run the unmonitored `dispatch_main()` child (it crashes in libdispatch's worker setup).
/// Tiny pool tasks are counted the same way, with the pool watched (stallmon-pool) and not
/// (stallmon, the same drain). The difference of the two totals swings by a few hundred
/// instructions a task with the threads' interleaving, so the cost of timing a job is taken from
/// the profiles' call graphs (`callgrind_annotate`): the trampoline around the job's invoke call,
/// and the hook's enqueue against the runtime's (`swift_task_enqueueGlobalImpl`), per job.
struct InstructionCounts: Sendable {
    static let passes = (short: 10_000, long: 30_000)
    static let hops = (short: 4_000, long: 24_000)
    static let hopVariants: [Variant] = [.noopObserver, .stallmon]
    static let poolTasks = (short: 5_000, long: 25_000)
    static let poolTaskVariants: [Variant] = [.stallmon, .stallmonPool]

    var perPass: [Variant: Double] = [:]
    var perHop: [Variant: Double] = [:]
    /// stallmon with the loop-latency histogram (`loop_latency`): per busy pass, and per round trip
    /// to the main actor under the light drain.
    var perPassWithLoopLatency: Double?
    var perHopWithLoopLatency: Double?
    var perPoolTask: [Variant: Double] = [:]
    /// Per pool job: the trampoline's own instructions (clock reads included), the hook's enqueue,
    /// and the runtime's enqueue it replaces.
    var poolTrampoline: Double?
    var poolEnqueue: Double?
    var runtimeEnqueue: Double?
    /// Per `/hello` request of the SwiftNIO server (``NIOInstructionCounts``): the whole process,
    /// and its event loop thread alone.
    var nioPerRequest: [Variant: Double] = [:]
    var nioLoopPerRequest: [Variant: Double] = [:]
    /// Per `/hello` request of HummingbirdFixture, the whole process, each repeat's
    /// (``HummingbirdInstructionCounts``).
    var hummingbirdPerRequest: [Variant: [Double]] = [:]

    static func valgrindPath() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/valgrind" }.first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    static func measure(
        runner: ChildRunner, valgrind: String, parameters: [String: String], progress: (String) -> Void
    ) throws -> InstructionCounts {
        var counts = InstructionCounts()
        let directory = FileManager.default.temporaryDirectory
        // valgrind 3.19 cannot read the DWARF 5 that Swift emits and gives up on the executable;
        // a copy without debug sections (symbols stay) runs fine.
        let stripped = directory.appendingPathComponent("stallmon-bench-\(getpid())-nodebug")
        defer { try? FileManager.default.removeItem(at: stripped) }
        let executable = try strip(ChildRunner.executablePath, to: stripped.path)
        let passRuns = Variant.allCases.map { ($0, false) } + [(Variant.stallmon, true)]
        for (variant, loopLatency) in passRuns {
            var totals: [Int: Double] = [:]
            for passes in [Self.passes.short, Self.passes.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-\(variant.rawValue)-\(loopLatency)-\(passes).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    for suffix in ["", "-01", "-02", "-03", "-04", "-05", "-06", "-07", "-08"] {
                        try? FileManager.default.removeItem(atPath: output.path + suffix)
                    }
                    try? FileManager.default.removeItem(at: log)
                }
                var childParameters = parameters.merging(["passes": "\(passes)", "warmup": "1", "timeout": "900"]) {
                    $1
                }
                if loopLatency { childParameters["loop_latency"] = "1" }
                let request = ChildRequest(variant, .busy, childParameters)
                _ = try runner.run(
                    request,
                    under: [
                        valgrind, "--tool=callgrind", "--separate-threads=yes", "--callgrind-out-file=\(output.path)",
                        "--log-file=\(log.path)",
                    ],
                    executable: executable
                )
                // With --separate-threads, thread 1 (the main thread) writes to "<file>-01".
                totals[passes] = try total(in: URL(fileURLWithPath: output.path + "-01"))
            }
            if let long = totals[Self.passes.long], let short = totals[Self.passes.short] {
                let perPass = (long - short) / Double(Self.passes.long - Self.passes.short)
                if loopLatency {
                    counts.perPassWithLoopLatency = perPass
                } else {
                    counts.perPass[variant] = perPass
                }
                progress(
                    "callgrind busy \(variant.rawValue)\(loopLatency ? " with loop_latency" : ""): "
                        + "\(Report.grouped(perPass)) instructions/pass")
            }
        }
        for variant in Self.poolTaskVariants {
            var totals: [Int: Double] = [:]
            for tasks in [Self.poolTasks.short, Self.poolTasks.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-\(variant.rawValue)-pool-\(tasks).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    try? FileManager.default.removeItem(at: output)
                    try? FileManager.default.removeItem(at: log)
                }
                // Under valgrind a job runs some 50 times slower: the default threshold would see
                // stalls, whose reports (symbolication) are no cost of a job.
                let request = ChildRequest(
                    variant, .poolTasks,
                    [
                        "operations": "\(tasks)", "warmup": "1", "segments": "1", "settle": "0.2", "timeout": "900",
                        "pool-threshold-ms": "600000",
                    ]
                )
                _ = try runner.run(
                    request,
                    under: [
                        valgrind, "--tool=callgrind", "--callgrind-out-file=\(output.path)", "--log-file=\(log.path)",
                    ],
                    executable: executable
                )
                totals[tasks] = try total(in: output)
                if tasks == Self.poolTasks.long, let tree = callTree(output) {
                    if variant == .stallmonPool {
                        if let (whole, jobs) = tree.cost(of: "stallmon_pool_run_job", from: "_dispatch_client_callout"),
                            let (invoked, _) = tree.cost(
                                of: "jobInvoke(void*, void*, unsigned int)", from: "stallmon_pool_run_job"),
                            jobs > 0
                        {
                            counts.poolTrampoline = (whole - invoked) / jobs
                        }
                        if let (cost, calls) = tree.cost(of: "enqueue_global", from: "swift_task_enqueueGlobal"),
                            calls > 0
                        {
                            counts.poolEnqueue = cost / calls
                        }
                    } else if let (cost, calls) = tree.cost(
                        of: "swift_task_enqueueGlobalImpl", from: "swift_task_enqueueGlobal"), calls > 0
                    {
                        counts.runtimeEnqueue = cost / calls
                    }
                }
            }
            if let long = totals[Self.poolTasks.long], let short = totals[Self.poolTasks.short] {
                counts.perPoolTask[variant] = (long - short) / Double(Self.poolTasks.long - Self.poolTasks.short)
                progress(
                    "callgrind pool task \(variant.rawValue): \(Report.grouped(counts.perPoolTask[variant]!)) "
                        + "instructions/task (whole process)")
            }
        }
        let hopRuns = Self.hopVariants.map { ($0, false) } + [(Variant.stallmon, true)]
        for (variant, loopLatency) in hopRuns {
            var totals: [Int: Double] = [:]
            for hops in [Self.hops.short, Self.hops.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-\(variant.rawValue)-\(loopLatency)-hops-\(hops).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    try? FileManager.default.removeItem(at: output)
                    try? FileManager.default.removeItem(at: log)
                }
                var childParameters = [
                    "operations": "\(hops)", "warmup": "1", "segments": "1", "settle": "0.2", "timeout": "900",
                ]
                if loopLatency { childParameters["loop_latency"] = "1" }
                let request = ChildRequest(variant, .mainActorHops, childParameters)
                _ = try runner.run(
                    request,
                    under: [
                        valgrind, "--tool=callgrind", "--callgrind-out-file=\(output.path)", "--log-file=\(log.path)",
                    ],
                    executable: executable
                )
                totals[hops] = try total(in: output)
            }
            if let long = totals[Self.hops.long], let short = totals[Self.hops.short] {
                let perHop = (long - short) / Double(Self.hops.long - Self.hops.short)
                if loopLatency {
                    counts.perHopWithLoopLatency = perHop
                } else {
                    counts.perHop[variant] = perHop
                }
                progress(
                    "callgrind main-actor hop \(variant.rawValue)\(loopLatency ? " with loop_latency" : ""): "
                        + "\(Report.grouped(perHop)) instructions/round trip (whole process)")
            }
        }
        return counts
    }

    /// A profile's call graph: for each function, its inclusive cost through each caller.
    struct CallTree {
        let text: String

        /// The inclusive instructions of `callee` called from `caller`, and the number of calls.
        func cost(of callee: String, from caller: String) -> (instructions: Double, calls: Double)? {
            for block in text.components(separatedBy: "\n\n") {
                let lines = block.split(separator: "\n")
                guard lines.contains(where: { $0.contains("*  ???:\(callee) [") }) else { continue }
                guard let line = lines.first(where: { $0.contains("<") && $0.contains("???:\(caller) (") }) else {
                    continue
                }
                let fields = line.split(separator: " ")
                guard let instructions = fields.first.flatMap({ Double($0.replacingOccurrences(of: ",", with: "")) }),
                    let count = line.range(of: #"\(([0-9,]+)x\)"#, options: .regularExpression).map({
                        line[$0].dropFirst().dropLast(2).replacingOccurrences(of: ",", with: "")
                    }),
                    let calls = Double(count)
                else { continue }
                return (instructions, calls)
            }
            return nil
        }
    }

    /// `callgrind_annotate --inclusive=yes --tree=caller` of a profile; `nil` without the tool.
    private static func callTree(_ profile: URL) -> CallTree? {
        let annotate = Process()
        annotate.executableURL = URL(fileURLWithPath: "/usr/bin/callgrind_annotate")
        annotate.arguments = ["--inclusive=yes", "--tree=caller", profile.path]
        let pipe = Pipe()
        annotate.standardOutput = pipe
        annotate.standardError = FileHandle.nullDevice
        guard (try? annotate.run()) != nil else { return nil }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        annotate.waitUntilExit()
        guard annotate.terminationStatus == 0 else { return nil }
        return CallTree(text: String(decoding: data, as: UTF8.self))
    }

    /// Copies `executable` without its debug sections (`objcopy --strip-debug`); the original when
    /// objcopy is missing.
    static func strip(_ executable: String, to copy: String) throws -> String {
        let objcopy = Process()
        objcopy.executableURL = URL(fileURLWithPath: "/usr/bin/objcopy")
        objcopy.arguments = ["--strip-debug", executable, copy]
        guard (try? objcopy.run()) != nil else { return executable }
        objcopy.waitUntilExit()
        return objcopy.terminationStatus == 0 ? copy : executable
    }

    /// The `summary:` (or `totals:`) line of a callgrind output file: instructions of the whole run.
    static func total(in file: URL) throws -> Double {
        let text = try String(contentsOf: file, encoding: .utf8)
        for line in text.split(separator: "\n") where line.hasPrefix("summary:") || line.hasPrefix("totals:") {
            if let value = Double(line.split(separator: " ").last ?? "") { return value }
        }
        throw ChildRunner.Failure(description: "no instruction total in \(file.path)")
    }
}
