#if STALLMON_LINUX
import CStallCapture
import Foundation
import StallJournal

/// The ``WatchdogBackend`` of Swift's cooperative pool, whose jobs are timed by the trampoline of
/// `stallmon_pool_install` (`stallcapture_pool.h`): every stall goes to one reporter, with the pool
/// thread it held.
///
/// A job stamps its start into its thread's slot and clears it at its end, so the watchdog knows,
/// for every thread, whether a job runs and since when:
/// - It sleeps until the earliest deadline (a running job's start + threshold), or parks, without
///   a timeout, while no job runs; the first job to start wakes it (a job start checks one flag
///   and, only while the watchdog is parked, makes one system call). A pool whose jobs ran since
///   the previous look but none runs now is busy with short jobs: the watchdog looks again in
///   half a threshold rather than park, so that the next job start does not pay for a wakeup
///   (a job that starts meanwhile has its deadline after that look).
/// - A job still running at its deadline is a stall: sampled like a stalled loop (a thread in a
///   system call is unwound from the kernel's view, never signalled) until the job ends; its
///   thread records the exact end of that one job.
/// A pool busy with short jobs costs one or two wakeups per threshold; an idle pool none.
///
/// On those wakeups the watchdog also sweeps the table of open spans (`stallmon_request_sweep`)
/// as it parks, and at most once a second while the pool is busy: once no task's span is open, the
/// pool hook's work for every job enqueued is one load until the next one starts. A sweep is one
/// load while the hook's sign is clear; while it is set, a pass over the table that stops at the
/// first open span (a whole pass, 9–30 µs, when the last has ended).
final class CooperativePoolBackend: WatchdogBackend {
    let engine: StallEngine
    private let reporter: Reporter
    /// The pool thread in each slot of `stallcapture_pool.h`, once seen.
    private var threads: [PoolThread?] = []
    /// Each slot's job count at the previous look, and whether any had changed at the latest.
    private var sequences: [UInt64] = []
    private var ranJobs = false
    /// The untimed job priority the latest queue probe was sent for.
    private var probedPriority: UInt32 = 0
    /// When the watchdog last swept the table of open spans.
    private var sweptAt: UInt64 = 0
    /// The longest a busy pool goes between sweeps.
    static let sweepInterval: UInt64 = 1_000_000_000

    /// The watchdog thread's name.
    static let threadName = "stallmon-pool"
    /// `STALL_LOOP` of the cooperative pool's stalls.
    static let loopName = MonitorDescription.cooperativePoolLoop
    var threadName: String { Self.threadName }

    init(engine: StallEngine, reporter: Reporter) {
        self.engine = engine
        self.reporter = reporter
    }

    private var threshold: UInt64 { engine.threshold }

    /// Looks at every pool thread; while no job runs, parks: the first job to start wakes the
    /// watchdog.
    func visit(now: UInt64) -> UInt64? {
        var earliest = visitThreads(now: now)
        if earliest == nil, ranJobs {
            // Busy with short jobs: look again in half a threshold rather than park, so that the
            // next job start does not pay for a wakeup.
            earliest = MonotonicClock.now() + threshold / 2
        }
        sweepSpans(parking: earliest == nil)
        if let earliest { return earliest }
        let parked = stallmon_pool_park()
        // Read every slot again after announcing the park: a job that started before it is seen
        // here, one that starts after it wakes the watchdog (its wait clears the park).
        if let earliest = visitThreads(now: MonotonicClock.now()) {
            stallmon_pool_unpark()
            return earliest
        }
        // Parking is unsafe here: look once per threshold instead.
        return parked < 0 ? MonotonicClock.now() + threshold : nil
    }

    /// Waits for the pool's next job (a parked watchdog), or until `deadline`.
    func wait(until deadline: UInt64?) {
        guard let deadline else {
            _ = stallmon_pool_wait(UInt64.max)
            return
        }
        let now = MonotonicClock.now()
        if deadline > now { _ = stallmon_pool_wait(deadline - now) }
    }

    func finishStalls(end: UInt64) {
        stallmon_pool_unpark()
        for (index, thread) in threads.enumerated() {
            if let thread, let stall = thread.phase.stall { finishStall(index, thread, stall, end: end) }
        }
    }

    func wakeForStop() { stallmon_pool_wake() }

    /// Sweeps the table of open spans as the watchdog parks, or when the last sweep is a second old.
    private func sweepSpans(parking: Bool) {
        let now = MonotonicClock.now()
        guard parking || now &- sweptAt >= Self.sweepInterval else { return }
        sweptAt = now
        _ = stallmon_request_sweep()
    }

    func didStop() { ServiceHealth.shared.vote(self, wedgedSince: nil) }

    /// Handles what is due for every pool thread at `now`; returns the earliest time something is
    /// due next (`nil`: no job runs).
    private func visitThreads(now: UInt64) -> UInt64? {
        learnUnknownPriority()
        let count = Int(stallmon_pool_slot_count())
        if threads.count < count { threads += Array(repeating: nil, count: count - threads.count) }
        if sequences.count < count { sequences += Array(repeating: 0, count: count - sequences.count) }
        ranJobs = false
        var earliest: UInt64?
        for index in 0..<count {
            if let due = visit(index, now: now) { earliest = min(earliest ?? due, due) }
        }
        // Threads come, go and finish their jobs between stalls: the pool's vote follows them.
        voteOnHealth()
        return earliest
    }

    /// Handles what is due for the thread in slot `index`; returns when it is due next (`nil`: it
    /// runs no job).
    private func visit(_ index: Int, now: UInt64) -> UInt64? {
        var job = stallmon_pool_job()
        guard stallmon_pool_read(Int32(index), &job) == 1 else {
            // The thread is starting a job just now: look again shortly.
            return now + 1_000_000
        }
        if job.sequence != sequences[index] {
            sequences[index] = job.sequence
            ranJobs = true
        }
        guard let thread = thread(in: index, running: job, now: now) else { return nil }
        if let stall = thread.phase.stall {
            if let due = watchStall(index, thread, stall, job: job, now: now) { return due }
        }
        guard job.start_ns != 0 else {
            thread.phase = .idle
            return nil
        }
        if case .timing(_, let sequence) = thread.phase, sequence == job.sequence {
            // The same job as at the previous look.
        } else {
            thread.phase = .timing(start: job.start_ns, sequence: job.sequence)
            thread.cpuBase = (stallmon_thread_cpu_ns(job.tid), MonotonicClock.now())
        }
        // A job that began before a stop of the process counts from its end.
        let start = engine.countedStart(job.start_ns)
        let deadline = start + threshold
        guard now >= deadline else { return deadline }
        let stall = beginStall(index, thread, job: job, start: start, now: now)
        return stall.nextSample
    }

    /// The thread that runs `job` in slot `index`, learned anew when the slot's thread changed (the
    /// thread has exited, as libdispatch ends idle workers, and the slot may be another's).
    private func thread(in index: Int, running job: stallmon_pool_job, now: UInt64) -> PoolThread? {
        if let thread = threads[index], thread.threadID != job.tid {
            if let stall = thread.phase.stall { finishStall(index, thread, stall, end: now) }
            threads[index] = nil
        }
        if threads[index] == nil, job.tid != 0 {
            threads[index] = PoolThread(threadID: job.tid)
        }
        return threads[index]
    }

    /// A stalled thread's job: ended (then the thread is looked at afresh: `nil`), or sampled and
    /// due again at the returned time.
    private func watchStall(
        _ index: Int, _ thread: PoolThread, _ stall: StallInProgress, job: stallmon_pool_job, now: UInt64
    ) -> UInt64? {
        var end: UInt64 = 0
        if stallmon_pool_watched_end(Int32(index), stall.sequence, &end) == 1 {
            finishStall(index, thread, stall, end: end)
            return nil
        }
        if job.sequence != stall.sequence || job.start_ns == 0 {
            // It ended before it saw the watch, which was set just after it was detected.
            finishStall(index, thread, stall, end: now)
            return nil
        }
        engine.reportBeforeKillIfDue(stall, now: now, to: reporter, cpu: thread.cpu)
        engine.sampleIfDue(stall, of: thread, inspector: thread.inspector, now: now)
        return engine.nextLook(at: stall)
    }

    private func beginStall(_ index: Int, _ thread: PoolThread, job: stallmon_pool_job, start: UInt64, now: UInt64)
        -> StallInProgress
    {
        stallmon_pool_watch(Int32(index), job.sequence)
        let stall = engine.beginStall(
            start: start, sequence: job.sequence, now: now, activity: .poolJob, threadID: Int(thread.threadID))
        thread.phase = .stalled(stall)
        voteOnHealth()
        engine.sample(stall, of: thread, inspector: thread.inspector)
        engine.reportDetected(stall, to: reporter, cpu: thread.cpu)
        return stall
    }

    private func finishStall(_ index: Int, _ thread: PoolThread, _ stall: StallInProgress, end: UInt64) {
        stallmon_pool_watch(Int32(index), 0)
        engine.finishStall(stall, end: end, to: reporter, cpu: thread.cpu)
        thread.phase = .idle
        voteOnHealth()
    }

    /// A job whose priority's queue was not learned at start ran untimed: a probe task of that
    /// priority learns the queue from inside it (`stallmon_pool_learn_queue`), so that the next
    /// such jobs are timed. One probe per priority that shows up.
    private func learnUnknownPriority() {
        let latest = stallmon_pool_latest_unknown_priority()
        guard latest != 0, latest != probedPriority else { return }
        probedPriority = latest
        let priority = UInt8(truncatingIfNeeded: latest)
        guard stallmon_pool_knows_priority(UInt32(priority)) == 0 else { return }
        Task.detached(priority: TaskPriority(rawValue: priority)) { _ = stallmon_pool_learn_queue(UInt32(priority)) }
    }

    /// The cooperative pool's width: the runtime's global queues are as wide as the machine has CPUs.
    private static let width = max(1, ProcessInfo.processInfo.activeProcessorCount)

    /// Tells the process's pinger (``ServiceHealth``) whether the pool is wedged: once as many
    /// threads are held as the pool is wide (one per CPU), since the last of those was taken. Fewer
    /// held threads leave others to run the queued jobs, however few workers live just now.
    private func voteOnHealth() {
        let held = threads.compactMap { thread -> UInt64? in
            thread?.phase.stall?.start
        }.sorted()
        let since = held.count >= Self.width ? held[Self.width - 1] : nil
        ServiceHealth.shared.vote(self, wedgedSince: since)
    }
}

extension StallReport.Callout {
    /// A pool thread's callout: the job the trampoline runs, when its frame is on the stack.
    static func recognizePoolCallout(_ frames: [StallFrame]) -> Self {
        frames.contains { $0.symbol == "stallmon_pool_run_job" } ? .poolJob : .unknown
    }
}

/// One thread of the cooperative pool, as its slot shows it.
final class PoolThread: SampledThread {
    let threadID: pid_t
    let inspector: ThreadInspector
    var phase = WatchPhase.idle
    /// CPU time of the thread when its current job was first seen, and when it was read.
    var cpuBase: (cpu: Int64, time: UInt64) = (-1, 0)

    init(threadID: pid_t) {
        self.threadID = threadID
        self.inspector = ThreadInspector(threadID: threadID)
    }

    func idleTest() -> IdleTest { .never }

    /// The CPU time of a stall of its current job, from the share it used since the job was seen.
    func cpu(_ duration: UInt64) -> UInt64 { StallEngine.cpuShare(of: threadID, since: cpuBase)(duration) }
}
#endif  // STALLMON_LINUX
