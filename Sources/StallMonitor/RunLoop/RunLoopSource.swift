#if STALLMON_LINUX
import CoreFoundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A CFRunLoop as a ``SampledThread``: a thread's own run loop, or the main run loop an async main
/// runs. Its samples tell it idle by the run loop's wait function, once the monitor knows where that
/// lies, and otherwise by the wait call the thread is in and the mode its loop runs.
final class RunLoopSource: SampledThread, @unchecked Sendable {
    let threadID: pid_t
    let runLoop: CFRunLoop
    private let idleWaitRange = Mutex<Range<UInt>?>(nil)
    /// One of the monitor's observers: the modes it is in are the modes the monitor sees.
    private let observer = Mutex<ObserverReference?>(nil)

    struct ObserverReference: @unchecked Sendable {
        let observer: CFRunLoopObserver
    }

    init(threadID: pid_t, runLoop: CFRunLoop) {
        self.threadID = threadID
        self.runLoop = runLoop
    }

    /// The address range of the run loop's own wait for events; samples inside it are idle.
    func setIdleWaitRange(_ range: Range<UInt>?) {
        idleWaitRange.withLock { $0 = range }
    }

    /// One of the monitor's observers, for telling the modes it sees from those it does not.
    func setObserver(_ observer: CFRunLoopObserver) {
        self.observer.withLock { $0 = ObserverReference(observer: observer) }
    }

    func idleTest() -> IdleTest {
        if let function = idleWaitRange.withLock({ $0 }) { return .waitFunction(function) }
        return .waitCall { [self] syscall in isIdleInUnobservedMode(syscall: syscall) }
    }

    /// The mode the run loop runs now, as reports name it.
    func currentMode() -> String {
        guard let mode = CFRunLoopCopyCurrentMode(runLoop) else { return "none" }
        return RunLoopModes.string(mode)
    }

    /// The system calls a run loop waits for events in (CoreFoundation's is ppoll on its epoll
    /// descriptor; others may wait in epoll directly).
    private static let loopWaitCalls: Set<String> = ["ppoll", "poll", "epoll_wait", "epoll_pwait", "epoll_pwait2"]

    /// Idle without CoreFoundation's symbols (before they are loaded, or where they are stripped),
    /// and without a signal: the thread waits in a run loop's wait call while its loop runs a mode
    /// the observers are not in. In a mode they are in, the loop waits only after before-waiting,
    /// outside any window, so a wait seen inside a window there is a callout's own.
    private func isIdleInUnobservedMode(syscall: String?) -> Bool {
        guard let syscall, Self.loopWaitCalls.contains(syscall),
            let observer = observer.withLock({ $0 }),
            let mode = CFRunLoopCopyCurrentMode(runLoop)
        else { return false }
        return !CFRunLoopContainsObserver(runLoop, observer.observer, mode)
    }
}
#endif  // STALLMON_LINUX
