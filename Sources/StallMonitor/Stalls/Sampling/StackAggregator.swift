#if STALLMON_LINUX
/// Counts the stacks seen during one stall. Stacks are keyed by their return addresses (frames
/// 1…), so a thread busy in one function counts as one stack wherever its program counter is; the
/// reporter merges further, by symbolicated frames.
struct StackAggregator {
    private var entries: [[UInt]: (stack: [UInt], count: Int, order: Int)] = [:]
    /// Samples per stack and per way it was taken.
    private var sourceCounts: [[UInt]: [StallReport.StackSource: Int]] = [:]
    private let capacity: Int
    private(set) var overflow = 0

    init(capacity: Int) {
        self.capacity = capacity
    }

    mutating func add(_ stack: [UInt], source: StallReport.StackSource = .signal) {
        let key = Array(stack.dropFirst())
        if let existing = entries[key] {
            entries[key] = (existing.stack, existing.count + 1, existing.order)
        } else if entries.count < capacity {
            entries[key] = (stack, 1, entries.count)
        } else {
            overflow += 1
            return
        }
        sourceCounts[key, default: [:]][source, default: 0] += 1
    }

    /// Every stack with its count, in the order first seen.
    var all: [(stack: [UInt], count: Int)] {
        entries.values.sorted { $0.order < $1.order }.map { ($0.stack, $0.count) }
    }

    /// How each stack of ``all`` was taken, in the same order: the way most of its samples were.
    var sources: [StallReport.StackSource] {
        entries.sorted { $0.value.order < $1.value.order }.map { key, _ in
            sourceCounts[key]?.max { $0.value < $1.value || ($0.value == $1.value && $0.key.rank > $1.key.rank) }?
                .key ?? .signal
        }
    }
}
#endif  // STALLMON_LINUX
