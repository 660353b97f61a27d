import CoreFoundation
import Dispatch
import Foundation

/// A thread of its own that runs `setUp` (which starts a monitor with `.currentThread`), then its
/// run loop until ``stop()``; or, with `turning: false`, just waits without running it.
package final class LoopThread: @unchecked Sendable {
    private var runLoop: CFRunLoop?
    private let started = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let release = DispatchSemaphore(value: 0)
    private let turning: Bool

    package init(turning: Bool = true, setUp: @escaping @Sendable () -> Void) {
        self.turning = turning
        let thread = Thread { [self] in
            runLoop = CFRunLoopGetCurrent()
            setUp()
            if turning {
                // A timer keeps the loop running; CFRunLoopStop ends it. `started` is signalled from
                // inside the running loop: CFRunLoopStop does nothing to a loop that is not running
                // yet, so a stop() that came before CFRunLoopRun would be lost.
                let timer = Timer(timeInterval: 3600, repeats: true) { _ in }
                RunLoop.current.add(timer, forMode: .default)
                CFRunLoopPerformBlock(runLoop, kCFRunLoopCommonModes) { [started] in started.signal() }
                CFRunLoopRun()
                timer.invalidate()
            } else {
                started.signal()
                release.wait()
            }
            finished.signal()
        }
        thread.name = "stallmon-test-loop"
        thread.start()
        started.wait()
    }

    /// Runs `block` in the loop's next pass.
    package func perform(_ block: @escaping @Sendable () -> Void) {
        CFRunLoopPerformBlock(runLoop, kCFRunLoopCommonModes, block)
        CFRunLoopWakeUp(runLoop)
    }

    package func stop() {
        if turning {
            CFRunLoopStop(runLoop)
            CFRunLoopWakeUp(runLoop)
        } else {
            release.signal()
        }
        finished.wait()
    }
}
