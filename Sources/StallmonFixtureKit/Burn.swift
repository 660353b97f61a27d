/// Keeps the calling thread busy on the CPU (FNV hashing) for a span of wall time: the one burn the
/// fixtures and the tests share.
///
/// - Important: Not for a stall whose report a test reads for the function that stalled: a frame
///   of this module would stand on top of the stack. Those stalls keep a function of their own,
///   named after what they stand for (`Stalls.burnCPU(milliseconds:)`, `stallOnCPU(milliseconds:)`).
package enum Burn {
    /// Burns the CPU until `milliseconds` of CLOCK_MONOTONIC have passed, however much CPU it got.
    @inline(never)
    package static func cpu(milliseconds: Double) {
        // The clock is read in the vDSO, cheaply: every round, so that a burn ends on time (the
        // real-time hogs of the crowded-machine tests take the CPUs for exact slices).
        let end = Fixture.now() + UInt64(max(0, milliseconds) * 1e6)
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        var byte: UInt64 = 0
        while Fixture.now() < end {
            hash = (hash ^ byte) &* 0x100_0000_01b3
            byte &+= 1
        }
        if hash == 42 { print("") }
    }
}
