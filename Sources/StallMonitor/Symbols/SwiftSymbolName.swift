import Foundation

/// Shortens a demangled Swift name the way a person writes it: `Service.refresh(force:)` for
/// `StallDemo.Service.refresh(force: Swift.Bool) -> ()`, and `closure #1 in Service.run()` for
/// `closure #1 @Sendable () -> () in StallDemo.Service.run() -> ()`.
enum SwiftSymbolName {
    static func simplify(_ demangled: String) -> String {
        var text = demangled
        if text.hasPrefix("reabstraction thunk") { return "reabstraction thunk" }
        text = removingExtensionContexts(text)
        text = removingPrivateDiscriminators(text)
        text = removingReturnTypes(text)
        text = removingClosureTypes(text)
        text = collapsingParameterLists(text)
        text = removingModulePrefixes(text)
        text = text.replacingAll("generic specialization ", with: "specialized ")
        for effect in [" throws", " rethrows", " async"] {
            text = text.replacingAll(effect + " in ", with: " in ")
            if text.hasSuffix(effect) { text.removeLast(effect.count) }
        }
        text = text.replacingAll(" in static ", with: " in ")
        if text.hasPrefix("static ") { text.removeFirst("static ".count) }
        if let range = text.range(of: " in conformance ") { text = String(text[..<range.lowerBound]) }
        return text
    }

    /// `(extension in Foo):Bar.baz()` → `Bar.baz()`.
    private static func removingExtensionContexts(_ text: String) -> String {
        var result = text
        while let start = result.range(of: "(extension in ") {
            guard let colon = result[start.upperBound...].firstIndex(of: ":") else { break }
            result.removeSubrange(start.lowerBound...colon)
        }
        return result
    }

    /// `(schedule in _D49913FB…)` → `schedule`: the discriminator of a private declaration.
    private static func removingPrivateDiscriminators(_ text: String) -> String {
        var result = text
        while let marker = result.range(of: " in _"), let open = result[..<marker.lowerBound].lastIndex(of: "("),
            let close = result[marker.upperBound...].firstIndex(of: ")"),
            result[marker.upperBound..<close].allSatisfy({ $0.isHexDigit })
        {
            let name = result[result.index(after: open)..<marker.lowerBound]
            result.replaceSubrange(open...close, with: name)
        }
        return result
    }

    /// Drops every ` -> T` that stands at bracket depth 0, up to the next ` in ` or the end.
    private static func removingReturnTypes(_ text: String) -> String {
        let characters = Array(text)
        var result = [Character]()
        var depth = 0
        var index = 0
        while index < characters.count {
            let character = characters[index]
            if depth == 0, matches(characters, at: index, " -> ") {
                // Skip the return type, which may itself contain brackets and arrows.
                var skip = index + 4
                var innerDepth = 0
                while skip < characters.count {
                    if innerDepth == 0, matches(characters, at: skip, " in ") { break }
                    switch characters[skip] {
                    case "(", "<", "[": innerDepth += 1
                    case ")", ">", "]": innerDepth = max(0, innerDepth - 1)
                    default: break
                    }
                    skip += 1
                }
                index = skip
                continue
            }
            switch character {
            case "(", "<", "[": depth += 1
            case ")", "]": depth = max(0, depth - 1)
            case ">" where !(index > 0 && characters[index - 1] == "-"): depth = max(0, depth - 1)
            default: break
            }
            result.append(character)
            index += 1
        }
        return String(result)
    }

    /// `closure #1 @Sendable (Foundation.Timer) in X` → `closure #1 in X`.
    private static func removingClosureTypes(_ text: String) -> String {
        var result = ""
        var rest = Substring(text)
        while let range = rest.range(of: "closure #") {
            result += rest[..<range.upperBound]
            rest = rest[range.upperBound...]
            let digits = rest.prefix { $0.isNumber }
            result += digits
            rest = rest.dropFirst(digits.count)
            guard rest.first == " " else { continue }
            // Find " in " at depth 0; whatever stands before it is the closure's type.
            var depth = 0
            var index = rest.startIndex
            var found: Substring.Index?
            while index < rest.endIndex {
                let character = rest[index]
                if depth == 0, rest[index...].hasPrefix(" in ") {
                    found = index
                    break
                }
                switch character {
                case "(", "<", "[": depth += 1
                case ")", ">", "]": depth = max(0, depth - 1)
                default: break
                }
                index = rest.index(after: index)
            }
            if let found { rest = rest[found...] }
        }
        return result + rest
    }

    /// `f(a: Swift.Int, _: Swift.String)` → `f(a:_:)`; `f()` stays.
    private static func collapsingParameterLists(_ text: String) -> String {
        let characters = Array(text)
        var result = ""
        var index = 0
        while index < characters.count {
            let character = characters[index]
            let follows =
                index > 0
                && (characters[index - 1].isLetter || characters[index - 1].isNumber
                    || characters[index - 1] == "_" || characters[index - 1] == ">" || characters[index - 1] == "`")
            guard character == "(", follows, let close = matchingParenthesis(characters, from: index) else {
                result.append(character)
                index += 1
                continue
            }
            let inside = String(characters[(index + 1)..<close])
            result += "(" + labels(of: inside) + ")"
            index = close + 1
        }
        return result
    }

    private static func labels(of parameters: String) -> String {
        guard !parameters.trimmingSpaces.isEmpty else { return "" }
        return splitAtDepthZero(parameters, separator: ",").map { parameter in
            let parameter = parameter.trimmingSpaces
            var depth = 0
            for (offset, character) in parameter.enumerated() {
                switch character {
                case "(", "<", "[": depth += 1
                case ")", ">", "]": depth = max(0, depth - 1)
                case ":" where depth == 0:
                    return String(parameter.prefix(offset)) + ":"
                default: break
                }
            }
            return "_:"
        }.joined()
    }

    /// Drops the module from each entity path: `StallDemo.Service.refresh()` → `Service.refresh()`.
    private static func removingModulePrefixes(_ text: String) -> String {
        splitAtDepthZero(text, separator: " ").map { word in
            var word = Substring(word)
            var prefix = ""
            while let first = word.first, "([<".contains(first) {
                prefix.append(first)
                word = word.dropFirst()
            }
            guard let first = word.first, first.isLetter || first == "_",
                let parenthesis = word.firstIndex(where: { "(<".contains($0) }) ?? Optional(word.endIndex)
            else {
                return prefix + word
            }
            let path = word[..<parenthesis]
            guard let dot = path.firstIndex(of: "."), path[path.index(after: dot)...].contains(where: { $0 != "." })
            else {
                return prefix + word
            }
            return prefix + word[word.index(after: dot)...]
        }.joined(separator: " ")
    }

    private static func matchingParenthesis(_ characters: [Character], from open: Int) -> Int? {
        var depth = 0
        var index = open
        while index < characters.count {
            switch characters[index] {
            case "(": depth += 1
            case ")":
                depth -= 1
                if depth == 0 { return index }
            default: break
            }
            index += 1
        }
        return nil
    }

    private static func splitAtDepthZero(_ text: String, separator: Character) -> [String] {
        var parts = [String]()
        var current = ""
        var depth = 0
        for character in text {
            switch character {
            case "(", "<", "[": depth += 1
            case ")", ">", "]": depth = max(0, depth - 1)
            default: break
            }
            if character == separator, depth == 0 {
                parts.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        parts.append(current)
        return parts
    }

    private static func matches(_ characters: [Character], at index: Int, _ pattern: String) -> Bool {
        let pattern = Array(pattern)
        guard index + pattern.count <= characters.count else { return false }
        return Array(characters[index..<index + pattern.count]) == pattern
    }
}

extension String {
    var trimmingSpaces: String {
        var result = Substring(self)
        while result.first == " " { result.removeFirst() }
        while result.last == " " { result.removeLast() }
        return String(result)
    }

    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var result = ""
        var rest = Substring(self)
        while let range = rest.range(of: target) {
            result += rest[..<range.lowerBound]
            result += replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }
}
