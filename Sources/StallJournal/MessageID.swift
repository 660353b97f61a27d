/// The journal MESSAGE_IDs stallmon writes. They are how operators filter
/// (`journalctl MESSAGE_ID=…`) and how the catalog attaches help text: they never change.
public enum MessageID {
    /// A stall reached the threshold; carries the first stack.
    public static let stallDetected = "8da8468ee8f843a2994203fbc71ab06c"
    /// A stall ended; carries its true duration, the heaviest stack and the sample counts.
    public static let stallEnded = "28beac6e882f46aaa40f2556557097a6"
    /// Reports suppressed by rate limiting, with counts.
    public static let reportsSuppressed = "1332568df10e41a0927f220ff4dc212b"
    /// The monitor started (with its configuration) or stopped.
    public static let monitorLifecycle = "d73ddae2d6c44436813f07f52018475b"

    /// A stall that outlasted the service's `WatchdogSec=`: written with the current backtrace just
    /// before systemd kills the service, so the journal says why it died.
    public static let watchdogStall = "6111fbc730f244c8897baf9d136e610c"
    /// stallmond's periodic digest of the stalls it collected.
    public static let collectorDigest = "7836eefd2ec44eddb4acc5b97a7da338"

    /// Every stall report identifier, for readers that follow all of them.
    public static let stallReports = [stallDetected, stallEnded, watchdogStall]
}
