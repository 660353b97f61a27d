#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// The monitor's health, kept for `STATUS=`: stalls that ended in the last hour and the one in
/// progress. Updated on the reporting thread, read from anywhere without waiting for it.
final class StatusBoard: Sendable {
    private struct Stalls {
        var recent: [(end: UInt64, duration: UInt64)] = []
        var inProgress: UInt64?
        /// Until the loop is seen to turn, it is not called healthy.
        var seenTurning: Bool
        /// Whether a status went to the service manager (then the first turn sends a fresh one).
        var sent = false
    }

    private let stalls: Mutex<Stalls>
    private let loopName: String

    init(loopName: String, seenTurning: Bool) {
        self.loopName = loopName
        self.stalls = Mutex(Stalls(seenTurning: seenTurning))
    }

    /// Records the loop's first transition; returns whether a status already went out, which
    /// said the loop was not seen running and is out of date now.
    func noteFirstTurn() -> Bool {
        stalls.withLock { stalls in
            stalls.seenTurning = true
            return stalls.sent
        }
    }

    func noteSent() {
        stalls.withLock { $0.sent = true }
    }

    func record(_ stall: CapturedStall) {
        stalls.withLock { stalls in
            switch stall.event {
            case .detected: stalls.inProgress = stall.startNanoseconds
            case .ended:
                stalls.inProgress = nil
                let end = stall.startNanoseconds + stall.duration
                stalls.recent.append((end, stall.duration))
                stalls.recent.removeAll { end > $0.end && end - $0.end > 3_600_000_000_000 }
                if stalls.recent.count > 1_000 { stalls.recent.removeFirst(stalls.recent.count - 1_000) }
            case .watchdog: break
            }
        }
    }

    /// `main loop healthy; 3 stalls in 1h, worst 540 ms`, `main loop stalled for 1200 ms`
    /// (counting the last 1000 stalls at most), or `main loop not seen running yet` before its
    /// first transition.
    func line() -> String {
        stalls.withLock { stalls in
            let now = MonotonicClock.now()
            stalls.recent.removeAll { now - $0.end > 3_600_000_000_000 }
            let loop = loopName == "main" ? "main loop" : "loop of \(loopName)"
            guard stalls.seenTurning else { return "\(loop) not seen running yet" }
            if let start = stalls.inProgress {
                return "\(loop) stalled for \((now - start) / 1_000_000) ms"
            }
            guard let worst = stalls.recent.map(\.duration).max() else { return "\(loop) healthy; no stalls in 1h" }
            let count = stalls.recent.count
            return "\(loop) healthy; \(count) stall\(count == 1 ? "" : "s") in 1h, worst \(worst / 1_000_000) ms"
        }
    }
}
#endif  // STALLMON_LINUX
