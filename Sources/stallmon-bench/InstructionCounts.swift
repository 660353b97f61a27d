import Foundation

/// Instructions per busy pass of each variant on the loop's own (main) thread, counted by
/// valgrind's callgrind: what the variant costs the loop it watches. Each variant runs twice with
/// different pass counts; the difference cancels start-up and leaves the cost of the passes alone,
/// which wall time on a noisy machine cannot resolve at the level of one observer callout.
///
/// Main-actor round trips are counted the same way for the whole process (a hop runs on the pool and
/// on the main thread): the light drain alone (noop-observer) and monitored (stallmon). valgrind
/// cannot run the unmonitored `dispatch_main()` child (it crashes in libdispatch's worker setup).
struct InstructionCounts: Sendable {
    static let passes = (short: 10_000, long: 30_000)
    static let hops = (short: 4_000, long: 24_000)
    static let hopVariants: [Variant] = [.noopObserver, .stallmon]

    var perPass: [Variant: Double] = [:]
    var perHop: [Variant: Double] = [:]
    /// Per `/hello` request of the SwiftNIO server, whole process (``NIOInstructionCounts``).
    var nioPerRequest: [Variant: Double] = [:]

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
        for variant in Variant.allCases {
            var totals: [Int: Double] = [:]
            for passes in [Self.passes.short, Self.passes.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-\(variant.rawValue)-\(passes).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    for suffix in ["", "-01", "-02", "-03", "-04", "-05", "-06", "-07", "-08"] {
                        try? FileManager.default.removeItem(atPath: output.path + suffix)
                    }
                    try? FileManager.default.removeItem(at: log)
                }
                let request = ChildRequest(
                    variant, .busy, parameters.merging(["passes": "\(passes)", "warmup": "1", "timeout": "900"]) { $1 }
                )
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
                counts.perPass[variant] = (long - short) / Double(Self.passes.long - Self.passes.short)
                progress(
                    "callgrind busy \(variant.rawValue): \(Report.grouped(counts.perPass[variant]!)) instructions/pass")
            }
        }
        for variant in Self.hopVariants {
            var totals: [Int: Double] = [:]
            for hops in [Self.hops.short, Self.hops.long] {
                let output = directory.appendingPathComponent(
                    "stallmon-bench-\(getpid())-\(variant.rawValue)-hops-\(hops).callgrind")
                let log = directory.appendingPathComponent("stallmon-bench-\(getpid()).valgrind.log")
                defer {
                    try? FileManager.default.removeItem(at: output)
                    try? FileManager.default.removeItem(at: log)
                }
                let request = ChildRequest(
                    variant, .mainActorHops,
                    ["operations": "\(hops)", "warmup": "1", "segments": "1", "settle": "0.2", "timeout": "900"]
                )
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
                counts.perHop[variant] = (long - short) / Double(Self.hops.long - Self.hops.short)
                progress(
                    "callgrind main-actor hop \(variant.rawValue): \(Report.grouped(counts.perHop[variant]!)) "
                        + "instructions/round trip (whole process)")
            }
        }
        return counts
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
