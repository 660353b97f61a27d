#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// CLOCK_MONOTONIC: the one clock of stallmon's intervals and timestamps, for Swift code. The
/// monitor's C hot paths read the same clock inline (`stallmon_now_ns`), so readings of both compare.
package enum MonotonicClock {
    /// CLOCK_MONOTONIC in nanoseconds.
    ///
    /// The corresponding C function is `clock_gettime(CLOCK_MONOTONIC)`.
    package static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// CLOCK_MONOTONIC in microseconds, as systemd counts it (`MONOTONIC_USEC=`, journal timeouts).
    package static func microseconds() -> UInt64 { now() / 1000 }
}
