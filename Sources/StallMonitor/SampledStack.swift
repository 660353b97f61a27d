import StallJournal

/// One distinct stack seen during a stall, and how many samples showed it.
public struct SampledStack: Sendable, Hashable {
    /// Innermost first, inline frames included.
    public var frames: [StallFrame]
    public var count: Int

    public init(frames: [StallFrame], count: Int) {
        self.frames = frames
        self.count = count
    }

    /// Symbolicates the captured stacks (the symbolicator caches per address, so the stacks the
    /// reporter ranked cost nothing more), heaviest first.
    static func symbolicate(_ stacks: [(stack: [UInt], count: Int)], symbolicator: Symbolicator) -> [SampledStack] {
        stacks.enumerated()
            .sorted { ($0.element.count, $1.offset) > ($1.element.count, $0.offset) }
            .map { SampledStack(frames: symbolicator.symbolicate($0.element.stack), count: $0.element.count) }
            .filter { !$0.frames.isEmpty }
    }
}

extension SampledStacks {
    /// `STALL_STACKS` for a report's stacks, referring to the lines of `backtrace` (as written,
    /// clamped) where it can.
    init(_ stacks: [SampledStack], backtrace: String) {
        self.init(
            stacks: stacks.map { (frames: $0.frames.map(\.backtraceLine), count: $0.count) },
            backtraceLines: SampledStacks.backtraceFrames(backtrace))
    }
}
