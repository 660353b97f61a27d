#if STALLMON_LINUX
/// The CPU time and the stopped time of one stall: the thread's ``StallCPUAccount``, kept from
/// readings of its clocks after every wait and every sample, so that each stop falls between two
/// readings (right after a sample, the thread has just run, and its runnable time is up to date).
struct StallTimeAccount {
    private var account: StallCPUAccount?
    /// Stops found while the thread's clocks could not be read.
    private var pausedOutsideAccount: UInt64 = 0
    /// How long the process was stopped in the stall so far.
    private(set) var paused: UInt64 = 0
    /// Whether the loop slept from the end of the stall through the latest reading.
    var sleptSinceEnd = false

    /// - Parameters:
    ///   - before: The latest reading from before the window, if any.
    ///   - sleptUntilStart: Whether the loop slept from `before` until the window began.
    ///   - after: Readings from inside the window, oldest first (none: no CPU time is known).
    init(windowStart: UInt64, before: CPUReading?, sleptUntilStart: Bool, after: [CPUReading]) {
        account =
            after.isEmpty
            ? nil
            : StallCPUAccount(windowStart: windowStart, before: before, sleptUntilStart: sleptUntilStart, after: after)
    }

    /// Reads the thread's clocks; `stopped`: the process was stopped since the previous reading,
    /// the watchdog woke `late` for it (0 for a stop during a sample), and the stop counts in
    /// ``paused``.
    mutating func record(_ clocks: ThreadClocks, stopped: Bool, late: UInt64 = 0) {
        if var account, let reading = clocks.read() {
            account.record(reading, stopped: stopped, late: late)
            self.account = account
            paused = pausedOutsideAccount + account.paused
        } else if stopped {
            pausedOutsideAccount += late
            paused = pausedOutsideAccount + (account?.paused ?? 0)
        }
    }

    /// Reads the thread's clocks after the stall ended.
    /// - Returns: The latest reading of the account, if it has one.
    mutating func recordAfterEnd(_ clocks: ThreadClocks) -> CPUReading? {
        if let reading = clocks.read() { account?.record(reading) }
        return account?.latest
    }

    /// CPU the thread used from the window's start to `end`.
    func used(until end: UInt64) -> UInt64 {
        account?.used(until: end, sleptSinceEnd: sleptSinceEnd) ?? 0
    }
}
#endif  // STALLMON_LINUX
