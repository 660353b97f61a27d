#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation

/// The watchdog thread of one monitor, of whatever kind of loop: it runs the ``StallEngine``'s watch
/// loop, which waits until something could have stalled, begins a stall, samples it, ends it and
/// reports it; what differs per kind of loop, how it learns what its loops do and waits for them,
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
            engine.run(backend)
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
        let spawned = spawnMonitorThread(named: name, stackSize: 512 * 1024) {
            started()
            running.signal()
            stallmon_set_timer_slack(1)
            body()
        }
        precondition(spawned, "stallmon: cannot start the watchdog thread \(name)")
        running.wait()
    }
}
#endif  // STALLMON_LINUX

#if STALLMON_LINUX
/// Starts one of the monitor's own threads, named `name`, with every asynchronous signal blocked
/// from its first instruction (`stallmon_thread_spawn`): a signal sent to the process (SIGTERM that
/// the program waits for with `sigwait`, SIGINT, SIGHUP) then always goes to one of the program's
/// threads, as it would without the monitor. Nothing of the caller's mask changes. Returns false
/// when no thread could be made.
@discardableResult
func spawnMonitorThread(named name: String, stackSize: Int, _ body: @escaping @Sendable () -> Void) -> Bool {
    final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
    let context = Unmanaged.passRetained(Body(body)).toOpaque()
    let rc = stallmon_thread_spawn(
        name, stackSize,
        { context in
            let body = Unmanaged<Body>.fromOpaque(context!).takeRetainedValue()
            body.run()
        }, context)
    if rc != 0 { Unmanaged<Body>.fromOpaque(context).release() }
    return rc == 0
}
#endif  // STALLMON_LINUX
