import CStallCapture
import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// How long a sampled thread spends in stallmon's signal handler (it copies registers and the top
/// of the stack; the watchdog unwinds the copy): the sampler from CStallCapture, called directly
/// against a thread that spins 64 frames deep. Finishes with `p50_us`, `p99_us`, `max_us` (handler
/// exit − handler enter), `frames` (of the last sample, unwound from the copy) and `answered`.
///
/// Then the pressure a service's system calls are under: a thread that alternates 100 µs on the CPU
/// with a 20 µs `nanosleep` (which a handler ends with EINTR whatever SA_RESTART says), sampled
/// every millisecond as a watchdog samples a stall (system calls spared). Finishes with
/// `pressure_syscalls`, `pressure_eintr` (the sleeps that ended with EINTR) and `pressure_samples`.
enum SamplePause {
    static func run(_ request: ChildRequest) -> Never {
        let depth = request.int("depth", default: 64)
        let count = request.int("samples", default: 2000)
        let maximumFrames = Int32(request.int("max-frames", default: 64))
        guard let signal = installSampler() else { Child.fail("no free real-time signal") }
        let slot = stallmon_sampler_slot_claim()
        guard slot >= 0 else { Child.fail("no sampler slot") }

        let spinner = DeepSpinner()
        let tid = spinner.start(depth: depth)
        var sample = stallmon_sample()
        var pauses: [Double] = []
        pauses.reserveCapacity(count)
        var frames = 0
        for _ in 0..<count {
            stallmon_sample_thread(slot, tid, signal, maximumFrames, 50_000_000, &sample)
            if sample.status == Int32(STALLMON_SAMPLE_OK.rawValue) {
                pauses.append(Double(sample.handler_exit_ns - sample.handler_enter_ns) / 1000)
                frames = Int(sample.frame_count)
            }
            usleep(300)
        }
        spinner.stop()

        let sleeper = ShortSleeper()
        let sleeperID = sleeper.start()
        let pressureSamples = count * 2
        var answeredUnderPressure = 0
        for _ in 0..<pressureSamples {
            stallmon_sample_stack(
                slot, sleeperID, signal, maximumFrames, 50_000_000, Int32(STALLMON_SAMPLE_SPARE_SYSCALLS),
                &sample)
            if sample.status == Int32(STALLMON_SAMPLE_OK.rawValue) { answeredUnderPressure += 1 }
            usleep(1000)
        }
        let (syscalls, interrupted) = sleeper.stop()
        Child.finish([
            "p50_us": Statistics.percentile(pauses, 0.5) ?? .nan, "p99_us": Statistics.percentile(pauses, 0.99) ?? .nan,
            "max_us": pauses.max() ?? .nan, "frames": Double(frames), "answered": Double(pauses.count),
            "pressure_syscalls": Double(syscalls), "pressure_eintr": Double(interrupted),
            "pressure_samples": Double(answeredUnderPressure),
        ])
    }

    /// Installs the sampling handler on the highest real-time signal nobody else handles.
    private static func installSampler() -> Int32? {
        for signal in stride(from: stallmon_sigrtmax() - 4, through: stallmon_sigrtmin() + 4, by: -1)
        where stallmon_signal_in_use(signal) == 0 && stallmon_sampler_install(signal) == 0 {
            return signal
        }
        return nil
    }
}

/// A thread that recurses to a given depth and spins there until stopped.
final class DeepSpinner: Sendable {
    private let stopping = Atomic<Bool>(false)
    private let ready = DispatchSemaphore(value: 0)
    private let thread = Atomic<Int32>(0)

    /// Starts the thread and returns its kernel id once it spins at `depth`.
    func start(depth: Int) -> Int32 {
        let spinner = Thread { [self] in
            thread.store(Kernel.currentThreadID(), ordering: .releasing)
            Spin.keep(UInt64(descend(depth)))
        }
        spinner.stackSize = 1 << 20
        spinner.start()
        ready.wait()
        return thread.load(ordering: .acquiring)
    }

    func stop() {
        stopping.store(true, ordering: .releasing)
    }

    /// One frame per level: no inlining, no tail call, no turning the recursion into a loop.
    @inline(never)
    @_optimize(none)
    private func descend(_ depth: Int) -> Int {
        guard depth > 1 else {
            ready.signal()
            var spins = 0
            while !stopping.load(ordering: .relaxed) { spins &+= 1 }
            return spins
        }
        let below = descend(depth - 1)
        return below &+ depth
    }
}

/// A thread that alternates 100 µs on the CPU with a 20 µs `nanosleep`, counting the sleeps and
/// those that a signal ended with EINTR.
final class ShortSleeper: Sendable {
    private let stopping = Atomic<Bool>(false)
    private let ready = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private let thread = Atomic<Int32>(0)
    private let sleeps = Atomic<Int>(0)
    private let interrupted = Atomic<Int>(0)

    func start() -> Int32 {
        let sleeper = Thread { [self] in
            thread.store(Kernel.currentThreadID(), ordering: .releasing)
            ready.signal()
            var hash: UInt64 = 0
            while !stopping.load(ordering: .relaxed) {
                let end = DispatchTime.now().uptimeNanoseconds + 100_000
                while DispatchTime.now().uptimeNanoseconds < end { hash = (hash ^ 1) &* 0x100_0000_01b3 }
                // usleep is a nanosleep, which a handler ends with EINTR.
                if usleep(20) != 0 && errno == EINTR { interrupted.add(1, ordering: .relaxed) }
                sleeps.add(1, ordering: .relaxed)
            }
            Spin.keep(hash)
            done.signal()
        }
        sleeper.start()
        ready.wait()
        return thread.load(ordering: .acquiring)
    }

    /// Stops the thread; the sleeps it made and how many ended with EINTR.
    func stop() -> (sleeps: Int, interrupted: Int) {
        stopping.store(true, ordering: .releasing)
        done.wait()
        return (sleeps.load(ordering: .relaxed), interrupted.load(ordering: .relaxed))
    }
}
