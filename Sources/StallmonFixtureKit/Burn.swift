/// Keeps the calling thread busy on the CPU (FNV hashing): the one burn the fixtures and the tests
/// share.
///
/// - Important: Not for a stall whose report a test reads for the function that stalled: a frame
///   of this module would stand on top of the stack. Those stalls keep a function of their own,
///   named after what they stand for (`Stalls.burnCPU(milliseconds:)`, `stallOnCPU(milliseconds:)`).
public enum Burn {
    /// Which time a burn counts.
    public enum Clock: Sendable {
        /// CLOCK_MONOTONIC: the burn ends `milliseconds` after it began, however much CPU it got.
        case wall
        /// The calling thread's CPU time: on a busy machine, or when the process is stopped, the
        /// burn lasts longer than that.
        case threadCPU
    }

    /// Burns the CPU for `milliseconds` of `clock`.
    @inline(never)
    public static func cpu(milliseconds: Double, clock: Clock = .wall) {
        func read() -> UInt64 { clock == .wall ? Fixture.now() : Fixture.threadCPU() }
        // The wall clock is read in the vDSO, cheaply: every round, so that a burn ends on time (the
        // real-time hogs of the crowded-machine tests take the CPUs for exact slices). The thread's
        // CPU clock is a system call: every 4096 rounds, or a sampler would mostly find the thread
        // in the kernel.
        let rounds: UInt64 = clock == .wall ? 1 : 4096
        let end = read() + UInt64(max(0, milliseconds) * 1e6)
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while read() < end {
            for byte in 0..<rounds { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        if hash == 42 { print("") }
    }
}
