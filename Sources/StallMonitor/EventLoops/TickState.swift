#if STALLMON_LINUX
import CStallCapture

/// One event loop's tick state (`stallcapture_ticks.h`): the ticks and heartbeats its thread
/// counts, read by the watchdog without a lock.
package struct TickState: @unchecked Sendable {
    package let pointer: OpaquePointer

    /// Tick state for one loop thread; bind it there with `stallmon_ticks_bind`.
    package static func make() -> TickState? {
        stallmon_ticks_create().map(TickState.init)
    }

    /// Has the loop thread bound to it count its tick durations; call it before binding the
    /// thread. Returns false when the histogram cannot be allocated.
    package func enableLatency() -> Bool {
        stallmon_ticks_enable_latency(pointer) == 0
    }
}
#endif  // STALLMON_LINUX
