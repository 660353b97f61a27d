#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// At most `burst` reports per fingerprint in each window of `interval`; the rest are counted.
struct RateLimiter {
    struct Window {
        var start: UInt64
        var admitted: Int
        var suppressed: Int
        var totalDuration: UInt64
        var worstDuration: UInt64
        var frame: String
    }

    struct Summary {
        var fingerprint: String
        var frame: String
        var suppressed: Int
        var totalDuration: UInt64
        var worstDuration: UInt64
    }

    let burst: Int
    let interval: UInt64
    private var windows: [String: Window] = [:]
    private static let maximumFingerprints = 1024

    init(burst: Int, interval: UInt64) {
        self.burst = burst
        self.interval = interval
    }

    mutating func admit(_ fingerprint: String, frame: String, now: UInt64) -> Bool {
        if var window = windows[fingerprint], now < window.start + interval {
            guard window.admitted < burst else { return false }
            window.admitted += 1
            windows[fingerprint] = window
            return true
        }
        if windows.count >= Self.maximumFingerprints {
            // Forget the quiet fingerprints first; their summaries are already out.
            windows = windows.filter { $0.value.suppressed > 0 && now < $0.value.start + interval }
        }
        windows[fingerprint] = Window(
            start: now, admitted: 1, suppressed: 0, totalDuration: 0, worstDuration: 0, frame: frame)
        return true
    }

    mutating func recordSuppressed(_ fingerprint: String, duration: UInt64) {
        guard var window = windows[fingerprint] else { return }
        window.suppressed += 1
        window.totalDuration += duration
        window.worstDuration = max(window.worstDuration, duration)
        windows[fingerprint] = window
    }

    /// When the earliest window with suppressed reports ends.
    var nextExpiry: UInt64? {
        windows.values.filter { $0.suppressed > 0 }.map { $0.start + interval }.min()
    }

    /// Summaries of windows that ended (or of all windows), which then start counting afresh.
    mutating func takeSummaries(now: UInt64, all: Bool) -> [Summary] {
        var summaries = [Summary]()
        for (fingerprint, window) in windows where window.suppressed > 0 && (all || now >= window.start + interval) {
            summaries.append(
                Summary(
                    fingerprint: fingerprint, frame: window.frame, suppressed: window.suppressed,
                    totalDuration: window.totalDuration, worstDuration: window.worstDuration
                )
            )
            var reset = window
            reset.suppressed = 0
            reset.totalDuration = 0
            reset.worstDuration = 0
            windows[fingerprint] = reset
        }
        return summaries.sorted { $0.fingerprint < $1.fingerprint }
    }
}
#endif  // STALLMON_LINUX
