import Foundation
import StallJournal

extension FlameGraph {
    /// A self-contained SVG flame graph: the outermost frames at the bottom, each box as wide as
    /// the stall time spent in it and its callees, its full label, time and share in a tooltip.
    /// Frames of code with file:line are warm colours, the others (libraries, runtime) cool. With
    /// ``drawsWritersApart``, each writer's box is as wide as the others', its frames in proportion.
    /// - Parameter title: The first line, e.g. the command that drew it.
    package func svg(title: String) -> String {
        let width = 1200.0
        let padding = 10.0
        let rowHeight = 17.0
        let header = 56.0
        let root = tree()
        let total = Double(max(root.weight, 1))
        let boxes =
            root.weight > 0
            ? Self.layout(root, width: width - 2 * padding, left: padding, writersApart: drawsWritersApart) : []
        let maximumDepth = boxes.last?.depth ?? 0
        let height = header + Double(maximumDepth + 1) * rowHeight + 2 * padding

        var svg = """
            <?xml version="1.0" encoding="UTF-8" standalone="no"?>
            <svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="\(Int(width))" height="\(Int(height))" \
            viewBox="0 0 \(Int(width)) \(Int(height))" font-family="DejaVu Sans Mono, monospace" font-size="12">
            <rect x="0" y="0" width="\(Int(width))" height="\(Int(height))" fill="#fdfdf8"/>
            <text x="\(Int(width / 2))" y="22" text-anchor="middle" font-size="16">\(Self.xml(DisplayText.cell(title, limit: 160)))</text>
            <text x="\(Int(width / 2))" y="42" text-anchor="middle" fill="#555">\(Self.xml(summary + (isEmpty ? "" : "; width is time, outermost frame at the bottom")))</text>

            """
        for (node, x, boxWidth, depth) in boxes {
            let y = height - padding - Double(depth + 1) * rowHeight
            let share = Double(node.weight) / total * 100
            let tooltip = "\(node.label) (\(Self.duration(node.weight)), \(Self.format(share, digits: 2))%)"
            svg += "<g><title>\(Self.xml(tooltip))</title>"
            svg += "<rect x=\"\(Self.format(x, digits: 2))\" y=\"\(Self.format(y, digits: 1))\" "
            svg +=
                "width=\"\(Self.format(max(boxWidth - 0.5, 0.1), digits: 2))\" height=\"\(Self.format(rowHeight - 1, digits: 1))\" "
            svg += "rx=\"2\" fill=\"\(depth == 0 ? "#c8c8c8" : Self.color(for: node.label))\"/>"
            let characters = Int((boxWidth - 6) / 7.25)
            if characters >= 3 {
                let text =
                    node.label.unicodeScalars.count <= characters
                    ? node.label
                    : String(String.UnicodeScalarView(node.label.unicodeScalars.prefix(characters - 2))) + ".."
                svg +=
                    "<text x=\"\(Self.format(x + 3, digits: 2))\" y=\"\(Self.format(y + rowHeight - 5, digits: 1))\">"
                svg += Self.xml(text) + "</text>"
            }
            svg += "</g>\n"
        }
        return svg + "</svg>\n"
    }

    /// `3 stalls, 1.8 s of stall time`, then the ``remarks``.
    package var summary: String {
        (["\(stalls) stall\(stalls == 1 ? "" : "s"), \(Self.duration(totalMicroseconds)) of stall time"] + remarks)
            .joined(separator: "; ")
    }

    /// What was cut (at ``maximumDepth`` or ``maximumNodes``), then the ``notes``: said in the SVG,
    /// and by `stallmon report` after a flame graph or folded stacks.
    package var remarks: [String] {
        guard cutFrames > 0 else { return notes }
        return [
            "\(cutFrames) frames of \(Self.duration(cutMicroseconds)) of stacks cut at \(Self.maximumNodes) distinct frames"
        ] + notes
    }

    /// The boxes to draw, level by level from the root: those at least 0.3 px wide, and only
    /// whole levels while the total stays within ``maximumBoxes``, so a graph that is cut loses
    /// its deepest levels, never some siblings of a level it shows. A box's children share its
    /// width in proportion to their time; with `writersApart`, the root's (the writers) equally.
    static func layout(_ root: Node, width: Double, left: Double, writersApart: Bool)
        -> [(node: Node, x: Double, width: Double, depth: Int)]
    {
        var boxes: [(node: Node, x: Double, width: Double, depth: Int)] = []
        var level: [(node: Node, x: Double, width: Double)] = [(root, left, width)]
        var depth = 0
        while !level.isEmpty, boxes.count + level.count <= maximumBoxes {
            boxes += level.map { ($0.node, $0.x, $0.width, depth) }
            var next: [(node: Node, x: Double, width: Double)] = []
            for (node, x, width) in level {
                let labels = node.children.keys.sorted()
                let equal = writersApart && depth == 0
                let scale = width / Double(max(node.weight, 1))
                var childX = x
                for label in labels {
                    let child = node.children[label]!
                    let childWidth = equal ? width / Double(labels.count) : Double(child.weight) * scale
                    if childWidth >= 0.3 { next.append((child, childX, childWidth)) }
                    childX += childWidth
                }
            }
            level = next
            depth += 1
        }
        return boxes
    }

    /// Text for an XML text node or attribute, from text already made visible (labels and the
    /// title go through ``DisplayText``): `&`, `<`, `>` and quotes escaped, and any character XML
    /// 1.0 cannot hold at all (C0 controls, U+FFFE, U+FFFF) shown as a visible escape all the same.
    static func xml(_ text: String) -> String {
        var result = ""
        result.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&quot;"
            case "'": result += "&#39;"
            case "\u{0}"..."\u{1F}", "\u{FFFE}", "\u{FFFF}":
                let digits = String(scalar.value, radix: 16)
                result += scalar.value < 0x20 ? "\\x" + (digits.count < 2 ? "0" : "") + digits : "\\u" + digits
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    /// Warm for frames with file:line (the program's code), cool for the rest; the shade from a
    /// hash of the name, so a frame has the same colour in every graph.
    static func color(for label: String) -> String {
        var hash: UInt32 = 2_166_136_261
        for byte in label.utf8 {
            hash ^= UInt32(byte)
            hash &*= 16_777_619
        }
        let a = Int(hash % 55)
        let b = Int((hash >> 8) % 55)
        var hasLocation = false
        if label.hasSuffix(")"), let open = label.range(of: " (", options: .backwards),
            let colon = label[open.upperBound...].lastIndex(of: ":")
        {
            hasLocation = label[label.index(after: colon)..<label.index(before: label.endIndex)].allSatisfy(\.isNumber)
        }
        return hasLocation ? "rgb(\(200 + a),\(90 + 2 * b),\(40 + b / 2))" : "rgb(\(120 + b),\(150 + a),\(195 + a / 2))"
    }

    static func duration(_ microseconds: UInt64) -> String {
        microseconds >= 1_000_000
            ? format(Double(microseconds) / 1e6, digits: 2) + " s"
            : format(Double(microseconds) / 1e3, digits: 1) + " ms"
    }

    /// Fixed-point text without Foundation's locale-dependent formatting.
    static func format(_ value: Double, digits: Int) -> String {
        var factor = 1.0
        for _ in 0..<digits { factor *= 10 }
        let scaled = Int64((value * factor).rounded())
        let whole = scaled / Int64(factor)
        let fraction = abs(scaled % Int64(factor))
        guard digits > 0 else { return String(whole) }
        let text = String(fraction)
        return (scaled < 0 && whole == 0 ? "-" : "") + "\(whole)." + String(repeating: "0", count: digits - text.count)
            + text
    }
}
