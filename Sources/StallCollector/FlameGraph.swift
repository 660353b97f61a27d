import Foundation
import StallJournal

/// Where stall time goes: the sampled stacks of stalls (`STALL_STACKS`, or the backtrace of
/// entries without it), each weighted by its share of its stall's duration, merged by frame.
///
/// Frames are shown as people read them, `Service.refresh() (Service.swift:42)`, from the
/// backtrace lines the reports carry. Everything comes from a journal anyone can write, so the
/// renderings escape it (``folded`` like the terminal output, ``svg(title:)`` as XML) and bound
/// it (``maximumBoxes``, ``maximumLabelScalars``).
public struct FlameGraph: Sendable {
    /// Distinct stacks, outermost frame first, with the stall time spent in each (µs).
    public private(set) var stacks: [[String]: UInt64] = [:]
    /// Stalls counted, and their total duration (µs).
    public private(set) var stalls = 0
    public private(set) var totalMicroseconds: UInt64 = 0

    /// Boxes drawn at most; narrower ones are left out first (their time stays in their parents).
    public static let maximumBoxes = 5_000
    /// Frame labels are cut to this many Unicode scalars (after escaping), ending in `…`.
    public static let maximumLabelScalars = 300

    /// Counts each stall once: of entries with the same `STALL_ID` (a watchdog and an ended
    /// report), the longer.
    public init(_ records: [StallRecord]) {
        var byID: [String: StallRecord] = [:]
        var order: [String] = []
        for record in records {
            if let existing = byID[record.stallID] {
                if record.durationMicroseconds > existing.durationMicroseconds { byID[record.stallID] = record }
            } else {
                byID[record.stallID] = record
                order.append(record.stallID)
            }
        }
        for id in order { add(byID[id]!) }
    }

    private mutating func add(_ record: StallRecord) {
        let resolved = record.resolvedStacks.filter { $0.count > 0 && !$0.frames.isEmpty }
        let samples = resolved.reduce(0) { $0 + UInt64($1.count) }
        guard samples > 0 else { return }
        stalls += 1
        totalMicroseconds = totalMicroseconds.saturatingAdd(record.durationMicroseconds)
        var left = record.durationMicroseconds
        var shares: [([String], UInt64)] = resolved.map { stack in
            // duration × count / samples, exact in 128 bits; never more than the duration.
            let share = record.durationMicroseconds.multipliedFullWidth(by: UInt64(stack.count))
            let weight = samples.dividingFullWidth(share).quotient
            left -= min(left, weight)
            return (stack.frames.reversed().map(Self.label), weight)
        }
        shares[0].1 += left  // what rounding left over, to the heaviest
        for (frames, weight) in shares where weight > 0 { stacks[frames] = (stacks[frames] ?? 0).saturatingAdd(weight) }
    }

    /// A backtrace line (`0x55d4c1a2b3c4 Service.refresh() + 52 at Service.swift:42 [service]`) as a
    /// frame of the graph: `Service.refresh() (Service.swift:42)`; `[image]` without a symbol.
    public static func label(_ line: String) -> String {
        var rest = Substring(line)
        if rest.hasPrefix("0x"), let space = rest.firstIndex(of: " ") {
            rest = rest[rest.index(after: space)...]
        } else if rest.hasPrefix("0x") {
            rest = ""
        }
        var image: Substring?
        if rest.hasPrefix("["), rest.hasSuffix("]"), !rest.contains(" ") {
            image = rest.dropFirst().dropLast()
            rest = ""
        } else if rest.hasSuffix("]"), let open = rest.range(of: " [", options: .backwards) {
            image = rest[open.upperBound..<rest.index(before: rest.endIndex)]
            rest = rest[..<open.lowerBound]
        }
        var location: Substring?
        if let at = rest.range(of: " at ", options: .backwards) {
            let candidate = rest[at.upperBound...]
            if let colon = candidate.lastIndex(of: ":"), !candidate.contains(" "),
                candidate[candidate.index(after: colon)...].allSatisfy(\.isNumber)
            {
                location = candidate
                rest = rest[..<at.lowerBound]
            }
        }
        if rest.hasSuffix(" [inlined]") { rest = rest.dropLast(" [inlined]".count) }
        if let plus = rest.range(of: " + ", options: .backwards),
            !rest[plus.upperBound...].isEmpty, rest[plus.upperBound...].allSatisfy(\.isNumber)
        {
            rest = rest[..<plus.lowerBound]
        }
        if rest.isEmpty { return image.map { "[\($0)]" } ?? "[unknown]" }
        return location.map { "\(rest) (\($0))" } ?? String(rest)
    }

    /// A label as one frame of text output: control characters escaped as on the terminal,
    /// `;` (the folded format's separator) as `\x3b`, cut to ``maximumLabelScalars``.
    static func shown(_ label: String) -> String {
        DisplayText.cell(label, limit: maximumLabelScalars).replacingOccurrences(of: ";", with: "\\x3b")
    }

    /// The folded-stack text other flame graph tools read (`flamegraph.pl`, speedscope, inferno):
    /// one line per distinct stack, `outer;…;inner µs`, sorted.
    public var folded: String {
        stacks.map { frames, weight in frames.map(Self.shown).joined(separator: ";") + " \(weight)" }
            .sorted().joined(separator: "\n")
    }

    /// One node of the merged tree.
    final class Node {
        let label: String
        var weight: UInt64 = 0
        var children: [String: Node] = [:]

        init(label: String) { self.label = label }
    }

    func tree() -> Node {
        let root = Node(label: "all")
        for (frames, weight) in stacks {
            root.weight = root.weight.saturatingAdd(weight)
            var node = root
            for frame in frames {
                let label = DisplayText.cell(frame, limit: Self.maximumLabelScalars)
                let child = node.children[label] ?? Node(label: label)
                node.children[label] = child
                child.weight = child.weight.saturatingAdd(weight)
                node = child
            }
        }
        return root
    }
}
