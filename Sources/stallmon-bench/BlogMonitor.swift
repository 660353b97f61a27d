import CoreFoundation
import Dispatch
import Foundation
import Synchronization

/// The run-loop stall monitor of the well-known blog design, written literally as a reference: a
/// Swift-block observer on every activity records it and signals a semaphore; a thread waits on
/// the semaphore with a 10 ms timeout and, on each wakeup, checks whether the loop has been in
/// before-sources or after-waiting for longer than the threshold.
final class BlogMonitor: Sendable {
    private let threshold: UInt64
    private let semaphore = DispatchSemaphore(value: 0)
    private let activity = Atomic<UInt>(0)
    private let activityTime = Atomic<UInt64>(0)
    private let reportedTime = Atomic<UInt64>(0)
    private let thread = Atomic<Int32>(0)
    /// Stalls the thread noticed.
    let stalls = Atomic<Int>(0)

    init(threshold: Duration) {
        let (seconds, attoseconds) = threshold.components
        self.threshold = UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// The watching thread's kernel id (0 until it runs).
    var threadID: Int32 { thread.load(ordering: .acquiring) }

    func start(on runLoop: CFRunLoop) {
        let observer = CFRunLoopObserverCreateWithHandler(
            kCFAllocatorDefault, CFRunLoopActivity.allActivities.rawValue, true, 0
        ) { [self] _, activity in
            self.activity.store(activity.rawValue, ordering: .relaxed)
            activityTime.store(Kernel.now(), ordering: .releasing)
            semaphore.signal()
        }
        CFRunLoopAddObserver(runLoop, observer, kCFRunLoopCommonModes)
        let watcher = Thread { [self] in
            thread.store(Kernel.currentThreadID(), ordering: .releasing)
            watch()
        }
        watcher.name = "blog-monitor"
        watcher.start()
    }

    private func watch() {
        while true {
            _ = semaphore.wait(timeout: .now() + .milliseconds(10))
            let since = activityTime.load(ordering: .acquiring)
            let current = activity.load(ordering: .relaxed)
            let inWindow =
                current == CFRunLoopActivity.beforeSources.rawValue
                || current == CFRunLoopActivity.afterWaiting.rawValue
            let now = Kernel.now()
            if inWindow, now > since + threshold, reportedTime.load(ordering: .relaxed) != since {
                reportedTime.store(since, ordering: .relaxed)
                stalls.add(1, ordering: .relaxed)
            }
        }
    }
}
