#if STALLMON_LINUX
import StallJournal

/// A window, cycle or job past the threshold while the watchdog samples it, of any kind of loop.
final class StallInProgress {
    let stallID = CapturedStall.newStallID()
    /// Where the stall counts from.
    let start: UInt64
    /// The window, cycle or job the stall is, as its backend numbers them.
    let sequence: UInt64
    /// Inside the startup grace period, or under a debugger: sampled, but not reported.
    let suppressed: Bool
    let activity: StallReport.Activity
    /// The run loop's mode (`none` for other loops).
    let runLoopMode: String
    /// The stalled thread, where it is not its reporter's own (a cooperative-pool thread).
    let threadID: Int?
    var nextSample: UInt64
    /// Whether the report before the service manager's watchdog kill went out.
    var finalReportWritten = false
    /// What the samples saw.
    var samples: StallSamples

    init(
        start: UInt64, sequence: UInt64, suppressed: Bool, nextSample: UInt64, capacity: Int,
        activity: StallReport.Activity, runLoopMode: String = "none", threadID: Int? = nil
    ) {
        self.start = start
        self.sequence = sequence
        self.suppressed = suppressed
        self.nextSample = nextSample
        self.activity = activity
        self.runLoopMode = runLoopMode
        self.threadID = threadID
        self.samples = StallSamples(capacity: capacity)
    }

    deinit { samples.endSampling() }
}
#endif  // STALLMON_LINUX
