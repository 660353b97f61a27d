#if STALLMON_LINUX
import Synchronization

/// What the process's watchdogs tell the one that pings the service manager (`WATCHDOG=1`, the
/// run-loop or main-actor watchdog): which of their loops are wedged, and since when. Under
/// `WatchdogSec=`, the pings go out only while every loop the process's monitors watch makes
/// progress, so systemd's watchdog vouches for the event loops and the cooperative pool too, not
/// just for the main actor.
///
/// A loop counts as wedged once it has been stalled for half the watchdog interval; the pool once
/// all of its threads are held. The watchdog that sees the wedge writes its final report before
/// systemd's deadline, which it reads here from the pinger's latest ping.
package final class ServiceHealth: Sendable {
    package static let shared = ServiceHealth()

    private struct State {
        /// The start of each voter's oldest wedge in progress.
        var wedges: [ObjectIdentifier: UInt64] = [:]
        /// When the pinger last pinged, and its interval (`WatchdogSec=`).
        var lastPing: UInt64?
        var interval: UInt64?
        /// How to wake each pinger as soon as the last wedge ends, so that its held-back ping goes out.
        var pingers: [ObjectIdentifier: @Sendable () -> Void] = [:]
    }

    private let state = Mutex(State())

    /// `voter` has a loop wedged since `since` (CLOCK_MONOTONIC), or none (`nil`).
    package func vote(_ voter: AnyObject, wedgedSince since: UInt64?) {
        let wake = state.withLock { state -> [@Sendable () -> Void] in
            let key = ObjectIdentifier(voter)
            let ended = since == nil && state.wedges[key] != nil
            state.wedges[key] = since
            return ended && state.wedges.isEmpty ? Array(state.pingers.values) : []
        }
        for pinger in wake { pinger() }
    }

    /// Has `wake` called whenever the last wedge in progress ends, until ``removePinger(_:)``.
    func addPinger(_ pinger: AnyObject, wake: @escaping @Sendable () -> Void) {
        state.withLock { $0.pingers[ObjectIdentifier(pinger)] = wake }
    }

    func removePinger(_ pinger: AnyObject) {
        state.withLock { _ = $0.pingers.removeValue(forKey: ObjectIdentifier(pinger)) }
    }

    /// The start of the oldest wedge in progress among all voters, if any.
    package var oldestWedge: UInt64? {
        state.withLock { $0.wedges.values.min() }
    }

    /// Whether no loop has been wedged for `limit` or longer at `now`.
    package func isHealthy(now: UInt64, limit: UInt64) -> Bool {
        guard let oldest = oldestWedge else { return true }
        return now < oldest || now - oldest < limit
    }

    /// The pinger's record of a ping sent at `now` under `interval`.
    func notePing(at now: UInt64, interval: UInt64) {
        state.withLock {
            $0.lastPing = now
            $0.interval = interval
        }
    }

    /// When a wedged loop's final report is due, and systemd's deadline for the next ping; `nil`
    /// when no monitor of the process pings a service watchdog.
    package var finalReport: (due: UInt64, deadline: UInt64, interval: UInt64)? {
        state.withLock { state in
            guard let lastPing = state.lastPing, let interval = state.interval else { return nil }
            let schedule = ServiceWatchdogSchedule(interval: interval, now: lastPing)
            return (schedule.finalReportTime, schedule.deadline, interval)
        }
    }
}
#endif  // STALLMON_LINUX
