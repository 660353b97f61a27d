#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// The thread that runs every reporter's work, in the order it was queued, and their timers (the
/// rate limiter's flushes, the symbolicator's trim). One long-lived thread of its own rather than
/// libdispatch workers: reports are built on one thread, so their allocations come from one malloc
/// arena instead of one per worker that a burst happens to wake. With nothing queued and no timer
/// set, it waits without a timeout: no wakeups while idle.
final class ReportingThread: Sendable {
    static let shared = ReportingThread()

    /// The thread's name, in the kernel (at most 15 bytes).
    static let threadName = "stallmon-report"

    private struct ScheduledJob {
        var deadline: UInt64
        var job: @Sendable () -> Void
    }

    private struct State {
        var jobs: [@Sendable () -> Void] = []
        /// Ordered by deadline, the earliest first; equal deadlines in the order they were set.
        var timers: [ScheduledJob] = []
        /// Whether the thread waits (or is about to) for `wake`.
        var waiting = false
    }

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)

    private init() {
        let spawned = spawnMonitorThread(named: Self.threadName, stackSize: 1024 * 1024) { [self] in run() }
        precondition(spawned, "stallmon: cannot start the reporting thread")
    }

    /// Runs `job` on the thread after the jobs queued before it.
    func async(_ job: @escaping @Sendable () -> Void) {
        let signal = state.withLock { state in
            state.jobs.append(job)
            return Self.takeWaiter(&state)
        }
        if signal { wake.signal() }
    }

    /// Runs `job` on the thread and returns once it ran, or once the monotonic clock reaches
    /// `deadline` (the job still runs in its turn); returns whether it ran. Never call it from the
    /// thread itself.
    @discardableResult
    func sync(waitingUntil deadline: UInt64, _ job: @escaping @Sendable () -> Void) -> Bool {
        let done = DispatchSemaphore(value: 0)
        async {
            job()
            done.signal()
        }
        let now = MonotonicClock.now()
        let left = deadline > now ? deadline - now : 0
        return done.wait(timeout: .now() + .nanoseconds(Int(clamping: left))) == .success
    }

    /// Runs `job` on the thread once `nanoseconds` have passed.
    func after(nanoseconds: UInt64, _ job: @escaping @Sendable () -> Void) {
        let deadline = MonotonicClock.now() + nanoseconds
        let signal = state.withLock { state in
            let index = state.timers.firstIndex { $0.deadline > deadline } ?? state.timers.endIndex
            state.timers.insert(ScheduledJob(deadline: deadline, job: job), at: index)
            // A new earliest deadline shortens the thread's wait.
            return index == 0 && Self.takeWaiter(&state)
        }
        if signal { wake.signal() }
    }

    /// Whether the caller must signal `wake` (once: it clears `waiting`).
    private static func takeWaiter(_ state: inout State) -> Bool {
        guard state.waiting else { return false }
        state.waiting = false
        return true
    }

    private func run() {
        while true {
            let now = MonotonicClock.now()
            let (jobs, wait) = state.withLock { state -> ([@Sendable () -> Void], UInt64?) in
                var jobs = state.jobs
                state.jobs = []
                let due = state.timers.prefix { $0.deadline <= now }.count
                jobs += state.timers.prefix(due).map(\.job)
                state.timers.removeFirst(due)
                state.waiting = jobs.isEmpty
                return (jobs, state.timers.first?.deadline)
            }
            guard jobs.isEmpty else {
                for job in jobs { job() }
                continue
            }
            if let wait {
                _ = wake.wait(timeout: .now() + .nanoseconds(Int(clamping: wait - min(wait, now))))
            } else {
                wake.wait()
            }
        }
    }
}
#endif  // STALLMON_LINUX
