/// `STALL_STACKS`: every distinct stack sampled during a stall, with how many samples showed it, in
/// a form that fits one journal field (at most 4 KiB). A reader gets it decoded, as
/// ``StallRecord/sampledStacks``, and the stacks with their frames as text from
/// ``StallRecord/resolvedStacks``.
///
/// `STALL_BACKTRACE` already holds the reported stack, one frame a line, so frames are numbered
/// after its lines: line `#0` is frame 0, line `#n-1` frame n-1. Frames that are not in the
/// backtrace are defined in the field itself and take the next numbers, in order. The field is
/// lines of text:
///
/// - `=<frame>`: a frame not in the backtrace: its name and ` at <file>:<line>` where known (no
///   address or offset), or `0x<address> [<image>]` without a symbol;
/// - `<ids> <count>`: a stack, innermost frame first, as comma-separated frame numbers or ranges
///   `a-b` (each number from a to b), a space, and the number of samples that showed it;
/// - `* <count>`: samples whose stacks did not fit the field.
///
/// A stall whose samples all showed the backtrace's six frames reads `0-5 14`; one that also spent
/// three samples in another leaf function reads `=memcpy`, `0-5 11`, `6,1-5 3`.
public struct SampledStacks: Sendable, Hashable {
    /// One stack: frame numbers, innermost first, and how many samples showed it.
    public struct Stack: Sendable, Hashable {
        public var frames: [Int]
        public var count: Int

        package init(frames: [Int], count: Int) {
            self.frames = frames
            self.count = count
        }
    }

    /// Frames not in the backtrace; frame `backtraceLineCount + i` is `frames[i]`.
    public var frames: [String]
    public var stacks: [Stack]
    /// Samples whose stacks did not fit the field.
    public var omittedSamples: Int

    /// Most frames one stack may name, inline frames included (the sampler keeps 128 addresses,
    /// and a few inline frames per address is already a lot).
    package static let maximumDepth = 1024
    /// Most frames all stacks of one field may name together, so ranges cannot make a 4 KiB field
    /// cost more than a few hundred KiB.
    package static let maximumTotalFrames = 65_536

    package init(frames: [String] = [], stacks: [Stack] = [], omittedSamples: Int = 0) {
        self.frames = frames
        self.stacks = stacks
        self.omittedSamples = omittedSamples
    }

    /// Whether the entry had no `STALL_STACKS`.
    public var isEmpty: Bool { stacks.isEmpty && omittedSamples == 0 }

    /// Samples the field accounts for, carried or not.
    public var totalSamples: Int { stacks.reduce(omittedSamples) { $0 + $1.count } }

    /// The field's value.
    package var encoded: String {
        var lines = frames.map { "=" + $0 }
        lines += stacks.map { Self.encode($0.frames) + " \($0.count)" }
        if omittedSamples > 0 { lines.append("* \(omittedSamples)") }
        return lines.joined(separator: "\n")
    }

    /// A frame to write: its line as the backtrace writes it, and the shorter text the field
    /// defines it with when it is not in the backtrace (its name and file:line, without address and
    /// offset, so that samples at two instructions of one function share a definition).
    package struct Frame: Sendable, Hashable {
        package var line: String
        package var definition: String

        package init(line: String, definition: String) {
            self.line = line
            self.definition = definition
        }
    }

    /// Builds the field from stacks of frames, heaviest stack first: frames whose line is a line of
    /// `backtraceLines` refer to it, the others are defined. Stacks that would take the field past
    /// `maximumBytes` are left out and counted in ``omittedSamples``.
    package init(
        stacks input: [(frames: [Frame], count: Int)], backtraceLines: [String],
        maximumBytes: Int = FieldLimits.stacksWriteBytes
    ) {
        self.init()
        var lineNumbers: [String: Int] = [:]
        for (index, line) in backtraceLines.enumerated() where lineNumbers[line] == nil { lineNumbers[line] = index }
        var numbers: [String: Int] = [:]
        let reserve = 2 + String(FieldLimits.maximumCount).utf8.count + 1  // "\n* N"
        var used = 0
        for entry in input.sorted(by: { $0.count > $1.count }) {
            let count = FieldLimits.count(entry.count)
            guard count > 0 else { continue }
            guard !entry.frames.isEmpty, entry.frames.count <= Self.maximumDepth,
                stacks.reduce(entry.frames.count, { $0 + $1.frames.count }) <= Self.maximumTotalFrames
            else {
                omittedSamples = FieldLimits.count(omittedSamples + count)
                continue
            }
            var newFrames: [String] = []
            var newNumbers: [String: Int] = [:]
            var ids: [Int] = []
            for frame in entry.frames {
                let text = Self.frameLine(frame.definition)
                if let id = lineNumbers[frame.line] ?? numbers[text] ?? newNumbers[text] {
                    ids.append(id)
                } else {
                    let id = backtraceLines.count + frames.count + newFrames.count
                    newNumbers[text] = id
                    newFrames.append(text)
                    ids.append(id)
                }
            }
            let stackLine = Self.encode(ids) + " \(count)"
            let cost = newFrames.reduce(stackLine.utf8.count + 1) { $0 + $1.utf8.count + 2 }
            guard used + cost + reserve <= maximumBytes else {
                omittedSamples = FieldLimits.count(omittedSamples + count)
                continue
            }
            used += cost
            frames += newFrames
            numbers.merge(newNumbers) { old, _ in old }
            stacks.append(Stack(frames: ids, count: count))
        }
    }

    /// A frame as one line of the field: newlines would start a new line, so they become spaces;
    /// cut to ``FieldLimits/frameBytes``.
    static func frameLine(_ frame: String) -> String {
        let oneLine = frame.contains(where: \.isNewline) ? String(frame.map { $0.isNewline ? " " : $0 }) : frame
        return FieldLimits.clamp(oneLine, toBytes: FieldLimits.frameBytes)
    }

    /// `0-5`, `7,2-5`: runs of consecutive ascending numbers as ranges.
    static func encode(_ ids: [Int]) -> String {
        var parts: [String] = []
        var index = 0
        while index < ids.count {
            var end = index
            while end + 1 < ids.count, ids[end + 1] == ids[end] + 1 { end += 1 }
            parts.append(
                end - index >= 2
                    ? "\(ids[index])-\(ids[end])" : ids[index...end].map(String.init).joined(separator: ","))
            index = end + 1
        }
        return parts.joined(separator: ",")
    }

    /// Decodes the field of an entry whose `STALL_BACKTRACE` has `backtraceLineCount` lines.
    /// - Throws: ``JournalDecodingError`` naming `STALL_STACKS`, the line and what is wrong.
    package init(decoding text: String, backtraceLineCount: Int) throws(JournalDecodingError) {
        self.init()
        func failure(_ line: Substring, _ reason: String) -> JournalDecodingError {
            JournalDecodingError(field: StallRecord.Field.stacks, value: String(line), reason: reason)
        }
        var stackLines: [Substring] = []
        var sawOmitted = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.first == "=" {
                let frame = line.dropFirst()
                guard !frame.isEmpty, frame.utf8.count <= FieldLimits.frameBytes else {
                    throw failure(line, "a frame must be 1 to \(FieldLimits.frameBytes) bytes")
                }
                frames.append(String(frame))
            } else if line.first == "*" {
                guard !sawOmitted, line.hasPrefix("* "), let count = Self.count(line.dropFirst(2)) else {
                    throw failure(line, "not one '* <count>' line")
                }
                sawOmitted = true
                omittedSamples = count
            } else {
                stackLines.append(line)
            }
        }
        let frameCount = backtraceLineCount + frames.count
        var total = 0
        for line in stackLines {
            let parts = line.split(separator: " ", omittingEmptySubsequences: false)
            guard parts.count == 2, let count = Self.count(parts[1]), count > 0 else {
                throw failure(line, "not '<frames> <count>'")
            }
            var ids: [Int] = []
            for item in parts[0].split(separator: ",", omittingEmptySubsequences: false) {
                let bounds = item.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
                guard let first = bounds.first.flatMap(Self.number), let last = bounds.last.flatMap(Self.number),
                    first <= last
                else {
                    throw failure(line, "'\(item)' is not a frame number or range")
                }
                guard last < frameCount else {
                    throw failure(
                        line,
                        "frame \(last) is not in the backtrace's \(backtraceLineCount) lines or the \(frames.count) frames defined"
                    )
                }
                guard ids.count + (last - first + 1) <= Self.maximumDepth else {
                    throw failure(line, "more than \(Self.maximumDepth) frames")
                }
                ids += first...last
            }
            total += ids.count
            guard total <= Self.maximumTotalFrames else {
                throw failure(line, "more than \(Self.maximumTotalFrames) frames in all")
            }
            stacks.append(Stack(frames: ids, count: count))
        }
    }

    private static func number(_ text: Substring) -> Int? {
        guard (1...6).contains(text.utf8.count), text.utf8.allSatisfy({ (48...57).contains($0) }) else { return nil }
        return Int(text)
    }

    private static func count(_ text: Substring) -> Int? {
        guard (1...10).contains(text.utf8.count), text.utf8.allSatisfy({ (48...57).contains($0) }),
            let value = Int(text), value <= FieldLimits.maximumCount
        else { return nil }
        return value
    }

    /// The stacks with their frames as text, innermost first: backtrace lines (without their
    /// `#N `) and the frames defined in the field. Stacks left out are one frame, `(stacks not
    /// recorded)`.
    package func resolved(backtrace: String) -> [(frames: [String], count: Int)] {
        let table = Self.backtraceFrames(backtrace) + frames
        var result = stacks.map { stack in
            (frames: stack.frames.map { $0 < table.count ? table[$0] : "?" }, count: stack.count)
        }
        if omittedSamples > 0 { result.append((["(stacks not recorded)"], omittedSamples)) }
        return result
    }

    /// The lines of a backtrace with their `#N ` numbers taken off.
    package static func backtraceFrames(_ backtrace: String) -> [String] {
        backtrace.split(separator: "\n", omittingEmptySubsequences: false).map { line in
            guard line.first == "#", let space = line.firstIndex(of: " "),
                line[line.index(after: line.startIndex)..<space].allSatisfy(\.isNumber)
            else { return String(line) }
            return String(line[line.index(after: space)...])
        }
    }
}
