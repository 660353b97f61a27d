#if STALLMON_LINUX
/// Where one watched thread is, whatever kind of loop it runs: the one phase machine of every
/// backend. A thread is idle in its wait, or runs a work item (a run loop's window, an event loop's
/// cycle, a pool job) that is timed from its start and becomes a stall at the threshold, sampled
/// until it ends.
enum WatchPhase {
    /// Not looked at yet, or its state could not be read: looked at again a threshold after `since`.
    case unknown(since: UInt64)
    /// Idle in its wait (or outside its loop): nothing of it can stall until it wakes.
    case idle
    /// In the work item numbered `sequence` (as its backend numbers them), counted from `start`.
    case timing(start: UInt64, sequence: UInt64)
    /// Past the threshold, sampled until the work item ends.
    case stalled(StallInProgress)

    /// The stall in progress, if any.
    var stall: StallInProgress? {
        if case .stalled(let stall) = self { return stall }
        return nil
    }

    /// The phase once the process resumed from a stop at `now`: a work item being timed, or a
    /// thread not yet looked at, counts from then, or it would be reported stalled for the time
    /// nothing ran. A stall already sampled keeps its start: its report includes the stop.
    func resumed(at now: UInt64) -> WatchPhase {
        switch self {
        case .unknown: return .unknown(since: now)
        case .timing(let start, let sequence): return .timing(start: max(start, now), sequence: sequence)
        case .idle, .stalled: return self
        }
    }
}
#endif  // STALLMON_LINUX
