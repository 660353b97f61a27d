#if STALLMON_LINUX
/// What one kind of loop supplies to the engine's watch loop (``StallEngine/run(_:)``): how it
/// learns what its threads do, how it waits and is woken, what idle means for its threads, and how
/// it names a stalled callout. The loop itself (look → wait → tell a stop → restart → look …,
/// and the ended reports at the stop) is the engine's; so are the steps a look takes for a
/// thread's stall, over one phase type per watched thread (``WatchPhase``): beginning it, sampling
/// it, its final report before a service-manager kill, its end, the suppression and the reports.
/// A backend's look decides which step is due. A fourth kind of loop is one more backend file.
///
/// The backends: the run-loop ring, which also serves the async main's drains
/// (``RunLoopBackend``); the event loops of a group, by ticks or heartbeats (``EventLoopBackend``);
/// and Swift's cooperative pool (``CooperativePoolBackend``). As SwiftNIO's selector backends, each
/// lives in its own file, beside its loop kind.
protocol WatchdogBackend: AnyObject {
    /// The engine that drives the backend; the watchdog thread owns it.
    var engine: StallEngine { get }
    /// The watchdog thread's name, in Foundation and in the kernel (at most 15 bytes).
    var threadName: String { get }
    /// Before the thread starts, on the caller's thread.
    func willStart()
    /// On the watchdog thread, after each wait: learns what each watched thread does at `now` and
    /// takes the engine's steps that are due (a stall begins, is sampled, gets its final report, or
    /// ends). Returns when it must look again; `nil` when nothing can stall until it is woken.
    func visit(now: UInt64) -> UInt64?
    /// Sleeps until `deadline` (CLOCK_MONOTONIC; `nil`: until woken), or less when a watched loop
    /// or ``wakeForStop()`` wakes it; returns at once for a deadline already past.
    func wait(until deadline: UInt64?)
    /// The engine found that the process was stopped (SIGSTOP, a debugger) during the latest wait,
    /// and moved ``StallEngine/resumedAt`` to `now`: what the backend times counts from then.
    func restartAfterStop(now: UInt64)
    /// The watchdog is stopping: the stalls in progress end at `end` and get their reports.
    func finishStalls(end: UInt64)
    /// Wakes ``wait(until:)``, once the engine is stopping.
    func wakeForStop()
    /// After the thread has ended, on the caller of ``Watchdog/stop()``.
    func didStop()
}

extension WatchdogBackend {
    func willStart() {}
    func restartAfterStop(now: UInt64) {}
}
#endif  // STALLMON_LINUX
