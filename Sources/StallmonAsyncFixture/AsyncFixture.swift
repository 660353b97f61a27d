// A small async service (an `async` `@main`, as Vapor, Hummingbird and swift-service-lifecycle
// services are) that stalls its main actor on request. The tests run it as a child process and read
// what its monitor reported from standard output (one JSON object a line).
//
//   StallmonAsyncFixture SCENARIO [--threshold-ms N] [--seconds N] [--loop-start-timeout-ms N]
//                                 [--journal --identifier NAME]
//
// Scenarios:
//   unwatched  starts the monitor as a run-loop service would (start()), which throws at once here
//   stalls     start(.asyncMain); main-actor stalls on the CPU, in a system call and on a lock, then
//              a DispatchQueue.main block on the CPU
//   idle       start(.asyncMain); nothing happens for --seconds
//   timers     start(.asyncMain); counts the firings of a 100 ms timer on RunLoop.main for 1 s
//   watchdog   start(.asyncMain); READY=1, then a 3 s main-actor stall in a system call
//   (--drain run-loop has those scenarios start(.asyncMainRunLoop) instead)
//   other-drain  start(.asyncMain), stop(), then start(.asyncMainRunLoop): a second drain, which throws
//   late       calls start(.asyncMain) after main()'s first await: too late, it throws
//   pool-stalls  start(.asyncMain) with cooperative_pool on (its threshold --threshold-ms): jobs of the
//              cooperative pool blocked in usleep, a blocking read, DispatchSemaphore.wait and on the CPU
//   pool-idle  the same, and nothing happens for --seconds
//   pool-spans  the same as pool-idle, with spans of StallmonTracer: the watchdog's sweeps of the
//              table of open spans (SpanSweeps.swift)
//   pool-layout  start(.asyncMain) with cooperative_pool on: whether the hook is set, and a pool job
//              blocked in usleep; --mismatch CHECK first makes the runtime layout's check CHECK find
//              another value (stallmon_pool_simulate_layout_mismatch)
//   pool-forks  the same, and fork() in a loop for --seconds while spans start and end and the main
//              actor stalls (ForkSpans.swift)
//   pool-off   start(.asyncMain) with cooperative_pool off, and a pool job blocked in usleep
//   pool-default  start(.asyncMain) with cooperative_pool left at its default, and the pool-stalls jobs
//   pool-busy  the same as pool-stalls, with two tasks running pool jobs of 40 ms of CPU time back to
//              back for --seconds (the tests stop the process in the middle of them)
//   event-loop-wedge  startService(eventLoops:) on a group of one loop, which a task holds on the CPU
//              for --wedge-seconds after 1.5 s
//   pool-wedge  start(.asyncMain), the pool watched by default; after 1.5 s every pool thread is held
//              in usleep for --wedge-seconds
//   hops       measures main-actor hops from the global pool (--hops N, --drain D): D is dispatch (the
//              runtime's dispatch_main drain), run-loop or light (the main run loop or the light drain
//              without a monitor), monitored (start(.asyncMain), the light drain) or monitored-run-loop
//              (start(.asyncMainRunLoop))

import CStallCapture
import CoreFoundation
import Dispatch
import Foundation
import NIOCore
import NIOPosix
import StallJournal
import StallMonitor
import StallMonitorNIO
import StallmonFixtureKit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

@main
enum AsyncFixture {
    static func main() async throws {
        let options = Options(Array(CommandLine.arguments.dropFirst()))
        if let check = options.mismatch, stallmon_pool_simulate_layout_mismatch(check) != 0 {
            FileHandle.standardError.write(Data("unknown layout check \(check)\n".utf8))
            exit(64)
        }
        var configuration = StallMonitor.Configuration()
        configuration.threshold = .milliseconds(options.threshold)
        configuration.sampleInterval = .milliseconds(10)
        configuration.syslogIdentifier = options.identifier
        configuration.loopStartTimeout = .milliseconds(options.loopStartTimeout)
        configuration.rateLimit.burst = 1000  // the tests count every report
        configuration.cooperativePool =
            options.scenario == "pool-default"
            ? nil : options.scenario.hasPrefix("pool-") && options.scenario != "pool-off"
        configuration.cooperativePoolThreshold = .milliseconds(options.threshold)
        var sinks: [any ReportSink] = [JSONLinesSink(identifier: options.identifier)]
        if options.journal { sinks.append(JournalSink(syslogIdentifier: options.identifier)) }
        let monitor = try StallMonitor(configuration: configuration, sinks: sinks)
        if options.scenario == "hops" {
            try await Hops.measure(options, monitor: monitor)
            return
        }
        if options.scenario == "other-drain" {
            // A process has one drain of the main queue: the first start chose the light drain.
            try monitor.start(.asyncMain)
            monitor.stop()
            do {
                try monitor.start(.asyncMainRunLoop)
            } catch {
                Fixture.print(["type": "error", "description": "\(error)", "main_thread": Thread.isMainThread])
            }
            try await Task.sleep(for: .milliseconds(10))
            Fixture.print(["type": "drained", "main_thread": Thread.isMainThread])
            return
        }
        if options.scenario == "late" {
            try await Task.sleep(for: .milliseconds(10))
            do {
                try monitor.start(.asyncMain)
            } catch {
                Fixture.print(["type": "error", "description": "\(error)", "main_thread": Thread.isMainThread])
            }
            return
        }

        if options.scenario == "unwatched" {
            do {
                try monitor.start()
            } catch {
                Fixture.print(["type": "error", "description": "\(error)", "code": "\(error.code)"])
            }
            Fixture.truth("main-actor-cpu") { AsyncWork.recompute(milliseconds: 50) }
            return
        }

        if options.scenario == "event-loop-wedge" {
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            try monitor.startService(eventLoops: group)
            try await Task.sleep(for: .milliseconds(1500))
            group.next().execute { AsyncWork.wedgeEventLoop(seconds: options.wedgeSeconds) }
            try await Task.sleep(for: .seconds(options.seconds))
            return
        }
        if options.scenario == "pool-wedge" {
            try monitor.start(.asyncMain)
            try await Task.sleep(for: .milliseconds(1500))
            for _ in 0..<ProcessInfo.processInfo.activeProcessorCount {
                Task.detached { AsyncWork.holdPoolThread(seconds: options.wedgeSeconds) }
            }
            try await Task.sleep(for: .seconds(options.seconds))
            return
        }

        // The adoption under test: one line before main()'s first await.
        try monitor.start(
            options.drain == "run-loop" ? .asyncMainRunLoop : .asyncMain
        )

        let started = Fixture.now()
        let switches = WatchdogSwitches(monitor: monitor, started: started)
        switches.record(every: 0.5, until: options.seconds)

        switch options.scenario {
        case "stalls":
            // Past the reporter's symbol loading, which competes for the CPU in the first few hundred ms.
            try await Task.sleep(for: .milliseconds(1000))
            Fixture.truth("main-actor-cpu") { AsyncWork.recompute(milliseconds: 600) }
            try await Task.sleep(for: .milliseconds(300))
            Fixture.truth("main-actor-syscall") { AsyncWork.readConfiguration(milliseconds: 600) }
            try await Task.sleep(for: .milliseconds(300))
            let lock = NSLock()
            let holding = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                lock.lock()
                holding.signal()
                usleep(800_000)
                lock.unlock()
            }
            holding.wait()
            Fixture.truth("main-actor-lock") { AsyncWork.waitForCache(lock) }
            try await Task.sleep(for: .milliseconds(300))
            DispatchQueue.main.async {
                Fixture.truth("main-queue-cpu") { AsyncWork.flushMetrics(milliseconds: 600) }
            }
        case "idle", "pool-idle":
            break
        case "pool-stalls", "pool-default":
            // After main() first suspended: the monitor sets the hook then.
            try await Task.sleep(for: .milliseconds(1000))
            PoolWork.printHook("running")
            await PoolWork.stall("pool-usleep") { PoolWork.napInPool(milliseconds: 400) }
            try await Task.sleep(for: .milliseconds(300))
            await PoolWork.stall("pool-read") { PoolWork.readFromPipe(milliseconds: 400) }
            try await Task.sleep(for: .milliseconds(300))
            await PoolWork.stall("pool-semaphore") { PoolWork.waitForSemaphore(milliseconds: 400) }
            try await Task.sleep(for: .milliseconds(300))
            await PoolWork.stall("pool-cpu") { PoolWork.crunch(milliseconds: 400) }
        case "pool-busy":
            let end = started + UInt64(options.seconds * 1e9)
            let longest = await withTaskGroup(of: (jobs: Int, longest: UInt64).self) { group in
                for _ in 0..<2 {
                    group.addTask {
                        var (jobs, longest): (Int, UInt64) = (0, 0)
                        while Fixture.now() < end {
                            let start = Fixture.now()
                            PoolWork.crunch(cpuMilliseconds: 40)
                            (jobs, longest) = (jobs + 1, max(longest, Fixture.now() - start))
                            // The task's next job.
                            await Task.yield()
                        }
                        return (jobs, longest)
                    }
                }
                var total: (jobs: Int, longest: UInt64) = (0, 0)
                for await task in group { total = (total.jobs + task.jobs, max(total.longest, task.longest)) }
                return total
            }
            Fixture.print(["type": "pool-busy", "jobs": longest.jobs, "longest_ns": Int(longest.longest)])
        case "pool-spans":
            try await Task.sleep(for: .milliseconds(1000))
            try await SpanSweeps.run()
        case "pool-layout":
            try await Task.sleep(for: .milliseconds(300))
            PoolWork.printHook("running")
            await PoolWork.stall("pool-usleep") { PoolWork.napInPool(milliseconds: 300) }
        case "pool-forks":
            try await Task.sleep(for: .milliseconds(300))
            await ForkSpans.run(seconds: options.seconds - 0.5)
        case "pool-off":
            PoolWork.printHook("running")
            try await Task.sleep(for: .milliseconds(500))
            await PoolWork.stall("pool-usleep") { PoolWork.napInPool(milliseconds: 400) }
        case "timers":
            // A timer on RunLoop.main: it fires under the run loop only.
            let fired = TimerCount()
            let timer = Timer(timeInterval: 0.1, repeats: true) { _ in fired.increment() }
            RunLoop.main.add(timer, forMode: .common)
            try await Task.sleep(for: .milliseconds(1000))
            Fixture.print(["type": "timers", "fired": fired.value, "drain": options.drain])
        case "watchdog":
            monitor.notifyReady()
            try await Task.sleep(for: .milliseconds(1200))
            Fixture.truth("main-actor-syscall") { AsyncWork.readConfiguration(milliseconds: 3000) }
        default:
            FileHandle.standardError.write(Data("unknown scenario \(options.scenario)\n".utf8))
            exit(64)
        }

        let left = options.seconds - Double(Fixture.now() - started) / 1e9
        if left > 0 { try await Task.sleep(for: .milliseconds(Int(left * 1000))) }
        // The last switch count, then the monitor's own statistics.
        switches.print()
        let statistics = monitor.statistics
        monitor.stop()
        Fixture.print([
            "type": "statistics", "stalls": statistics.stalls, "main_thread": Thread.isMainThread,
            "pool_untimed_jobs": stallmon_pool_untimed_jobs(),
        ])
        if options.scenario.hasPrefix("pool-") { PoolWork.printHook("stopped") }
    }
}

struct Options {
    var scenario = ""
    var threshold = 100
    var seconds = 5.0
    var loopStartTimeout = 1000
    var hops = 100_000
    var journal = false
    var identifier = "stallmon-async-fixture"
    var drain = "monitored"
    var wedgeSeconds = 6.0
    var mismatch: String?

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--threshold-ms": threshold = Int(iterator.next() ?? "") ?? threshold
            case "--seconds": seconds = Double(iterator.next() ?? "") ?? seconds
            case "--loop-start-timeout-ms": loopStartTimeout = Int(iterator.next() ?? "") ?? loopStartTimeout
            case "--hops": hops = Int(iterator.next() ?? "") ?? hops
            case "--journal": journal = true
            case "--identifier": identifier = iterator.next() ?? identifier
            case "--drain": drain = iterator.next() ?? drain
            case "--wedge-seconds": wedgeSeconds = Double(iterator.next() ?? "") ?? wedgeSeconds
            case "--mismatch": mismatch = iterator.next()
            default: scenario = argument
            }
        }
    }
}

/// Counts timer firings (on the main thread).
final class TimerCount: Sendable {
    private let count = Mutex(0)

    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}

/// Main-actor hops from the global pool: each `MainActor.run` enqueues a job on the main executor
/// and resumes on the pool when it is done.
enum Hops {
    @MainActor static var counter = 0

    @MainActor static func measure(_ options: Options, monitor: StallMonitor) async throws {
        switch options.drain {
        case "dispatch": break
        case "run-loop": _ = stallmon_async_main_run_loop_install { CFRunLoopRun() }
        case "light": _ = stallmon_async_main_run_loop_install(stallmon_async_main_light_drain)
        case "monitored-run-loop": try monitor.start(.asyncMainRunLoop)
        default: try monitor.start(.asyncMain)
        }
        try await Task.sleep(for: .milliseconds(200))
        let count = options.hops
        let elapsed = await Task.detached {
            let start = Fixture.now()
            for _ in 0..<count {
                await MainActor.run { counter += 1 }
            }
            return Fixture.now() - start
        }.value
        let cpu = Fixture.processCPU()
        Fixture.print([
            "type": "hops", "drain": options.drain, "hops": count, "ns_per_hop": Double(elapsed) / Double(count),
            "process_cpu_ns": cpu, "main_thread": Thread.isMainThread,
        ])
        monitor.stop()
    }
}

/// The stalling code. Each is its own non-inlined function, so that tests can look for it by name
/// (and file:line) in the reported stack.
enum AsyncWork {
    /// An event-loop task busy on the CPU.
    @inline(never)
    static func wedgeEventLoop(seconds: Double) {
        let end = Fixture.milliseconds() + seconds * 1000
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while Fixture.milliseconds() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        blackHole(hash)
    }

    /// A pool job blocked in `usleep`.
    @inline(never)
    static func holdPoolThread(seconds: Double) {
        usleep(UInt32(seconds * 1_000_000))
    }

    /// Main-actor work busy on the CPU (FNV hashing).
    @MainActor @inline(never)
    static func recompute(milliseconds: Int) {
        let end = Fixture.milliseconds() + Double(milliseconds)
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while Fixture.milliseconds() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        blackHole(hash)
    }

    /// Main-actor work blocked in a system call (`poll` with no descriptors).
    @MainActor @inline(never)
    static func readConfiguration(milliseconds: Int) {
        let end = Fixture.milliseconds() + Double(milliseconds)
        while true {
            let left = end - Fixture.milliseconds()
            if left <= 0 { break }
            _ = poll(nil, 0, Int32(left.rounded(.up)))
        }
    }

    /// Main-actor work waiting for a lock another thread holds.
    @MainActor @inline(never)
    static func waitForCache(_ lock: NSLock) {
        lock.lock()
        lock.unlock()
    }

    /// A main-queue block busy on the CPU.
    @inline(never)
    static func flushMetrics(milliseconds: Int) {
        let end = Fixture.milliseconds() + Double(milliseconds)
        var hash: UInt64 = 0x8422_2325_cbf2_9ce4
        while Fixture.milliseconds() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        blackHole(hash)
    }

    @inline(never)
    static func blackHole(_ value: UInt64) {
        if value == 42 { Swift.print("") }
    }
}

/// The clock, the output, and the true extent of each stall, for the tests to compare with.
/// Context switches of the watchdog thread (each wakeup is one), printed every half second.
final class WatchdogSwitches: @unchecked Sendable {
    private let monitor: StallMonitor
    private let started: UInt64

    init(monitor: StallMonitor, started: UInt64) {
        self.monitor = monitor
        self.started = started
    }

    /// On a thread of its own: a task would be a job of the cooperative pool, which the pool's
    /// watchdog would see.
    func record(every interval: Double, until seconds: Double) {
        Thread.detachNewThread { [self] in
            var elapsed = 0.0
            while elapsed < seconds {
                usleep(UInt32(interval * 1_000_000))
                elapsed += interval
                print()
            }
        }
    }

    func print() {
        print(tid: monitor.watchdogThreadID, type: "switches")
        print(tid: monitor.poolWatchdogThreadID, type: "pool-switches")
    }

    private func print(tid: Int32, type: String) {
        guard tid != 0, let status = try? String(contentsOfFile: "/proc/self/task/\(tid)/status", encoding: .utf8)
        else { return }
        var total = 0
        for line in status.split(separator: "\n")
        where line.hasPrefix("voluntary_ctxt_switches") || line.hasPrefix("nonvoluntary_ctxt_switches") {
            total += Int(line.split(separator: ":").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? 0
        }
        Fixture.print(["type": type, "elapsed_ns": Fixture.now() - started, "count": total])
    }
}

/// Jobs of the cooperative pool that hold their thread: each stalling function is its own
/// non-inlined function, so that tests can look for it by name (and file:line).
enum PoolWork {
    /// Runs `body` as a job of the cooperative pool and records its truth and the thread it held.
    static func stall(_ name: String, _ body: @escaping @Sendable () -> Void) async {
        await Task.detached {
            Fixture.print(["type": "pool-thread", "name": name, "tid": Int(stallmon_gettid())])
            Fixture.truth(name, body)
        }.value
    }

    /// Whether `swift_task_enqueueGlobal_hook` is set, and whether it is the monitor's.
    static func printHook(_ moment: String) {
        let hook = dlsym(nil, "swift_task_enqueueGlobal_hook")
        let value = hook?.load(as: UnsafeRawPointer?.self)
        Fixture.print([
            "type": "pool-hook", "moment": moment, "hook_set": value != nil,
            "monitor_hook": stallmon_pool_installed() == 1, "layout_verified": stallmon_pool_layout_verified() == 1,
            "layout_problem": stallmon_pool_layout_problem().map { String(cString: $0) } ?? "",
        ])
    }

    /// Blocked in `usleep` (clock_nanosleep), which a signal handler would end early with EINTR.
    @inline(never)
    static func napInPool(milliseconds: Int) {
        let start = Fixture.now()
        let result = usleep(UInt32(milliseconds * 1000))
        let slept = Double(Fixture.now() - start) / 1e6
        Fixture.print(["type": "usleep", "result": Int(result), "slept_ms": slept])
    }

    /// Blocked in `read(2)` on a pipe that another thread writes to after `milliseconds`.
    @inline(never)
    static func readFromPipe(milliseconds: Int) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return }
        let writer = fds[1]
        Thread.detachNewThread {
            usleep(UInt32(milliseconds * 1000))
            var byte: UInt8 = 1
            _ = write(writer, &byte, 1)
        }
        var byte: UInt8 = 0
        _ = read(fds[0], &byte, 1)
        close(fds[0])
        close(fds[1])
    }

    /// Blocked in `DispatchSemaphore.wait()` until another thread signals it after `milliseconds`.
    @inline(never)
    static func waitForSemaphore(milliseconds: Int) {
        let semaphore = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            usleep(UInt32(milliseconds * 1000))
            semaphore.signal()
        }
        semaphore.wait()
    }

    /// Busy until the thread has used `cpuMilliseconds` of CPU time: a stop of the process lengthens
    /// it by the time stopped.
    @inline(never)
    static func crunch(cpuMilliseconds: Int) {
        let end = Fixture.threadCPU() + UInt64(cpuMilliseconds) * 1_000_000
        var hash: UInt64 = 0x2325_cbf2_9ce4_8422
        while Fixture.threadCPU() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        AsyncWork.blackHole(hash)
    }

    /// Busy on the CPU (FNV hashing).
    @inline(never)
    static func crunch(milliseconds: Int) {
        let end = Fixture.milliseconds() + Double(milliseconds)
        var hash: UInt64 = 0x2325_cbf2_9ce4_8422
        while Fixture.milliseconds() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        AsyncWork.blackHole(hash)
    }
}
