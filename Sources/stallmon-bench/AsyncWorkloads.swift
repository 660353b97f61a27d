import CStallCapture
import Dispatch
import Foundation
import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// Workloads of an async service: main-actor hops and tiny tasks on the cooperative pool, under the
/// main-thread drain each variant gives an async `@main` on Linux. The child's main is synchronous,
/// but the main actor's executor is the main queue either way, so the drains are the real ones:
/// - unmonitored: `dispatchMain()`, which is what the runtime ends an async main in (worker threads
///   drain the main queue);
/// - noop-observer: the light drain of `start(.asyncMain)` without a monitor, its floor (the main
///   thread polls the main-queue port and drains the queue);
/// - stallmon: the light drain with the monitor fed by it, as `start(.asyncMain)` leaves it;
/// - stallmon-pool: the same with `cooperative_pool` on, every pool job timed by its trampoline.
///
/// Each finishes the child with `rate` (operations per second of the fastest of `segments`
/// segments, as ``ThroughputWorkloads``), `overall_rate`, `seconds`, `cpu_rate` (operations per
/// second of the whole process's CPU time: the work moves between threads), `wakeups_per_s` and,
/// with the pool watched, `pool_wakeups_per_s` (its watchdog's). The pool-tasks child of stallmon-pool
/// also times empty jobs run in a loop on one thread through the trampoline and without it
/// (`job_ns_timed`, `job_ns_plain`, the fastest of 5 runs of 1,000,000): what timing a job adds,
/// below the noise of whole tasks moving between threads.
enum AsyncWorkloads {
    static let variants: [Variant] = [.unmonitored, .noopObserver, .stallmon, .stallmonPool]

    static func start(_ request: ChildRequest) throws {
        var configuration = request.monitorConfiguration
        if let threshold = request.parameters["pool-threshold-ms"].flatMap({ Int($0) }) {
            configuration.cooperativePoolThreshold = .milliseconds(threshold)
        }
        let installed = try InstalledVariant(request.variant, configuration: configuration, asyncMain: true)
        let warmup = max(1, request.int("warmup", default: 1000))
        let measured = request.int("operations", default: 50_000)
        let segments = max(1, request.int("segments", default: 5))
        let settle = request.double("settle", default: 0.7)
        let workload = request.workload
        Task.detached {
            try? await Task.sleep(for: .milliseconds(Int(settle * 1000)))
            await run(workload, warmup)
            let segmentLength = max(1, measured / segments)
            let watchdog = installed.watchdogThreadID
            let startSwitches = Kernel.contextSwitches(ofThread: watchdog)
            let poolWatchdog = installed.poolWatchdogThreadID
            let startPoolSwitches = Kernel.contextSwitches(ofThread: poolWatchdog)
            let startCPU = processCPU()
            let start = Kernel.now()
            var best = 0.0
            var done = 0
            while done < measured {
                let count = min(segmentLength, measured - done)
                let segmentStart = Kernel.now()
                await run(workload, count)
                best = max(best, Double(count) / (Double(Kernel.now() - segmentStart) / 1e9))
                done += count
            }
            let seconds = Double(Kernel.now() - start) / 1e9
            var result: [String: Double] = [
                "rate": best, "overall_rate": Double(measured) / seconds, "seconds": seconds,
                "cpu_rate": Double(measured) / (Double(processCPU() - startCPU) / 1e9),
            ]
            if let startSwitches, let endSwitches = Kernel.contextSwitches(ofThread: watchdog) {
                result["wakeups_per_s"] = Double(endSwitches - startSwitches) / seconds
            }
            if let startPoolSwitches, let endSwitches = Kernel.contextSwitches(ofThread: poolWatchdog) {
                result["pool_wakeups_per_s"] = Double(endSwitches - startPoolSwitches) / seconds
            }
            if installed.variant == .stallmonPool, workload == .poolTasks {
                result.merge(await measureEmptyJobs()) { $1 }
            }
            Child.finish(result)
        }
    }

    private static func run(_ workload: Workload, _ count: Int) async {
        switch workload {
        case .mainActorHops: await hops(count)
        case .poolWork: await poolWork(count)
        default: await poolTasks(count)
        }
    }

    /// `count` round trips from the pool to the main actor and back.
    private static func hops(_ count: Int) async {
        for _ in 0..<count {
            await MainActor.run { MainActorCounter.value &+= 1 }
        }
    }

    /// `count` tiny child tasks on the cooperative pool, 1,000 at a time.
    private static func poolTasks(_ count: Int) async {
        var left = count
        while left > 0 {
            let batch = min(1000, left)
            await withTaskGroup(of: Int.self) { group in
                for index in 0..<batch { group.addTask { index &* 31 } }
                var sum = 0
                for await value in group { sum &+= value }
                if sum == -1 { print("") }
            }
            left -= batch
        }
    }

    /// FNV steps a `poolWork` task takes: a dependent multiply and xor each, about 50 µs in all.
    static let workSteps: UInt64 = 40_000

    /// `count` tasks of about 50 µs of work each on the cooperative pool, 100 at a time.
    private static func poolWork(_ count: Int) async {
        var left = count
        while left > 0 {
            let batch = min(100, left)
            await withTaskGroup(of: UInt64.self) { group in
                for index in 0..<batch {
                    group.addTask {
                        var hash = 0xcbf2_9ce4_8422_2325 ^ UInt64(index)
                        for step in 0..<workSteps { hash = (hash ^ step) &* 0x100_0000_01b3 }
                        return hash
                    }
                }
                var sum: UInt64 = 0
                for await value in group { sum &+= value }
                if sum == 42 { print("") }
            }
            left -= batch
        }
    }

    /// Empty jobs through the trampoline and without it, on a thread of their own: inside a pool
    /// job, the trampoline leaves a job it runs within another untimed.
    /// The pool thread awaits them without blocking (a blocked one would be a pool stall).
    private static func measureEmptyJobs() async -> [String: Double] {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                let runs = 5, jobs = 1_000_000
                var result: [String: Double] = [:]
                result["job_ns_timed"] = (0..<runs).map { _ in stallmon_pool_measure_job_ns(jobs, 1) }.min()
                result["job_ns_plain"] = (0..<runs).map { _ in stallmon_pool_measure_job_ns(jobs, 0) }.min()
                continuation.resume(returning: result)
            }
        }
    }

    private static func processCPU() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
}

@MainActor
enum MainActorCounter {
    static var value = 0
}
