import CoreFoundation
import Dispatch
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Workloads whose throughput on the main run loop is compared across variants. Each counts
/// passes, measures the passes after a warm-up, and finishes the child with:
/// - `rate`: passes per second of the fastest of `segments` (default 5) equal segments of the
///   measured passes. Other processes on the machine only ever slow a segment down, so the fastest
///   one is the run's cost with the least interference; the monitors' own periodic work (a
///   watchdog wakeup every 250 ms) falls into every segment.
/// - `overall_rate`: passes per second over all the measured passes;
/// - `seconds`: the measured time;
/// - `cpu_rate`: measured passes per second of the main thread's CPU time (what the pass costs the
///   loop's thread, less sensitive to other processes on a noisy machine than `rate`);
/// - `wakeups_per_s`: context switches per second of the variant's watchdog thread, if it has one.
enum ThroughputWorkloads {
    static func start(_ request: ChildRequest) throws {
        let installed = try InstalledVariant(request.variant, configuration: request.monitorConfiguration)
        let counter = PassCounter(
            warmup: max(1, request.int("warmup", default: 1000)), measured: request.int("passes", default: 100_000),
            segments: request.int("segments", default: 5),
            installed: installed
        )
        // The workload starts once the variant has settled (stallmon's reporter loads symbols in
        // the background when the monitor starts), so that the passes compare the steady state.
        let settle = request.double("settle", default: 0)
        if settle > 0, request.workload != .idle {
            DispatchQueue.main.asyncAfter(deadline: .now() + settle) {
                do {
                    try startWorkload(request, installed: installed, counter: counter)
                } catch {
                    Child.fail("\(request.workload.rawValue): \(error)")
                }
            }
        } else {
            try startWorkload(request, installed: installed, counter: counter)
        }
    }

    private static func startWorkload(_ request: ChildRequest, installed: InstalledVariant, counter: PassCounter) throws
    {
        switch request.workload {
        case .busy:
            postBusyPass(counter, work: nil)
        case .work:
            postBusyPass(counter, work: HashingWork(bytes: request.int("work-bytes", default: 32 * 1024)))
        case .timer:
            // Timer(timeInterval:) fires at once on Linux; a fire date and a 1 µs interval make it due
            // again on every pass of the loop.
            let timer = Timer(fire: Date(), interval: 0.000_001, repeats: true) { _ in counter.pass() }
            RunLoop.main.add(timer, forMode: .common)
        case .io:
            try PingPong(counter: counter).start()
        case .idle:
            watchIdle(
                installed, settle: request.double("settle", default: 1), seconds: request.double("seconds", default: 10)
            )
        default:
            preconditionFailure("not a throughput workload")
        }
    }

    /// One pass a main-queue block; each block posts the next.
    private static func postBusyPass(_ counter: PassCounter, work: HashingWork?) {
        DispatchQueue.main.async {
            if let work { work.run() }
            counter.pass()
            postBusyPass(counter, work: work)
        }
    }

    /// Leaves the loop alone and counts the watchdog's wakeups from another thread, so that the
    /// measurement itself never wakes the loop.
    private static func watchIdle(_ installed: InstalledVariant, settle: Double, seconds: Double) {
        let watcher = Thread {
            Thread.sleep(forTimeInterval: settle)
            let tid = installed.watchdogThreadID
            let startSwitches = Kernel.contextSwitches(ofThread: tid)
            let start = Kernel.now()
            Thread.sleep(forTimeInterval: seconds)
            let endSwitches = Kernel.contextSwitches(ofThread: tid)
            let elapsed = Double(Kernel.now() - start) / 1e9
            var result = ["seconds": elapsed]
            if let startSwitches, let endSwitches {
                result["wakeups_per_s"] = Double(endSwitches - startSwitches) / elapsed
            }
            Child.finish(result)
        }
        watcher.start()
    }
}

/// Counts a workload's passes on the main thread and finishes the child after the measured ones.
final class PassCounter: @unchecked Sendable {
    private let warmup: Int
    private let measured: Int
    private let segmentLength: Int
    private let installed: InstalledVariant
    // Touched on the main thread only.
    private var passes = 0
    private var startTime: UInt64 = 0
    private var startCPU: UInt64 = 0
    private var startSwitches: Int?
    private var watchdog: Int32 = 0
    private var segmentStart: UInt64 = 0
    private var bestSegmentRate = 0.0

    /// - Parameter segments: The measured passes are timed in this many equal segments as well.
    init(warmup: Int, measured: Int, segments: Int, installed: InstalledVariant) {
        self.warmup = warmup
        self.measured = measured
        self.segmentLength = max(1, measured / max(1, segments))
        self.installed = installed
    }

    func pass() {
        passes += 1
        if passes == warmup {
            watchdog = installed.watchdogThreadID
            startSwitches = Kernel.contextSwitches(ofThread: watchdog)
            startCPU = Kernel.threadCPU(getpid()) ?? 0
            startTime = Kernel.now()
            segmentStart = startTime
            return
        }
        guard passes > warmup else { return }
        if (passes - warmup) % segmentLength == 0 {
            let now = Kernel.now()
            bestSegmentRate = max(bestSegmentRate, Double(segmentLength) / (Double(now - segmentStart) / 1e9))
            segmentStart = now
        }
        if passes == warmup + measured {
            let elapsed = Double(Kernel.now() - startTime) / 1e9
            let cpu = Double((Kernel.threadCPU(getpid()) ?? 0) - startCPU) / 1e9
            var result = [
                "rate": bestSegmentRate > 0 ? bestSegmentRate : Double(measured) / elapsed,
                "overall_rate": Double(measured) / elapsed, "seconds": elapsed,
            ]
            if cpu > 0 { result["cpu_rate"] = Double(measured) / cpu }
            if let startSwitches, let endSwitches = Kernel.contextSwitches(ofThread: watchdog) {
                result["wakeups_per_s"] = Double(endSwitches - startSwitches) / elapsed
            }
            Child.finish(result)
        }
    }
}

/// Real work for a pass: FNV-1a over a buffer, folded back into the buffer so that no pass hashes
/// the same bytes as the last.
final class HashingWork: @unchecked Sendable {
    private var buffer: [UInt8]

    init(bytes: Int) {
        var generator = SystemRandomNumberGenerator()
        buffer = (0..<max(1, bytes)).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
    }

    @inline(never)
    @discardableResult
    func run() -> UInt64 {
        buffer.withUnsafeMutableBufferPointer { bytes in
            var hash: UInt64 = 0xcbf2_9ce4_8422_2325
            for byte in bytes {
                hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
            }
            bytes[Int(hash % UInt64(bytes.count))] &+= 1
            return hash
        }
    }

    /// The buffer size that takes about `microseconds` to hash on this machine (the fastest of
    /// several tries, so that a busy moment does not inflate it).
    static func calibrate(microseconds: Double) -> Int {
        let probe = HashingWork(bytes: 256 * 1024)
        var best = Double.infinity
        for _ in 0..<30 {
            let start = Kernel.now()
            probe.run()
            best = min(best, Double(Kernel.now() - start))
        }
        let bytesPerMicrosecond = Double(256 * 1024) / (best / 1000)
        return max(1024, Int(bytesPerMicrosecond * microseconds) / 1024 * 1024)
    }
}

/// A one-byte ping-pong over a socketpair, served by the main run loop: an echo thread answers
/// each byte, signals a version-0 run-loop source and wakes the main loop (CFRunLoopWakeUp); the
/// source's callout reads the answer, counts the round trip and sends the next byte. Every round
/// trip puts the loop to sleep and wakes it: after-waiting, before-sources, before-waiting.
final class PingPong: @unchecked Sendable {
    private let counter: PassCounter
    private var local: Int32 = -1

    init(counter: PassCounter) {
        self.counter = counter
    }

    struct SocketError: Error, CustomStringConvertible {
        var errno: Int32
        var description: String { "socketpair failed (errno \(errno))" }
    }

    func start() throws {
        var descriptors: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &descriptors) == 0 else {
            throw SocketError(errno: errno)
        }
        local = descriptors[0]
        let remote = descriptors[1]
        // The loop's thread and the echo thread share one CPU: every handoff is then a plain
        // context switch. Left to the scheduler on a 2-core machine, each run lands either on one
        // CPU or across two (an inter-processor wakeup per hop, 2–3× slower), and the variants'
        // rates would compare placements rather than monitors.
        let cpu = Affinity.currentCPU()
        if let cpu { Affinity.pinCallingThread(to: cpu) }

        var context = CFRunLoopSourceContext()
        context.version = 0
        context.info = Unmanaged.passRetained(self).toOpaque()  // lives as long as the child
        context.perform = { info in
            Unmanaged<PingPong>.fromOpaque(info!).takeUnretainedValue().answer()
        }
        nonisolated(unsafe) let mainLoop = CFRunLoopGetMain()!
        nonisolated(unsafe) let source = CFRunLoopSourceCreate(kCFAllocatorDefault, 0, &context)!
        CFRunLoopAddSource(mainLoop, source, kCFRunLoopCommonModes)

        let echo = Thread {
            if let cpu { Affinity.pinCallingThread(to: cpu) }
            var byte: UInt8 = 0
            while read(remote, &byte, 1) == 1 {
                guard write(remote, &byte, 1) == 1 else { break }
                CFRunLoopSourceSignal(source)
                CFRunLoopWakeUp(mainLoop)
            }
        }
        echo.name = "bench-echo"
        echo.start()
        send()
    }

    private func answer() {
        var bytes = (0, 0, 0, 0, 0, 0, 0, 0) as (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8)
        let count = withUnsafeMutableBytes(of: &bytes) { read(local, $0.baseAddress, $0.count) }
        guard count > 0 else { return }
        for _ in 0..<count {
            counter.pass()
            send()
        }
    }

    private func send() {
        var byte: UInt8 = 1
        _ = write(local, &byte, 1)
    }
}

/// CPU affinity. `sched_getcpu` and `sched_setaffinity` are GNU extensions that the Glibc module
/// does not import, so they are looked up in libc at run time.
enum Affinity {
    private typealias GetCPU = @convention(c) () -> Int32
    private typealias SetAffinity = @convention(c) (pid_t, Int, UnsafeRawPointer) -> Int32

    /// The CPU the calling thread runs on.
    static func currentCPU() -> Int32? {
        guard let symbol = dlsym(nil, "sched_getcpu") else { return nil }
        let cpu = unsafeBitCast(symbol, to: GetCPU.self)()
        return cpu >= 0 ? cpu : nil
    }

    /// Binds the calling thread to `cpu`.
    @discardableResult
    static func pinCallingThread(to cpu: Int32) -> Bool {
        guard let symbol = dlsym(nil, "sched_setaffinity"), cpu >= 0, cpu < 1024 else { return false }
        var mask = [UInt8](repeating: 0, count: 128)  // a cpu_set_t: 1024 bits
        mask[Int(cpu) / 8] = UInt8(1) << UInt8(cpu % 8)
        return mask.withUnsafeBytes { unsafeBitCast(symbol, to: SetAffinity.self)(0, $0.count, $0.baseAddress!) } == 0
    }
}
