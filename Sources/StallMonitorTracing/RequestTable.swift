#if STALLMON_LINUX
import CStallCapture
#endif

/// The monitor's table of requests in flight (CStallCapture's `stallmon_request_*`): where a span
/// says which task or thread serves it. Elsewhere than on Linux there is no monitor to tell: spans
/// register nowhere.
enum RequestTable {
    /// Registers `state` under the calling task (or thread): the slot, or -1. The table keeps no
    /// reference: `state` withdraws before it is freed.
    static func register(_ state: RequestState) -> Int32 {
        #if STALLMON_LINUX
        stallmon_request_register(
            stallmon_request_current_key(), Unmanaged.passUnretained(state).toOpaque(), state.depth)
        #else
        -1
        #endif
    }

    /// Withdraws the registration in `slot`.
    static func withdraw(_ slot: Int32) {
        #if STALLMON_LINUX
        stallmon_request_withdraw(slot)
        #endif
    }

    /// The innermost span the calling task serves now: the parent of a span it starts. Outside a
    /// task, none: a span registered under a thread (an event loop's) covers all the loop runs
    /// until it ends, other connections' work too, and is no parent of theirs.
    static func current() -> RequestState? {
        #if STALLMON_LINUX
        guard stallmon_request_used() != 0 else { return nil }
        var key = stallmon_request_current_key()
        guard key & 1 == 0 else { return nil }
        guard let record = stallmon_request_acquire(&key, 1) else { return nil }
        return Unmanaged<RequestState>.fromOpaque(record).takeRetainedValue()
        #else
        return nil
        #endif
    }

    /// When the pool thread `threadID` ended the job it ran at `start` that the monitor watched as
    /// a stall, if it has.
    static func poolJobEnd(threadID: Int, start: UInt64) -> UInt64? {
        #if STALLMON_LINUX
        let end = stallmon_pool_stall_end_of_thread(pid_t(threadID), start)
        return end == 0 ? nil : end
        #else
        return nil
        #endif
    }

    static func random() -> UInt64 {
        #if STALLMON_LINUX
        stallmon_request_random()
        #else
        UInt64.random(in: .min ... .max)
        #endif
    }
}
