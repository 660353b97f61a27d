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
    package static func symbolicate(_ stacks: [(stack: [UInt], count: Int)], symbolicator: Symbolicator)
        -> [SampledStack]
    {
        stacks.enumerated()
            .sorted { ($0.element.count, $1.offset) > ($1.element.count, $0.offset) }
            .map { SampledStack(frames: symbolicator.symbolicate($0.element.stack), count: $0.element.count) }
            .filter { !$0.frames.isEmpty }
    }

    /// The stack seen most often, counting stacks that share their frames from the culprit on
    /// (the fingerprint) as one: a thread busy inside one function of the program is one stack,
    /// whatever library code it happened to be in at each sample. Its frames, the samples of its
    /// group, and the index in `stacks` of the stack shown. A linked monitor's reporter and
    /// stallmond's look from outside both rank their samples with it.
    package static func heaviest(
        _ stacks: [(stack: [UInt], count: Int)], symbolicator: Symbolicator
    ) -> (frames: [StallFrame], samples: Int, index: Int?) {
        var groups: [String: (total: Int, best: [StallFrame], bestCount: Int, order: Int, bestIndex: Int)] = [:]
        for (order, entry) in stacks.enumerated() {
            let frames = symbolicator.symbolicate(entry.stack)
            let key = StallReport.fingerprint(of: frames)
            if var group = groups[key] {
                group.total += entry.count
                if entry.count > group.bestCount {
                    (group.best, group.bestCount, group.bestIndex) = (frames, entry.count, order)
                }
                groups[key] = group
            } else {
                groups[key] = (entry.count, frames, entry.count, order, order)
            }
        }
        guard
            let heaviest = groups.values.max(by: {
                $0.total < $1.total || ($0.total == $1.total && $0.order > $1.order)
            })
        else {
            return ([], 0, nil)
        }
        return (heaviest.best, heaviest.total, heaviest.bestIndex)
    }
    #endif
}

extension SampledStacks {
    /// `STALL_STACKS` for a report's stacks, referring to the lines of `backtrace` (as written,
    /// clamped) where it can.
    package init(_ stacks: [SampledStack], backtrace: String) {
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
