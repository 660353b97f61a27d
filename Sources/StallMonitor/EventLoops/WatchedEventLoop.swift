#if STALLMON_LINUX
import CStallCapture

#if canImport(Glibc)
import Glibc
#endif

/// One event loop of a watched group, as its thread registered it.
package struct WatchedEventLoop: Sendable {
    package var threadID: pid_t
    package var name: String
    /// Hands the loop a heartbeat: a task, run on the loop between its work items, that calls
    /// `stallmon_ticks_beat` on the loop's tick state (SwiftNIO: `EventLoop.execute`). `nil` for
    /// a loop that only counts ticks through a delegate.
    package var beat: (@Sendable () -> Void)?

    package init(threadID: pid_t, name: String, beat: (@Sendable () -> Void)? = nil) {
        self.threadID = threadID
        self.name = name
        self.beat = beat
    }

    /// The calling thread, named as the kernel shows it (`NIO-ELT-0-#1` for SwiftNIO's loops).
    package static func current() -> Self {
        let threadID = stallmon_gettid()
        return Self(threadID: threadID, name: ThreadInspector(threadID: threadID).name() ?? "tid-\(threadID)")
    }
}

extension WatchedEventLoop: SampledThread {
    func idleTest() -> IdleTest { .never }
}
#endif  // STALLMON_LINUX
