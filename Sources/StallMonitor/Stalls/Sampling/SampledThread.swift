#if STALLMON_LINUX
#if canImport(Glibc)
import Glibc
#endif

/// A thread the sampler samples, as the backend that watches it supplies it: its kernel id, and how
/// a sample of it tells its loop idle rather than stalled. The run loop (``RunLoopSource``, also the
/// main queue an async main drains), SwiftNIO's event loops (``WatchedEventLoop``) and the
/// cooperative pool's threads (``PoolThread``) are sampled alike: the sampling, the kernel view, the
/// stack aggregation and the report are the same for all of them.
protocol SampledThread {
    /// The kernel's id of the thread.
    var threadID: pid_t { get }
    /// How the sample about to be taken tells the loop idle; asked at every sample.
    func idleTest() -> IdleTest
}

/// How a sample tells that a loop waits for work in its own wait call, where the watchdog found it
/// inside a window: then the window is no stall (a run loop run in a mode its observers are not in).
enum IdleTest {
    /// Nothing a sample shows makes the loop idle: the watchdog saw it busy before it sampled.
    case never
    /// Idle when the stack's innermost frames lie in the loop's wait function (this address range).
    case waitFunction(Range<UInt>)
    /// Idle when this says so of the system call the thread is in (`nil`: none), where the wait
    /// function is unknown.
    case waitCall((String?) -> Bool)

    /// Whether a stack shows the thread in the loop's wait function.
    static func isInWait(_ addresses: [UInt], function: Range<UInt>) -> Bool {
        addresses.prefix(4).contains { function.contains($0) || function.contains($0 &- 1) }
    }
}
#endif  // STALLMON_LINUX
