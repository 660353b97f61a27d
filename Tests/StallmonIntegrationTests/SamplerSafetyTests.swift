import CStallCapture
import Foundation
import StallmonTestSupport
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
            let run = try FixtureRun.run("churn", timeout: 20)
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
            let run = try FixtureRun.run("thread-loop-blocked")
            #expect(run.exitStatus == 0)
            let detected = try #require(run.detected.first)
            let ended = try #require(run.ended.first)
            #expect(detected.string("MESSAGE").contains("no stack: thread blocks SIGRTMAX-4"))
            #expect(ended.number("STALL_SAMPLES_UNANSWERED") == ended.number("STALL_SAMPLES"))
            #expect(ended.string("STALL_BACKTRACE").contains("no stack"))
            #expect(abs(ended.milliseconds("STALL_DURATION_USEC") - (run.truth("thread-loop-blocked") ?? 0)) <= 15)
        }

        @Test func sampleRequestToAThreadThatNeverAnswersTimesOut() throws {
            let signal = stallmon_sigrtmax() - 4
            #expect(stallmon_sampler_install(signal) == 0)
            let slot = stallmon_sampler_slot_claim()
            try #require(slot >= 0)
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
