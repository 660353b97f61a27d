#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// The process's one symbolicator: libdw is not thread-safe, and its caches are worth sharing
/// between monitors. A second after its last use, the pages of the image files it read (symbol
/// tables, DWARF: several megabytes) leave the resident set until the next report.
final class SharedSymbolicator: Sendable {
    static let shared = SharedSymbolicator()

    private struct State: @unchecked Sendable {
        var symbolicator: Symbolicator?
        var lastUse: UInt64 = 0
        var trimScheduled = false
    }

    private let state = Mutex(State())
    private static let idleBeforeTrim: UInt64 = 1_000_000_000

    func withSymbolicator<Result: Sendable>(_ body: (Symbolicator) -> Result) -> Result {
        state.withLock { state in
            let symbolicator = state.symbolicator ?? Symbolicator()
            state.symbolicator = symbolicator
            defer {
                state.lastUse = MonotonicClock.now()
                scheduleTrim(&state, after: Self.idleBeforeTrim)
            }
            return body(symbolicator)
        }
    }

    /// Called with the lock held.
    private func scheduleTrim(_ state: inout State, after delay: UInt64) {
        guard !state.trimScheduled else { return }
        state.trimScheduled = true
        ReportingThread.shared.after(nanoseconds: delay) {
            self.state.withLock { state in
                state.trimScheduled = false
                let idle = MonotonicClock.now() - state.lastUse
                if idle >= Self.idleBeforeTrim {
                    state.symbolicator?.trim()
                } else {
                    self.scheduleTrim(&state, after: Self.idleBeforeTrim - idle)
                }
            }
        }
    }
}
#endif  // STALLMON_LINUX
