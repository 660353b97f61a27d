// `package`: the collector, the CLI and the fixture read durations the same way.
extension Duration {
    /// The whole nanoseconds of a duration that is known to fit (all durations stallmon handles do).
    package var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    package var microseconds: Int64 { nanoseconds / 1_000 }
    package var milliseconds: Int64 { nanoseconds / 1_000_000 }

    /// Seconds, with the fraction.
    package var totalSeconds: Double { Double(nanoseconds) / 1e9 }

    /// `12 ms`, `0.5 ms`, `-3 ms`.
    var formattedMilliseconds: String {
        let nanoseconds = self.nanoseconds
        if nanoseconds % 1_000_000 == 0 { return "\(nanoseconds / 1_000_000) ms" }
        let value = Double(nanoseconds) / 1_000_000
        return "\((value * 1000).rounded() / 1000) ms"
    }

    static func nanoseconds(_ value: UInt64) -> Duration { .nanoseconds(Int64(clamping: value)) }
}
