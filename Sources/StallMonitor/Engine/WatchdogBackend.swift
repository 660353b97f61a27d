#if STALLMON_LINUX
/// What one kind of loop supplies to the ``Watchdog``: how it learns that a loop or job is busy,
/// how it waits for the next thing due, and when a stall of its loops begins and ends. Everything
/// else, the thread, the stop detection, the samples, the suppression and the reports of a stall,
/// is the engine's (``StallEngine``), the same for every kind.
///
/// The backends: the run-loop ring, which also serves the async main's drains
/// (``RunLoopBackend``); the event loops of a group, by ticks or heartbeats (``EventLoopBackend``);
/// and Swift's cooperative pool (``CooperativePoolBackend``). As SwiftNIO's selector backends, each
/// lives in its own file, beside its loop kind.
protocol WatchdogBackend: AnyObject {
    /// The engine whose steps the backend drives; the watchdog thread owns it.
    var engine: StallEngine { get }
    /// The watchdog thread's name, in Foundation and in the kernel (at most 15 bytes).
    var threadName: String { get }
    /// Before the thread starts, on the caller's thread.
    func willStart()
    /// On the watchdog thread: waits and watches until ``StallEngine/isStopping``; a stall in
    /// progress then gets its ended report before it returns.
    func run()
    /// Wakes ``run()`` from its wait, once the engine is stopping.
    func wakeForStop()
    /// After the thread has ended, on the caller of ``Watchdog/stop()``.
    func didStop()
}

extension WatchdogBackend {
    func willStart() {}
}
#endif  // STALLMON_LINUX
