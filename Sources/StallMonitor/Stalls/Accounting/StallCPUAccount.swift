#if STALLMON_LINUX
import CStallCapture
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// One reading of the monitored thread's clocks at a `CLOCK_MONOTONIC` time.
struct CPUReading: Sendable, Equatable {
    var time: UInt64
    /// The thread's CPU clock: the kernel's exact `sum_exec_runtime`, not 100 Hz ticks.
    var cpu: UInt64
    /// Time on a CPU plus time waiting for one (`schedstat`): it moves at the pace of the wall
    /// clock while the thread is runnable, however busy the machine, and stands still while the
    /// thread sleeps or is stopped. `nil` when the kernel does not say.
    var runnable: UInt64?

    /// The CPU clock at `time`, between two readings, assuming an even pace in between.
    static func interpolate(_ lower: CPUReading, _ upper: CPUReading, at time: UInt64) -> UInt64 {
        guard upper.time > lower.time, upper.cpu > lower.cpu else { return min(lower.cpu, upper.cpu) }
        let clamped = min(max(time, lower.time), upper.time)
        let fraction = Double(clamped - lower.time) / Double(upper.time - lower.time)
        return lower.cpu + UInt64(fraction * Double(upper.cpu - lower.cpu))
    }
}

/// Reads a thread's clocks: `clock_gettime` on its CPU clock and one `pread` of its
/// `/proc/self/task/<tid>/schedstat`, kept open.
final class ThreadClocks: @unchecked Sendable {
    private let threadID: pid_t
    private let descriptor: Int32

    init(threadID: pid_t) {
        self.threadID = threadID
        descriptor = stallmon_thread_file_open(threadID, "schedstat")
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    /// `nil` when the thread is gone.
    func read() -> CPUReading? {
        let cpu = stallmon_thread_cpu_ns(threadID)
        guard cpu >= 0 else { return nil }
        return CPUReading(
            time: MonotonicClock.now(), cpu: UInt64(cpu), runnable: runQueueWait().map { UInt64(cpu) + $0 })
    }

    /// The second field of schedstat: nanoseconds runnable but not running.
    private func runQueueWait() -> UInt64? { RunQueueClock.runQueueWait(schedstat: descriptor) }
}

/// The CPU time and the pauses of one stall, from readings of the thread's CPU clock that the
/// watchdog takes when it looks anyway: before the window (while the loop slept, or in an earlier
/// window), when it first sees the window, at every sample and when the window ends.
///
/// The CPU clock is exact; what a reading cannot tell is the clock at the window's start and end,
/// which fall between readings. Where the loop slept right up to the start (or from the end on),
/// the reading taken while it slept is the clock there; otherwise it comes from the nearest
/// readings: interpolated from one close before the start, or carried back from the first one
/// inside the stall at the pace the thread kept in it. The figure of a detected report is the CPU from the
/// start to the detection, that of the ended report from the start to the end, so the ended one
/// is never the smaller.
struct StallCPUAccount {
    let windowStart: UInt64
    /// The thread's CPU clock at the window's start.
    let cpuAtStart: UInt64
    /// The first reading inside the window, the latest one and the two before it.
    private let earliest: CPUReading
    private(set) var latest: CPUReading
    private var previous: CPUReading?
    private var older: CPUReading?
    /// Stopped time found so far, and the part of it found between `older` and `previous`.
    private(set) var paused: UInt64 = 0
    private var pausedInPreviousSpan: UInt64 = 0

    /// - Parameters:
    ///   - before: The latest reading from before the window, if any.
    ///   - sleptUntilStart: Whether the loop slept from `before` until the window began.
    ///   - after: Readings from inside the window, oldest first (at least one).
    init(windowStart: UInt64, before: CPUReading?, sleptUntilStart: Bool, after: [CPUReading]) {
        self.windowStart = windowStart
        let readings = ([before].compactMap { $0 } + after).sorted { $0.time < $1.time }
        let lower = readings.last { $0.time <= windowStart }
        let upper = readings.first { $0.time >= windowStart }
        let next = upper.flatMap { upper in readings.first { $0.time > upper.time } }
        if let lower, sleptUntilStart, lower == before {
            cpuAtStart = lower.cpu
        } else if let lower, let upper, windowStart - lower.time <= upper.time - windowStart {
            // A reading close before the start: the clock moved little since.
            cpuAtStart = CPUReading.interpolate(lower, upper, at: windowStart)
        } else if let upper, let next, next.time - upper.time >= min(upper.time - windowStart, 10_000_000) {
            // Back from the first reading inside the window at the pace the thread kept inside
            // it (what it did long before the window says little about the window), and never
            // before the reading from before it.
            let pace = min(1, Double(next.cpu - min(next.cpu, upper.cpu)) / Double(next.time - upper.time))
            let back = UInt64(pace * Double(upper.time - windowStart))
            cpuAtStart = max(upper.cpu - min(upper.cpu, back), min(lower?.cpu ?? 0, upper.cpu))
        } else if let lower, let upper {
            cpuAtStart = CPUReading.interpolate(lower, upper, at: windowStart)
        } else {
            cpuAtStart = (upper ?? lower ?? after.last!).cpu
        }
        earliest = after.first { $0.time >= windowStart } ?? after.last!
        latest = after.last!
        previous = after.count > 1 ? after[after.count - 2] : nil
    }

    /// Adds a reading. `stopped`: the process was stopped since the previous one (a SIGCONT came,
    /// or the watchdog woke `late` for a stop); the stop then goes into ``paused``.
    mutating func record(_ reading: CPUReading, stopped: Bool = false, late: UInt64 = 0) {
        guard reading.time >= latest.time else { return }
        older = previous
        previous = latest
        latest = reading
        let added = stopped ? stop(late: late) : 0
        paused += added
        pausedInPreviousSpan = added
    }

    /// CPU used from the window's start to `end` (at most the latest reading). `sleptSinceEnd`:
    /// the loop went to sleep at `end` and still slept at the latest reading. Otherwise the clock
    /// at `end` goes on from the reading before it at the pace of the stall so far (the loop's
    /// work after the stall may be lighter), and never past the latest reading.
    func used(until end: UInt64, sleptSinceEnd: Bool = false) -> UInt64 {
        var cpu = latest.cpu
        if !sleptSinceEnd, end < latest.time, let previous {
            if end <= previous.time {
                cpu = previous.cpu
            } else {
                let ran = previous.time > windowStart + paused ? previous.time - windowStart - paused : 0
                let pace = ran > 0 ? min(1, Double(previous.cpu - min(previous.cpu, cpuAtStart)) / Double(ran)) : 1
                cpu = min(latest.cpu, previous.cpu + UInt64(pace * Double(end - previous.time)))
            }
        }
        return cpu > cpuAtStart ? cpu - cpuAtStart : 0
    }

    /// How long the process was stopped between the previous reading and the latest one, taken
    /// after a stop; `late` is how late the watchdog woke for it (the part of the stop after its
    /// wakeup was due; 0 for a stop during a sample).
    ///
    /// The stop began somewhere after the previous reading. A thread that stays runnable (on a
    /// CPU or waiting for one) keeps its runnable time moving at the pace of the wall clock until
    /// it is stopped, however busy the machine: at the pace it kept during the stall so far, the
    /// runnable time between the readings says how long it was not stopped. The span looked at
    /// reaches back one reading further: the SIGCONT handler may run only after the watchdog took
    /// its next reading, and the stop is then noticed one reading late. A thread that mostly
    /// sleeps tells nothing; then the lateness is the estimate.
    private func stop(late: UInt64) -> UInt64 {
        guard let previous else { return late }
        let base = older ?? previous
        let counted = older != nil ? pausedInPreviousSpan : 0
        guard latest.time > base.time, base.time >= earliest.time else { return late }
        let span = latest.time - base.time
        let pausedBefore = paused - counted
        let before = base.time - earliest.time
        guard before > pausedBefore else { return late }
        let observed = Double(before - pausedBefore)
        let pace: Double
        let moved: Double
        if let start = earliest.runnable, let middle = base.runnable, let end = latest.runnable, middle >= start,
            end >= middle
        {
            pace = min(1, Double(middle - start) / observed)
            moved = Double(end - middle)
        } else {
            pace = min(1, Double(base.cpu - min(base.cpu, earliest.cpu)) / observed)
            moved = Double(latest.cpu - min(latest.cpu, base.cpu))
        }
        guard pace >= 0.5 else { return late }
        // The thread's own clock is the measure, not the watchdog's lateness: a watchdog that woke
        // late while the thread kept running (both waited for a CPU that real-time threads held,
        // or the watchdog slept in the kernel on its own work) saw no stop of the process.
        let stopped = UInt64(max(0, Double(span) - moved / pace))
        return min(span - min(counted, span), stopped > counted ? stopped - counted : 0)
    }
}
#endif  // STALLMON_LINUX
