import StallJournal

/// One distinct stack seen during a stall, and how many samples showed it.
public struct SampledStack: Sendable, Hashable {
    /// Innermost first, inline frames included.
    public var frames: [StallFrame]
    public var count: Int

    package init(frames: [StallFrame], count: Int) {
        self.frames = frames
        self.count = count
    }

    #if STALLMON_LINUX
    /// Symbolicates the captured stacks (the symbolicator caches per address, so the stacks the
    /// reporter ranked cost nothing more), heaviest first.
    static func symbolicate(_ stacks: [(stack: [UInt], count: Int)], symbolicator: Symbolicator) -> [SampledStack] {
        stacks.enumerated()
            .sorted { ($0.element.count, $1.offset) > ($1.element.count, $0.offset) }
            .map { SampledStack(frames: symbolicator.symbolicate($0.element.stack), count: $0.element.count) }
            .filter { !$0.frames.isEmpty }
    }
    #endif
}

extension SampledStacks {
    /// `STALL_STACKS` for a report's stacks, referring to the lines of `backtrace` (as written,
    /// clamped) where it can.
    init(_ stacks: [SampledStack], backtrace: String) {
        self.init(
            stacks: stacks.map { stack in
                (
                    frames: stack.frames.map { Frame(line: $0.backtraceLine, definition: $0.stackDefinition) },
                    stack.count
                )
            },
            backtraceLines: SampledStacks.backtraceFrames(backtrace))
    }
}

extension StallFrame {
    /// The frame as `STALL_STACKS` defines it: `Service.refresh() at Service.swift:42` (the name
    /// cut to 200 bytes), or `0x7f3a… [libfoo.so]` without a symbol.
    var stackDefinition: String {
        guard let name = function ?? symbol else {
            return "0x" + String(address, radix: 16) + (image.map { " [\($0.lastPathComponent)]" } ?? "")
        }
        let shown = FieldLimits.clamp(name, toBytes: 200)
        return location.map { shown + " at " + $0 } ?? shown
    }
}
