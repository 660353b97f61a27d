#if STALLMON_LINUX
import StallJournal

/// A stall as the watchdog saw it: raw addresses and kernel views, before symbolication.
struct CapturedStall: Sendable {
    var event: StallReport.Event
    var stallID: String
    var startNanoseconds: UInt64
    var duration: UInt64
    var paused: UInt64
    var activity: StallReport.Activity
    var runLoopMode: String
    var cpu: UInt64
    var samples: Int
    var unansweredSamples: Int
    /// Distinct stacks (innermost first) with the samples they were seen in: the first one for a
    /// detected report, all of them for an ended report.
    var stacks: [(stack: [UInt], count: Int)]
    /// How each of `stacks` was taken (same order).
    var stackSources: [StallReport.StackSource] = []
    var threadState: Character
    /// The system call and wait channel seen most often.
    var kernelView: KernelThreadView
    var noStackReason: String?
    /// CLOCK_MONOTONIC when the watchdog handed it over.
    var capturedNanoseconds: UInt64
    /// The service's `WatchdogSec=` in nanoseconds, for a watchdog report.
    var watchdogInterval: UInt64?
    /// The stalled thread, where it is not the reporter's own (a cooperative-pool thread).
    var threadID: Int? = nil
    /// The request the stalled work served, where a span was registered for it.
    var request: StallRequestHandle? = nil
}

extension CapturedStall {
    /// The report of a stall of any kind of loop, from what its samples saw.
    /// - Parameters:
    ///   - start: Where the window (or cycle) counts from.
    ///   - end: Its end, or now while it lasts.
    ///   - paused: How long the process was stopped in it: no part of the stall's duration.
    ///   - stacks: The stacks to report, with their sources: ``StallSamples/detectedStacks`` for a
    ///     detected report, all of them otherwise.
    ///   - cpu: The CPU time the thread used in a stall of the duration it is given; at most that
    ///     duration is reported.
    init(
        _ event: StallReport.Event, of stall: StallSamples, stallID: String, start: UInt64, end: UInt64,
        paused: UInt64 = 0, activity: StallReport.Activity, runLoopMode: String,
        stacks: (stacks: [(stack: [UInt], count: Int)], sources: [StallReport.StackSource]),
        cpu: (_ duration: UInt64) -> UInt64
    ) {
        let duration = end > start + paused ? end - start - paused : 0
        self.init(
            event: event, stallID: stallID, startNanoseconds: start, duration: duration, paused: paused,
            activity: activity, runLoopMode: runLoopMode, cpu: min(cpu(duration), duration),
            samples: stall.samples, unansweredSamples: stall.unanswered, stacks: stacks.stacks,
            stackSources: stacks.sources, threadState: stall.kernel.dominantState,
            kernelView: stall.kernel.dominantWait, noStackReason: stall.firstStack.isEmpty ? stall.noStackReason : nil,
            capturedNanoseconds: MonotonicClock.now()
        )
        request = stall.request
    }

    /// 128 random bits as 32 lowercase hex digits, like a journal MESSAGE_ID.
    static func newStallID() -> String {
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        return [high, low].map { value in
            let hex = String(value, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }.joined()
    }
}

extension StallSamples {
    /// Every stack seen, with its source: the stacks of an ended (or watchdog) report.
    var allStacks: (stacks: [(stack: [UInt], count: Int)], sources: [StallReport.StackSource]) {
        (stacks.all, stacks.sources)
    }
}
#endif  // STALLMON_LINUX
