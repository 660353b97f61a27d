#if STALLMON_LINUX
import CStallCapture
import Glibc
import StallJournal

/// Tells for a watchdog thread whether the process was stopped (SIGSTOP and SIGCONT, a debugger)
/// while it waited, sampled or worked, as against the watchdog merely waiting for a CPU: a stopped
/// thread is not on a run queue, so the watchdog's own run-queue time is lateness that is no stop.
/// No handler of SIGCONT is installed: one would end a system call of whichever thread ran it with
/// EINTR as the process continued.
///
/// Used on the watchdog thread only; open ``runQueue`` there.
final class StopDetector {
    /// The watchdog thread's run-queue time.
    let runQueue = RunQueueClock()
    /// Lateness beyond which a wakeup or a sample shows a stop: half the threshold, within 5…25 ms.
    let pauseTolerance: UInt64
    private let sampleTimeout: UInt64
    /// When the latest wait ended, with the watchdog's run-queue and CPU time then.
    private var wake: (time: UInt64, queued: UInt64?, cpu: UInt64) = (0, nil, 0)
    /// Time the watchdog thread waited for a CPU during its latest wait: lateness that is no stop of
    /// the process.
    private(set) var lastWaitQueued: UInt64 = 0
    /// How far the wall clock stepped back during the latest wait. A timed wait on a
    /// `DispatchSemaphore` ends at a CLOCK_REALTIME deadline (libdispatch waits with
    /// `sem_timedwait` on Linux), so a step back of the wall clock (NTP, `date`, a VM's clock
    /// resync) makes it late by the step: lateness that is no stop either.
    private(set) var lastWaitClockStep: UInt64 = 0
    /// CLOCK_REALTIME less CLOCK_MONOTONIC, in nanoseconds.
    private let wallClockOffset: () -> Int64

    init(
        threshold: UInt64, sampleTimeout: UInt64, wallClockOffset: @escaping () -> Int64 = StopDetector.wallClockOffset
    ) {
        pauseTolerance = max(5_000_000, min(threshold / 2, 25_000_000))
        self.sampleTimeout = sampleTimeout
        self.wallClockOffset = wallClockOffset
    }

    static func wallClockOffset() -> Int64 {
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        let monotonic = MonotonicClock.now()
        return (Int64(wall.tv_sec) &* 1_000_000_000 &+ Int64(wall.tv_nsec)) &- Int64(truncatingIfNeeded: monotonic)
    }

    /// Lateness of the latest wait that is no stop: its run-queue time and a step back of the wall clock.
    private var lastWaitExplained: UInt64 { lastWaitQueued &+ lastWaitClockStep }

    /// Whether the process was stopped since the latest wait ended: more time went by than the
    /// watchdog spent on a CPU and waiting for one, by more than the pause tolerance. (The work
    /// between two waits makes no system call that blocks for long.)
    func wasStoppedSinceWake() -> Bool {
        guard wake.time != 0 else { return false }
        let elapsed = MonotonicClock.now() &- wake.time
        let accounted = (Self.threadCPUTime() &- wake.cpu) &+ queued(since: wake.queued)
        return elapsed > accounted && elapsed - accounted > pauseTolerance
    }

    /// CPU time of the calling thread, in nanoseconds.
    private static func threadCPUTime() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    /// Runs a wait of the watchdog thread, noting how long of it the thread waited for a CPU and how
    /// far the wall clock stepped back meanwhile.
    func measuringWait(_ wait: () -> Void) {
        let queuedBefore = runQueue.waited()
        let offsetBefore = wallClockOffset()
        wait()
        lastWaitQueued = queued(since: queuedBefore)
        let offsetAfter = wallClockOffset()
        lastWaitClockStep = offsetBefore > offsetAfter ? UInt64(offsetBefore &- offsetAfter) : 0
        wake = (MonotonicClock.now(), runQueue.waited(), Self.threadCPUTime())
    }

    /// Whether the process was stopped while the watchdog slept: the wakeup came far later than
    /// asked for, and not because the watchdog waited for a CPU or the wall clock stepped back.
    func wasStopped(wokeAt woke: UInt64, deadline: UInt64) -> Bool {
        return woke > deadline && woke - deadline > pauseTolerance &+ lastWaitExplained
    }

    /// How late a wakeup was, less the time the watchdog spent waiting for a CPU and a step back of
    /// the wall clock (no stop).
    func lateness(wokeAt woke: UInt64, deadline: UInt64) -> UInt64 {
        woke > deadline ? (woke - deadline) - min(lastWaitExplained, woke - deadline) : 0
    }

    /// Whether `time` lies further back from `now` than a wakeup could be late without a stop.
    func isLate(_ now: UInt64, after time: UInt64) -> Bool {
        now > time && now - time > pauseTolerance &+ lastWaitExplained
    }

    /// When a sample began, to tell afterwards whether the process was stopped during it.
    struct SampleStart {
        fileprivate let time = MonotonicClock.now()
        fileprivate let queued: UInt64?
        /// How much longer than allowed the sample took (set by ``StopDetector/sampleWasStopped(_:)``).
        fileprivate(set) var lateness: UInt64 = 0

        fileprivate init(_ runQueue: RunQueueClock) {
            queued = runQueue.waited()
        }
    }

    func sampleStarts() -> SampleStart { SampleStart(runQueue) }

    /// Whether the process was stopped during a sample: the sample took longer than its timeout by
    /// more than the pause tolerance and the watchdog's wait for a CPU.
    func sampleWasStopped(_ start: inout SampleStart) -> Bool {
        let elapsed = MonotonicClock.now() - start.time
        let expected = sampleTimeout &+ queued(since: start.queued)
        start.lateness = elapsed > expected ? elapsed - expected : 0
        return start.lateness > pauseTolerance
    }

    /// Run-queue time of the watchdog thread since `start` (0 when either reading is missing).
    private func queued(since start: UInt64?) -> UInt64 {
        guard let start, let now = runQueue.waited(), now >= start else { return 0 }
        return now - start
    }
}
#endif  // STALLMON_LINUX
