#if STALLMON_LINUX
import CSystemd
#endif

/// Talks to the service manager through `$NOTIFY_SOCKET`. Without a socket every call does nothing,
/// as it does on every platform but Linux.
///
/// The corresponding C functions are `sd_notify` and `sd_watchdog_enabled` (`sd_notifyf` is
/// variadic and cannot be called from Swift; the state string is formatted in Swift instead).
enum ServiceNotifier {
    /// Sends newline-separated `KEY=value` assignments. Returns whether anything was sent.
    @discardableResult
    static func notify(_ state: String) -> Bool {
        #if STALLMON_LINUX
        sd_notify(0, state) > 0
        #else
        false
        #endif
    }

    /// The service's watchdog interval (`WatchdogSec=`, from `$WATCHDOG_USEC` when `$WATCHDOG_PID`
    /// is this process), or `nil` when the service manager expects no pings.
    static func watchdogInterval() -> UInt64? {
        #if STALLMON_LINUX
        var microseconds: UInt64 = 0
        guard sd_watchdog_enabled(0, &microseconds) > 0, microseconds > 0 else { return nil }
        return microseconds * 1_000
        #else
        nil
        #endif
    }
}

/// When and whether a monitor pings the service manager's watchdog: every half interval, and only
/// while the monitored loop makes progress, so a stuck loop gets the service killed (and restarted
/// with `Restart=on-watchdog`).
struct ServiceWatchdogSchedule {
    /// `WatchdogSec=` in nanoseconds.
    let interval: UInt64
    private(set) var lastPing: UInt64
    private(set) var nextPing: UInt64
    /// Whether a ping was held back for another watchdog's wedged loop.
    private var heldBack = false

    init(interval: UInt64, now: UInt64) {
        self.interval = interval
        self.lastPing = now
        self.nextPing = now
    }

    /// When systemd kills the service unless a ping comes first.
    var deadline: UInt64 { lastPing + interval }

    /// When the final stall report must be written: early enough to land before systemd's
    /// deadline, late enough that the stall has outlasted most of it.
    var finalReportTime: UInt64 {
        let margin = min(max(interval / 4, 100_000_000), 1_000_000_000)
        return deadline - min(margin, interval / 2)
    }

    /// Pings when one is due and the loop is healthy; an unhealthy loop leaves the ping overdue,
    /// so that it goes out the moment the loop recovers.
    mutating func pingIfDue(now: UInt64, healthy: Bool) {
        #if STALLMON_LINUX
        // Every loop of the process's monitors, not only this one: a loop wedged for half the
        // interval holds the pings back until it recovers (its watchdog then wakes this one),
        // looked at again in a twentieth of the interval meanwhile.
        let othersHealthy = ServiceHealth.shared.isHealthy(now: now, limit: interval / 2)
        guard now >= nextPing || (heldBack && othersHealthy), healthy else { return }
        guard othersHealthy else {
            heldBack = true
            nextPing = now + interval / 20
            return
        }
        heldBack = false
        #else
        guard now >= nextPing, healthy else { return }
        #endif
        ServiceNotifier.notify("WATCHDOG=1")
        lastPing = now
        nextPing = now + interval / 2
        #if STALLMON_LINUX
        ServiceHealth.shared.notePing(at: now, interval: interval)
        #endif
    }
}
