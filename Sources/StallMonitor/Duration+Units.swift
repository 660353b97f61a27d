extension Duration {
    /// The whole nanoseconds of a duration that is known to fit (all durations stallmon handles do).
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    var microseconds: Int64 { nanoseconds / 1_000 }
    var milliseconds: Int64 { nanoseconds / 1_000_000 }

    /// `12 ms`, `0.5 ms`, `-3 ms`.
    var formattedMilliseconds: String {
        let nanoseconds = self.nanoseconds
        if nanoseconds % 1_000_000 == 0 { return "\(nanoseconds / 1_000_000) ms" }
        let value = Double(nanoseconds) / 1_000_000
        return "\((value * 1000).rounded() / 1000) ms"
    }

    static func nanoseconds(_ value: UInt64) -> Duration { .nanoseconds(Int64(clamping: value)) }
}
