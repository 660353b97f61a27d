#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation

/// The watchdog thread of one monitor, of whatever kind of loop: waits until something could have
/// stalled, begins a stall, samples it, ends it and reports it. The steps are the ``StallEngine``'s;
/// the one part that differs per kind of loop, how it learns what its loops do and waits for them,
/// is the ``WatchdogBackend``'s.
final class Watchdog: @unchecked Sendable {
    let engine: StallEngine
    let backend: any WatchdogBackend
    private let finished = DispatchSemaphore(value: 0)

    init(_ backend: some WatchdogBackend) {
        self.backend = backend
        self.engine = backend.engine
    }

    /// The watchdog thread's kernel id (0 until it runs).
    var threadID: pid_t { engine.threadID }
    /// Stalls detected (reported or not).
    var stalls: Int { engine.stalls }
    /// Times the watchdog thread woke up, for measurements (the backends that count them).
    var wakeups: Int { engine.wakeups }

    /// Starts the thread and returns once it runs, so that ``threadID`` is known.
    func start() {
        backend.willStart()
        Self.startThread(named: backend.threadName) { [self] in
            engine.noteThreadStarted()
        } body: { [self] in
            engine.stops.runQueue.open()
            backend.run()
            engine.stops.runQueue.close()
            finished.signal()
        }
    }

    /// Stops the thread and waits for it; a stall in progress gets its ended report.
    func stop() {
        engine.beginStopping()
        backend.wakeForStop()
        finished.wait()
        backend.didStop()
    }

    /// Starts a watchdog thread and returns once it runs: `started` has run on it, and the kernel
    /// knows its name.
    private static func startThread(
        named name: String, started: @escaping @Sendable () -> Void, body: @escaping @Sendable () -> Void
    ) {
        let running = DispatchSemaphore(value: 0)
        let thread = Thread {
            started()
            // Thread.name set before the start does not reach the kernel on Linux.
            stallmon_set_thread_name(name)
            running.signal()
            stallmon_set_timer_slack(1)
            body()
        }
        thread.name = name
        thread.stackSize = 512 * 1024
        thread.start()
        running.wait()
    }
}
#endif  // STALLMON_LINUX
