import Foundation
import StallJournal

/// Where stall time goes: the sampled stacks of stalls (`STALL_STACKS`, or the backtrace of
/// entries without it), each weighted by its share of its stall's duration, merged by frame.
///
/// Frames are shown as people read them, `Service.refresh() (Service.swift:42)`, from the
/// backtrace lines the reports carry. Everything comes from a journal anyone can write, so the
/// renderings escape it (``folded`` like the terminal output, ``svg(title:)`` as XML) and bound
/// it (``maximumBoxes``, ``maximumLabelScalars``).
package struct FlameGraph: Sendable {
    /// Stalls counted, and their total duration (µs).
    package private(set) var stalls = 0
    package private(set) var totalMicroseconds: UInt64 = 0
    /// Frames not added because the graph held ``maximumNodes`` distinct frames (each stack is
    /// cut there, its time staying with the deepest frame kept), and the stall time of the stacks cut.
    package private(set) var cutFrames = 0
    package private(set) var cutMicroseconds: UInt64 = 0

    /// Boxes drawn at most; narrower ones are left out first (their time stays in their parents).
    package static let maximumBoxes = 5_000
    /// Frame labels are cut to this many Unicode scalars (after escaping), ending in `…`.
    package static let maximumLabelScalars = 300
    /// Distinct frames (nodes of the merged tree) kept at most, whatever the entries hold: about
    /// 100 bytes each, and at most ``maximumLabelBytes`` of label text in all.
    package static let maximumNodes = 100_000
    /// Frames drawn of one stack at most, from the outermost: the sampler keeps 128 addresses, a
    /// few inline frames each at most, while the schema lets a hostile entry name 1,024 frames a
    /// stack; deeper frames are cut (counted in ``cutFrames``), their time staying with the last
    /// frame drawn.
    package static let maximumDepth = 256
    package static let maximumLabelBytes = 16 << 20
    /// Writers' frames (``add(_:prefix:)``'s prefixes) made past ``maximumNodes`` at most: in a
    /// graph that is full, each writer still has its box, its stacks cut there. The stall of a
    /// writer past these is cut whole, its time staying with the root.
    package static let maximumPrefixes = 1_000

    /// The merged tree, built as stalls are added: node 0 is the root; each node has a label
    /// (an index into `labels`), a parent, its total weight and the weight of stacks ending there.
    private var nodeLabel: [Int32] = [-1]
    private var nodeParent: [Int32] = [-1]
    private var nodeWeight: [UInt64] = [0]
    private var nodeSelf: [UInt64] = [0]
    /// Child of (parent << 32 | label).
    private var children = NodeTable()
    private var labels: [String] = []
    private var labelIDs: [String: Int32] = [:]
    private var labelBytes = 0
    /// Prefix frames made past the bounds (see ``maximumPrefixes``).
    private var reservedPrefixes = 0
    /// The duration each stall was counted with, by `STALL_ID`.
    private var counted: [String: UInt64] = [:]

    /// Said after the summary, in the SVG and by `stallmon report` (e.g. what was left out).
    package var notes: [String] = []
    /// Whether the outermost frames are writers, each drawn the same width at a scale of its own
    /// (see ``svg(title:)``): no writer's stalls, however long, can make another's too narrow to see.
    package var drawsWritersApart = false

    /// Whether no stack was added.
    package var isEmpty: Bool { nodeLabel.count <= 1 }

    package init() {}

    /// The graph of `records`, as ``add(_:prefix:)`` adds them in order.
    package init(_ records: [StallRecord]) {
        for record in records { add(record) }
    }

    /// Adds one stall's stacks, each weighted by its share of the stall's duration; memory and
    /// work stay bounded whatever the entry holds (``maximumNodes``). A stall counts once: of
    /// entries with the same `STALL_ID` (a watchdog and an ended report), the longer duration, the
    /// time past the first entry's drawn from the later entry's stacks.
    /// - Parameter prefix: An outermost frame to draw the stall under (e.g. who wrote it), if any.
    package mutating func add(_ record: StallRecord, prefix: String? = nil) {
        let previous = counted[record.stallID]
        if let previous, record.durationMicroseconds <= previous { return }
        let duration = record.durationMicroseconds - (previous ?? 0)
        // The frames as labels, once per distinct line; stacks are lists of indices into them.
        var table: [Int32]
        var stacks: [(frames: ArraySlice<Int>, count: Int)]
        let backtrace = SampledStacks.backtraceFrames(StallRecord.clampBacktrace(record.backtrace))
        if record.sampledStacks.isEmpty {
            table = backtrace.map { intern(Self.label($0)) }
            stacks = [(ArraySlice(0..<table.count), max(1, record.stackSamples))]
        } else {
            table = (backtrace + record.sampledStacks.frames).map { intern(Self.label($0)) }
            stacks = record.sampledStacks.stacks.map { (ArraySlice($0.frames), $0.count) }
            if record.sampledStacks.omittedSamples > 0 {
                table.append(intern("(stacks not recorded)"))
                stacks.append((ArraySlice([table.count - 1]), record.sampledStacks.omittedSamples))
            }
        }
        stacks.removeAll { $0.count <= 0 || $0.frames.isEmpty }
        let samples = stacks.reduce(0) { $0 + UInt64($1.count) }
        guard samples > 0 else { return }
        if previous == nil { stalls += 1 }
        counted[record.stallID] = record.durationMicroseconds
        totalMicroseconds = totalMicroseconds.saturatingAdd(duration)
        var root: Int32 = 0
        if let prefix {
            root = prefixNode(prefix)
            guard root >= 0 else {
                // Past maximumPrefixes writers: the stall is cut whole, its time with the root.
                cutFrames += stacks.reduce(0) { $0 + $1.frames.count }
                cutMicroseconds = cutMicroseconds.saturatingAdd(duration)
                nodeWeight[0] = nodeWeight[0].saturatingAdd(duration)
                nodeSelf[0] = nodeSelf[0].saturatingAdd(duration)
                return
            }
        }
        var left = duration
        for (index, stack) in stacks.enumerated() {
            // duration × count / samples, exact in 128 bits; never more than the duration.
            var weight = samples.dividingFullWidth(duration.multipliedFullWidth(by: UInt64(stack.count))).quotient
            left -= min(left, weight)
            if index == stacks.count - 1 { weight = weight.saturatingAdd(left) }  // what rounding left over
            guard weight > 0 else { continue }
            addStack(stack.frames, table: table, weight: weight, from: root)
        }
    }

    /// Adds a stack (innermost frame first) from `start`, cut where the tree is full.
    private mutating func addStack(_ frames: ArraySlice<Int>, table: [Int32], weight: UInt64, from start: Int32) {
        // Each node on the way down takes the weight: a node's weight is that of the stacks through it.
        var node = start
        var up = start
        while up >= 0 {
            nodeWeight[Int(up)] = nodeWeight[Int(up)].saturatingAdd(weight)
            up = nodeParent[Int(up)]
        }
        var depth = 0
        for id in frames.reversed() {
            guard depth < Self.maximumDepth else {
                cutFrames += frames.count - depth
                cutMicroseconds = cutMicroseconds.saturatingAdd(weight)
                break
            }
            guard id < table.count, table[id] >= 0 else { break }
            let next = child(of: node, label: table[id])
            if next < 0 {
                cutFrames += frames.count - depth
                cutMicroseconds = cutMicroseconds.saturatingAdd(weight)
                break
            }
            node = next
            nodeWeight[Int(node)] = nodeWeight[Int(node)].saturatingAdd(weight)
            depth += 1
        }
        nodeSelf[Int(node)] = nodeSelf[Int(node)].saturatingAdd(weight)
    }

    /// The child of `parent` with `label`, made if the tree has room; -1 if not.
    private mutating func child(of parent: Int32, label: Int32) -> Int32 {
        guard label >= 0, parent >= 0 else { return -1 }
        let existing = children.value(for: Self.key(parent, label))
        if existing >= 0 { return existing }
        guard nodeLabel.count < Self.maximumNodes else { return -1 }
        return makeNode(parent: parent, label: label)
    }

    /// The frame of a writer under the root: made past ``maximumNodes`` and ``maximumLabelBytes``
    /// for ``maximumPrefixes`` writers; -1 past them.
    private mutating func prefixNode(_ prefix: String) -> Int32 {
        if let label = labelIDs[prefix] {
            let existing = children.value(for: Self.key(0, label))
            if existing >= 0 { return existing }
        }
        let full =
            nodeLabel.count >= Self.maximumNodes || labels.count >= Self.maximumNodes
            || labelBytes + prefix.utf8.count > Self.maximumLabelBytes
        if full {
            guard reservedPrefixes < Self.maximumPrefixes else { return -1 }
            reservedPrefixes += 1
        }
        let label = labelIDs[prefix] ?? appendLabel(prefix)
        return makeNode(parent: 0, label: label)
    }

    private static func key(_ parent: Int32, _ label: Int32) -> UInt64 {
        UInt64(UInt32(parent)) << 32 | UInt64(UInt32(label))
    }

    private mutating func makeNode(parent: Int32, label: Int32) -> Int32 {
        let node = Int32(nodeLabel.count)
        nodeLabel.append(label)
        nodeParent.append(parent)
        nodeWeight.append(0)
        nodeSelf.append(0)
        children.insert(node, for: Self.key(parent, label))
        return node
    }

    /// The label's index, kept while the labels' text stays within ``maximumLabelBytes``; -1 past it.
    private mutating func intern(_ label: String) -> Int32 {
        if let id = labelIDs[label] { return id }
        guard labelBytes + label.utf8.count <= Self.maximumLabelBytes, labels.count < Self.maximumNodes else {
            return -1
        }
        return appendLabel(label)
    }

    private mutating func appendLabel(_ label: String) -> Int32 {
        let id = Int32(labels.count)
        labels.append(label)
        labelIDs[label] = id
        labelBytes += label.utf8.count
        return id
    }

    /// Adds `other`'s stalls, frames and cuts, for drawing both: a frame of `other` becomes this
    /// graph's frame of the same path, made past the bounds (each graph was held to its own).
    package mutating func merge(_ other: FlameGraph) {
        stalls += other.stalls
        totalMicroseconds = totalMicroseconds.saturatingAdd(other.totalMicroseconds)
        cutFrames += other.cutFrames
        cutMicroseconds = cutMicroseconds.saturatingAdd(other.cutMicroseconds)
        // A parent comes before its children in both graphs: node i of `other` is mapped[i] here.
        var mapped = [Int32](repeating: 0, count: other.nodeLabel.count)
        for node in 0..<other.nodeLabel.count {
            var target: Int32 = 0
            if node > 0 {
                let text = other.labels[Int(other.nodeLabel[node])]
                let label = labelIDs[text] ?? appendLabel(text)
                let parent = mapped[Int(other.nodeParent[node])]
                target = children.value(for: Self.key(parent, label))
                if target < 0 { target = makeNode(parent: parent, label: label) }
                mapped[node] = target
            }
            nodeWeight[Int(target)] = nodeWeight[Int(target)].saturatingAdd(other.nodeWeight[node])
            nodeSelf[Int(target)] = nodeSelf[Int(target)].saturatingAdd(other.nodeSelf[node])
        }
    }

    /// Distinct stacks, outermost frame first, with the stall time that ended in each (µs).
    package var stacks: [[String]: UInt64] {
        var result: [[String]: UInt64] = [:]
        for node in 1..<nodeLabel.count where nodeSelf[node] > 0 {
            var frames: [String] = []
            var up = Int32(node)
            while up > 0 {
                frames.append(labels[Int(nodeLabel[Int(up)])])
                up = nodeParent[Int(up)]
            }
            result[frames.reversed(), default: 0] += nodeSelf[node]
        }
        return result
    }

    /// A backtrace line (`0x55d4c1a2b3c4 Service.refresh() + 52 at Service.swift:42 [service]`) as a
    /// frame of the graph: `Service.refresh() (Service.swift:42)`; `[image]` without a symbol.
    package static func label(_ line: String) -> String {
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
    package var folded: String {
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

    /// The tree as drawn: labels as shown (two frames shown alike are one box).
    func tree() -> Node {
        var nodes = [Node(label: "all")]
        nodes[0].weight = nodeWeight[0]
        nodes.reserveCapacity(nodeLabel.count)
        for node in 1..<nodeLabel.count {
            let parent = nodes[Int(nodeParent[node])]
            let label = DisplayText.cell(labels[Int(nodeLabel[node])], limit: Self.maximumLabelScalars)
            let child = parent.children[label] ?? Node(label: label)
            parent.children[label] = child
            child.weight = child.weight.saturatingAdd(nodeWeight[node])
            nodes.append(child)
        }
        return nodes[0]
    }
}

/// The flame graph an operator asks for: the stalls of the host's services. Anyone on the host
/// can write stall entries with any duration and any stacks, so an entry that no system unit wrote
/// (see ``StallObservation/owner(of:)``) is left out whenever system units' stalls are drawn: a
/// forged stall of a year, or a flood of them, cannot take the services' frames out of the
/// picture. Where no system unit's stall matched (a developer's machine, a program started by
/// hand), the others are drawn, and the graph says so.
///
/// With `allWriters`, everything is drawn, each writer under a frame of its own: `[system units]`,
/// and `[uid N]` for the stalls written outside system units. Each writer's box is as wide as the
/// others' (``FlameGraph/drawsWritersApart``), and the system units' stalls are merged apart from
/// the others' (each with ``FlameGraph/maximumNodes`` frames of its own, and a stall ID of their
/// own): a forged year, a flood of the worst entries or a forged stall ID cannot make the
/// services' boxes vanish in this view either.
package struct ServiceFlameGraph: Sendable {
    package let allWriters: Bool
    private var services = FlameGraph()
    private var others = FlameGraph()

    /// The frame the system units' stalls are drawn under with `allWriters`.
    package static let systemUnits = "[system units]"

    package init(allWriters: Bool = false) { self.allWriters = allWriters }

    /// Adds the stall of an entry whose fields (journald's trusted ones) say who wrote it.
    package mutating func add(_ record: StallRecord, fields: [String: String]) {
        guard let owner = StallObservation.owner(of: fields) else {
            services.add(record, prefix: allWriters ? Self.systemUnits : nil)
            return
        }
        others.add(record, prefix: allWriters ? "[uid \(owner.isEmpty ? "?" : owner)]" : nil)
    }

    /// The graph to draw, with a note of what was left out.
    package var graph: FlameGraph {
        if allWriters {
            var graph = services
            graph.merge(others)
            graph.drawsWritersApart = true
            graph.notes.append("each writer is drawn as wide as the others: widths compare within a writer")
            return graph
        }
        if others.stalls == 0 { return services }
        if services.stalls == 0 {
            var graph = others
            graph.notes.append("no stall of a system unit matched: stalls written outside system units drawn")
            return graph
        }
        var graph = services
        graph.notes.append(
            "\(others.stalls) stall\(others.stalls == 1 ? "" : "s") written outside system units left out (--all-writers draws them)"
        )
        return graph
    }
}

/// The flame graph's child table: (parent, label) → node, open addressing with linear probing
/// and a multiplicative hash. A stack of the schema's worst entry is 1,024 look-ups: this keeps
/// each to a few nanoseconds, where a `Dictionary` hashes every key with SipHash.
struct NodeTable: Sendable {
    private var keys: [UInt64] = []
    private var values: [Int32] = []
    private var count = 0
    private var mask = 0
    private var shift: UInt64 = 64

    private static let empty = UInt64.max

    /// Fibonacci hashing: the top bits of the product depend on every bit of the key.
    private func slot(_ key: UInt64) -> Int { Int(truncatingIfNeeded: (key &* 0x9E37_79B9_7F4A_7C15) >> shift) }

    /// The node for `key`, or -1.
    func value(for key: UInt64) -> Int32 {
        guard count > 0 else { return -1 }
        var index = slot(key)
        while true {
            let found = keys[index]
            if found == key { return values[index] }
            if found == Self.empty { return -1 }
            index = (index + 1) & mask
        }
    }

    /// Adds a key that is not in the table.
    mutating func insert(_ value: Int32, for key: UInt64) {
        if (count + 1) * 2 > keys.count { grow() }
        var index = slot(key)
        while keys[index] != Self.empty { index = (index + 1) & mask }
        keys[index] = key
        values[index] = value
        count += 1
    }

    private mutating func grow() {
        let (oldKeys, oldValues) = (keys, values)
        let capacity = max(1024, keys.count * 2)
        keys = Array(repeating: Self.empty, count: capacity)
        values = Array(repeating: -1, count: capacity)
        mask = capacity - 1
        shift = UInt64(64 - capacity.trailingZeroBitCount)
        count = 0
        for (key, value) in zip(oldKeys, oldValues) where key != Self.empty { insert(value, for: key) }
    }
}
