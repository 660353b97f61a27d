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

    /// Every stall report identifier, for readers that follow all of them.
    public static let stallReports = [stallDetected, stallEnded]
}
