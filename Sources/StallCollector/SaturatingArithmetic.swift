// Counts that stop at their maximum: hostile or absurd journal values must never trap.

extension UInt64 {
    /// `self + other`, or `.max` where that overflows: hostile or absurd journal values must never trap.
    func saturatingAdd(_ other: UInt64) -> UInt64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }
}

extension Int {
    /// `self + other` for a non-negative `other`, or `.max` where that overflows.
    func saturatingAdd(_ other: Int) -> Int {
        let (sum, overflow) = addingReportingOverflow(Swift.max(other, 0))
        return overflow ? .max : sum
    }
}

extension Int {
    /// Adds a non-negative amount, stopping at `.max`.
    mutating func saturatingIncrease(by amount: Int) { self = saturatingAdd(amount) }
}
