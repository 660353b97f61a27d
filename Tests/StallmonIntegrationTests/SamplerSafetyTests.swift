import CStallCapture
import CoreFoundation
import Foundation
import StallmonTestSupport
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// The signal handler interrupts a thread wherever it is; it must never deadlock it, and a thread
    /// that cannot answer must cost the watchdog no more than the timeout.
    @Suite
    struct SamplerSafetyTests {
        @Test func samplingInsideMallocLocksAndSyscallsNeverDeadlocks() throws {
            // The fixture samples every 10 ms for 2 s while the loop thread churns through malloc,
            // a held lock and write(2); the run times out (and fails) if the handler ever deadlocks.
            let run = try FixtureRun.run("churn", arguments: ["--stack-source", "signal"], timeout: 20)
            #expect(run.exitStatus == 0)
            let ended = try #require(run.ended.first)
            #expect(ended.number("STALL_SAMPLES") >= 100)
            #expect(
                ended.samplesMostlyAnswered,
                "\(ended.number("STALL_SAMPLES_UNANSWERED")) of \(ended.number("STALL_SAMPLES")) samples unanswered")
            #expect(
                ended.frames.contains {
                    $0["function"] as? String == "Stalls.churnMallocLocksAndSyscalls(milliseconds:)"
                })
        }

        @Test func threadThatBlocksTheSignalGetsANoStackReport() throws {
            let run = try FixtureRun.run("thread-loop-blocked", arguments: ["--stack-source", "signal"])
            #expect(run.exitStatus == 0)
            let detected = try #require(run.detected.first)
            let ended = try #require(run.ended.first)
            #expect(detected.string("MESSAGE").contains("no stack: thread blocks SIGRTMAX-4"))
            #expect(ended.number("STALL_SAMPLES_UNANSWERED") == ended.number("STALL_SAMPLES"))
            #expect(ended.string("STALL_BACKTRACE").contains("no stack"))
            #expect(abs(ended.milliseconds("STALL_DURATION_USEC") - (run.truth("thread-loop-blocked") ?? 0)) <= 15)
        }

        @Test func sampleRequestToAThreadThatNeverAnswersTimesOut() throws {
            let (signal, slot) = try claimSampler()
            defer { stallmon_sampler_slot_release(slot) }

            let blocked = BlockedThread(signal: signal)
            defer { blocked.finish() }
            var sample = stallmon_sample()
            let started = stallmon_now_ns()
            stallmon_sample_thread(slot, blocked.threadID, signal, 64, 50_000_000, &sample)
            let elapsed = Double(stallmon_now_ns() - started) / 1e6
            #expect(sample.status == Int32(STALLMON_SAMPLE_TIMEOUT.rawValue))
            #expect(elapsed >= 49 && elapsed < 500, "waited \(elapsed) ms for a 50 ms timeout")

            // The same slot then samples a thread that answers.
            let answering = BlockedThread(signal: signal, blocks: false)
            defer { answering.finish() }
            stallmon_sample_thread(slot, answering.threadID, signal, 64, 1_000_000_000, &sample)
            #expect(sample.status == Int32(STALLMON_SAMPLE_OK.rawValue))
            #expect(sample.frame_count > 2)
            #expect(sample.handler_exit_ns >= sample.handler_enter_ns)
        }

        /// A handler that unwound in place took glibc's loader lock (libunwind's dl_iterate_phdr on
        /// a cache miss): a signal landing inside that lock's own lock or unlock wedged the thread
        /// for good, and then the watchdog's unwinder, waiting for the same lock, wedged stop(). Two
        /// loops stall for 60 s inside the loader's lock, sampled every millisecond: one walking the
        /// loaded images, one loading and unloading a library. Every sample is a copy the watchdog
        /// unwinds over a module table read from /proc/self/maps, so neither side takes that lock.
        @Test(.timeLimit(.minutes(3)))
        func samplesInsideTheLoadersLockNeverWedgeTheThreadOrTheWatchdog() throws {
            let run = try FixtureRun.run(
                "loader-locks",
                arguments: [
                    "--threshold-ms", "10", "--sample-interval-ms", "1", "--seconds", "60", "--stack-source", "signal",
                ],
                timeout: 150)
            #expect(run.exitStatus == 0, "\(run.standardError.suffix(2000))")
            let stops = run.lines.filter { $0["type"] as? String == "stop" }
            #expect(Set(stops.map { $0.string("loop") }) == ["main", "thread"])
            for stop in stops {
                #expect(stop.number("duration_ns") < 5e9, "stop() took \(stop.number("duration_ns")) ns")
            }
            #expect(run.lines.first { $0["type"] as? String == "walks" }?.number("count") ?? 0 > 0)
            #expect(run.lines.first { $0["type"] as? String == "loads" }?.number("count") ?? 0 > 0)
            for function in ["Stalls.walkLoadedImages(milliseconds:)", "Stalls.loadAndUnloadLibrary(milliseconds:)"] {
                let report = run.ended.first { $0.frames.contains { $0["function"] as? String == function } }
                let ended = try #require(report, "no report names \(function)")
                #expect(ended.milliseconds("STALL_DURATION_USEC") >= 59_000)
                // One sample a millisecond asked for, two loops on two shared cores: a thread that
                // has not run since its last signal is not sent another (that sample goes
                // unanswered), but thousands are answered, each a chance to land inside the lock.
                let answered = ended.number("STALL_SAMPLES") - ended.number("STALL_SAMPLES_UNANSWERED")
                #expect(answered >= 2000, "\(answered) samples answered")
            }
        }

        /// The claim is one compare-and-swap over the request's generation and state: a handler of
        /// thread A that runs after A's request timed out (here made late on purpose, between its
        /// checks and its claim) never answers the next request, made for thread B.
        @Test func aLateHandlerNeverAnswersAnotherThreadsRequest() throws {
            let (signal, slot) = try claimSampler()
            defer { stallmon_sampler_slot_release(slot) }
            let first = SpinningThread(signal: signal)
            let second = SpinningThread(signal: signal)
            defer {
                first.finish()
                second.finish()
            }

            stallmon_sampler_set_test_delay(40_000_000)
            defer { stallmon_sampler_set_test_delay(0) }
            for _ in 0..<5 {
                var sample = stallmon_sample()
                stallmon_sample_thread(slot, first.threadID, signal, 64, 5_000_000, &sample)
                #expect(sample.status == Int32(STALLMON_SAMPLE_TIMEOUT.rawValue))
                stallmon_sample_thread(slot, second.threadID, signal, 64, 1_000_000_000, &sample)
                #expect(sample.status == Int32(STALLMON_SAMPLE_OK.rawValue))
                #expect(sample.sampled_tid == second.threadID, "thread \(first.threadID)'s handler answered")
                #expect(sample.frame_count > 2)
            }
        }

        /// Signals are counted per thread: a thread that has not taken its last signal gets no new
        /// one, however often the watchdog turns to another thread and back. (Reset per target,
        /// the count let one more real-time signal queue up on the blocked thread per visit.)
        @Test func aThreadThatBlocksTheSignalNeverHasMoreThanOneQueued() throws {
            let (signal, slot) = try claimSampler()
            defer { stallmon_sampler_slot_release(slot) }
            let blocked = BlockedThread(signal: signal)
            let answering = SpinningThread(signal: signal)
            defer {
                blocked.finish()
                answering.finish()
            }
            let before = try queuedSignals()
            var answered = 0
            for _ in 0..<1000 {
                var sample = stallmon_sample()
                stallmon_sample_thread(slot, blocked.threadID, signal, 16, 1_000_000, &sample)
                #expect(sample.status == Int32(STALLMON_SAMPLE_TIMEOUT.rawValue))
                stallmon_sample_thread(slot, answering.threadID, signal, 16, 1_000_000_000, &sample)
                if sample.status == Int32(STALLMON_SAMPLE_OK.rawValue) { answered += 1 }
            }
            let queued = try queuedSignals() - before
            #expect(queued <= 1, "\(queued) signals queued after 1,000 visits")
            #expect(answered == 1000)
        }

        /// A signal the thread no longer has pending (something else took it: here the thread
        /// itself, with sigtimedwait) is not waited for again: the kernel's SigPnd is asked before a
        /// thread is refused a new signal. (Taken as still pending, it kept the thread unsampled by
        /// that slot for good; a sanitizer that keeps one deferred signal per number did the same.)
        @Test func aSignalTakenByAnotherHandDoesNotSilenceTheThreadForGood() throws {
            let (signal, slot) = try claimSampler()
            defer { stallmon_sampler_slot_release(slot) }
            let thread = SignalTakingThread(signal: signal)
            defer { thread.finish() }

            var sample = stallmon_sample()
            stallmon_sample_thread(slot, thread.threadID, signal, 64, 20_000_000, &sample)
            #expect(sample.status == Int32(STALLMON_SAMPLE_TIMEOUT.rawValue))
            #expect(thread.takeThePendingSignalAndRun() == signal, "the signal was not pending")

            var answered = 0
            for _ in 0..<20 {
                stallmon_sample_thread(slot, thread.threadID, signal, 64, 1_000_000_000, &sample)
                if sample.status == Int32(STALLMON_SAMPLE_OK.rawValue) && sample.sampled_tid == thread.threadID {
                    answered += 1
                }
            }
            #expect(answered == 20, "\(answered) of 20 samples answered after the signal was taken elsewhere")
        }

        /// The handler runs on the thread's alternate signal stack where it has one, and the two
        /// sampling signals (a real-time one for loops, SIGPROF for the pool) block each other while
        /// it runs, so that one handler never nests inside the other.
        @Test func theSamplingSignalsRunOnTheAlternateStackAndBlockEachOther() throws {
            let signal = stallmon_sigrtmax() - 4
            #expect(stallmon_sampler_install(signal) == 0)
            #expect(stallmon_sampler_install(SIGPROF) == 0)
            for (installed, other) in [(signal, SIGPROF), (SIGPROF, signal)] {
                var action = sigaction()
                #expect(sigaction(installed, nil, &action) == 0)
                #expect(action.sa_flags & Int32(SA_ONSTACK) != 0)
                #expect(sigismember(&action.sa_mask, other) == 1)
            }
        }

        /// The unwinder's module table comes from /proc/self/maps and the ELF headers mapped there,
        /// not from dl_iterate_phdr: it lists this process's images with unwind tables.
        @Test func theModuleTableIsReadFromProcSelfMaps() {
            // The test binary, libc, libswiftCore, Foundation, libdispatch and the vDSO at least.
            #expect(stallmon_module_count() >= 6)
        }

        /// The monitor's own threads block every asynchronous signal: a program that blocks SIGTERM
        /// after start() and waits for it with sigwait gets it there and shuts down cleanly. (A
        /// watchdog that left it unblocked took it, and the default action killed the process.)
        @Test func aProgramThatWaitsForSIGTERMGetsItWithTheMonitorRunning() throws {
            let run = try FixtureRun.run("sigwait-term", timeout: 20)
            #expect(run.exitStatus == 0)
            #expect(run.lines.contains { $0["type"] as? String == "sigwait" && $0.number("signal") == Double(SIGTERM) })
            #expect(run.lines.contains { $0["type"] as? String == "stop" })
            let ended = try #require(run.ended.first)
            #expect(ended.frames.contains { $0["function"] as? String == "Stalls.burnCPU(milliseconds:)" })
        }

        /// A real-time signal the program blocks to read it itself (sigwaitinfo, signalfd) keeps its
        /// SIG_DFL disposition and looks free: the monitor must take another, and never unblock it.
        @Test func aSignalTheProgramBlocksToReadItselfIsNeverTaken() throws {
            let run = try FixtureRun.run("sigwaitinfo-rt", timeout: 20)
            #expect(run.exitStatus == 0)
            let read = try #require(run.lines.first { $0["type"] as? String == "sigwaitinfo" })
            #expect(read.number("signal") == Double(stallmon_sigrtmax() - 4), "the program's signal was lost")
            let ended = try #require(run.ended.first)
            #expect(ended.frames.contains { $0["function"] as? String == "Stalls.burnCPU(milliseconds:)" })
        }
    }
}

/// The sampling handler installed on SIGRTMAX-4, and a sampler slot the caller releases.
private func claimSampler() throws -> (signal: Int32, slot: Int32) {
    let signal = stallmon_sigrtmax() - 4
    #expect(stallmon_sampler_install(signal) == 0)
    let slot = stallmon_sampler_slot_claim()
    try #require(slot >= 0)
    return (signal, slot)
}

/// Signals queued for this process's user (`SigQ` of /proc/self/status).
private func queuedSignals() throws -> Int {
    let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
    let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("SigQ:") })
    return try #require(
        Int(line.dropFirst("SigQ:".count).split(separator: "/")[0].trimmingCharacters(in: .whitespaces)))
}

/// A thread that burns CPU with `signal` unblocked until finished.
final class SpinningThread: @unchecked Sendable {
    private let ready = DispatchSemaphore(value: 0)
    private let done = Atomic<Bool>(false)
    private var tid: pid_t = 0

    init(signal: Int32) {
        let thread = Thread { [self] in
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            pthread_sigmask(SIG_UNBLOCK, &set, nil)
            tid = stallmon_gettid()
            ready.signal()
            var hash: UInt64 = 0
            while !done.load(ordering: .relaxed) { hash = (hash ^ 1) &* 0x100_0000_01b3 }
            if hash == 42 { print("") }
        }
        thread.start()
        ready.wait()
    }

    var threadID: pid_t { tid }

    func finish() { done.store(true, ordering: .relaxed) }
}

/// A thread that blocks `signal`, then on request takes the one pending for it with sigtimedwait
/// (so no handler runs), unblocks it and spins until finished.
final class SignalTakingThread: @unchecked Sendable {
    private let ready = DispatchSemaphore(value: 0)
    private let take = DispatchSemaphore(value: 0)
    private let taken = DispatchSemaphore(value: 0)
    private let done = Atomic<Bool>(false)
    private var tid: pid_t = 0
    private var takenSignal: Int32 = 0

    init(signal: Int32) {
        let thread = Thread { [self] in
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            pthread_sigmask(SIG_BLOCK, &set, nil)
            tid = stallmon_gettid()
            ready.signal()
            take.wait()
            var timeout = timespec()
            timeout.tv_sec = 1
            takenSignal = sigtimedwait(&set, nil, &timeout)
            pthread_sigmask(SIG_UNBLOCK, &set, nil)
            taken.signal()
            var hash: UInt64 = 0
            while !done.load(ordering: .relaxed) { hash = (hash ^ 1) &* 0x100_0000_01b3 }
            if hash == 42 { print("") }
        }
        thread.start()
        ready.wait()
    }

    var threadID: pid_t { tid }

    /// The signal sigtimedwait took (-1 when none was pending within a second).
    func takeThePendingSignalAndRun() -> Int32 {
        take.signal()
        taken.wait()
        return takenSignal
    }

    func finish() {
        take.signal()
        done.store(true, ordering: .relaxed)
    }
}

/// A thread that parks in a system call with `signal` blocked or unblocked (threads of the test
/// runner's pool start with real-time signals blocked).
final class BlockedThread: @unchecked Sendable {
    private let ready = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private var tid: pid_t = 0

    init(signal: Int32, blocks: Bool = true) {
        let thread = Thread { [self] in
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            pthread_sigmask(blocks ? SIG_BLOCK : SIG_UNBLOCK, &set, nil)
            tid = stallmon_gettid()
            ready.signal()
            done.wait()
        }
        thread.start()
        ready.wait()
    }

    var threadID: pid_t { tid }

    func finish() { done.signal() }
}
