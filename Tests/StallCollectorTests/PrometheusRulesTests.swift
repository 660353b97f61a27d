import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

/// `deploy/prometheus`: the rules, their tests and the dashboard read only series stallmond writes
/// (as `PrometheusTextfile` renders them) and the recording rules; promtool checks and tests them.
struct PrometheusRulesTests {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("deploy/prometheus").path

    static func file(_ name: String) throws -> String {
        try String(contentsOfFile: directory + "/" + name, encoding: .utf8)
    }

    /// What stallmond writes: a file rendered from entries of two units, a watchdog stall, a
    /// suppression and a malformed entry, with every series name and its label names.
    static func renderedTextfile() -> String {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        aggregator.ingest(Entries.entry(milliseconds: 300, cursor: "1"))
        aggregator.ingest(
            Entries.entry(unit: "bar.service", fingerprint: "bbbbbbbbbbbbbbbb", milliseconds: 1800, cursor: "2"))
        aggregator.ingest(Entries.entry(.watchdog, milliseconds: 9000, cursor: "3"))
        // A user's program outside any unit: budgeted by its _UID.
        aggregator.ingest(Entries.entry(unit: nil, uid: "1000", milliseconds: 400, cursor: "5"))
        // A stall inside a request: the unit's endpoint series.
        aggregator.ingest(Entries.requestEntry(Entries.route("/users/:id"), unit: "foo.service", time: 1, cursor: "6"))
        var broken = Entries.entry(cursor: "4")
        broken.fields["STALL_DURATION_USEC"] = "long"
        aggregator.ingest(broken)
        return PrometheusTextfile.render(
            aggregator.state, windows: [.seconds(300)], now: 1_000_000_000, aggregator: aggregator)
    }

    /// `name{a="x",b="y"} 1` → name and labels.
    static func parseSeries(_ text: String) -> (name: String, labels: [String: String])? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard let brace = trimmed.firstIndex(of: "{"), let close = trimmed.lastIndex(of: "}") else {
            let name = trimmed.split(separator: " ").first.map(String.init) ?? ""
            return name.isEmpty ? nil : (name, [:])
        }
        var labels: [String: String] = [:]
        var rest = trimmed[trimmed.index(after: brace)..<close]
        while let equals = rest.firstIndex(of: "=") {
            let name = rest[..<equals].trimmingCharacters(in: CharacterSet(charactersIn: " ,"))
            var index = rest.index(after: rest.index(after: equals))  // past ="
            var value = ""
            while index < rest.endIndex, rest[index] != "\"" {
                if rest[index] == "\\" { index = rest.index(after: index) }
                value.append(rest[index])
                index = rest.index(after: index)
            }
            labels[name] = value
            rest = index < rest.endIndex ? rest[rest.index(after: index)...] : ""
        }
        return (String(trimmed[..<brace]), labels)
    }

    static func renderedSeries() -> [(name: String, labels: [String: String])] {
        renderedTextfile().split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { parseSeries(String($0)) }
    }

    static func recordingRules() throws -> Set<String> {
        Set(
            try file("stallmon.rules.yml").split(separator: "\n").compactMap { line -> String? in
                let trimmed = line.trimmingCharacters(in: .whitespaces)
                guard trimmed.hasPrefix("- record: ") else { return nil }
                return String(trimmed.dropFirst("- record: ".count))
            })
    }

    /// The `expr:` values of a rules file, block scalars included.
    static func ruleExpressions() throws -> [String] {
        let lines = try file("stallmon.rules.yml").split(separator: "\n", omittingEmptySubsequences: false)
        var expressions: [String] = []
        var index = 0
        while index < lines.count {
            let line = lines[index]
            index += 1
            guard let range = line.range(of: "expr: ") else { continue }
            let value = line[range.upperBound...].trimmingCharacters(in: .whitespaces)
            guard value == "|" else {
                expressions.append(value)
                continue
            }
            let indent = line.prefix { $0 == " " }.count
            var block: [Substring] = []
            while index < lines.count, lines[index].prefix(while: { $0 == " " }).count > indent {
                block.append(lines[index])
                index += 1
            }
            expressions.append(block.map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " "))
        }
        return expressions
    }

    /// Every PromQL expression of the dashboard: panel targets and template variable queries.
    static func dashboardExpressions() throws -> [String] {
        let json = try JSONSerialization.jsonObject(with: Data(try file("stallmon-dashboard.json").utf8))
        var expressions: [String] = []
        func walk(_ value: Any, key: String?) {
            if let object = value as? [String: Any] {
                for (key, value) in object { walk(value, key: key) }
            } else if let array = value as? [Any] {
                for value in array { walk(value, key: nil) }
            } else if let text = value as? String, key == "expr" || key == "query" || key == "definition",
                text != "prometheus"
            {
                expressions.append(text)
            }
        }
        walk(json, key: nil)
        return expressions
    }

    /// The metric names an expression reads: identifiers outside strings, label matchers, ranges,
    /// grouping clauses and function calls.
    static func metricNames(in expression: String) -> Set<String> {
        var text = expression
        let removals: [(pattern: String, template: String)] = [
            (#"label_values\(([^,()]*(?:\{[^}]*\})?)\s*,\s*\w+\s*\)"#, "$1"),
            (#""(?:[^"\\]|\\.)*""#, "\"\""), (#"'(?:[^'\\]|\\.)*'"#, "''"), (#"\{[^}]*\}"#, " "), (#"\[[^\]]*\]"#, " "),
            (#"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"#, " "), (#"\$\{?\w+\}?"#, " "),
        ]
        for (pattern, template) in removals {
            let regex = try! NSRegularExpression(pattern: pattern)
            text = regex.stringByReplacingMatches(
                in: text, range: NSRange(text.startIndex..., in: text), withTemplate: template)
        }
        let identifier = try! NSRegularExpression(pattern: #"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*+(?!\s*\()"#)
        let keywords: Set<String> = [
            "and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
            "inf", "nan", "Inf", "NaN",
        ]
        var names: Set<String> = []
        for match in identifier.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            let name = String(text[Range(match.range, in: text)!])
            if !keywords.contains(name) { names.insert(name) }
        }
        return names
    }

    @Test func metricNamesAreFoundOutsideMatchersRangesAndFunctions() {
        #expect(
            Self.metricNames(
                in: #"topk(20, sum by (unit, frame) (increase(a_total{unit=~"$unit", x="b_total"}[$__range]))) * 60"#)
                == ["a_total"])
        #expect(
            Self.metricNames(in: #"(a unless on (unit) b offset 6h) and on (unit) c:d:rate5m > 1e6"#)
                == ["a", "b", "c:d:rate5m"])
        #expect(Self.metricNames(in: #"label_values(x_total{unit=~"$unit"}, instance)"#) == ["x_total"])
    }

    @Test func theTestsInputSeriesAreShapedLikeStallmondsTextfile() throws {
        let rendered = Self.renderedSeries()
        let shapes = Set(rendered.map { $0.name + "{" + $0.labels.keys.sorted().joined(separator: ",") + "}" })
        let buckets = Set(rendered.compactMap { $0.labels["le"] })
        let lines = try Self.file("stallmon.rules.test.yml").split(separator: "\n")
        let inputs = lines.compactMap { line -> String? in
            guard let range = line.range(of: "- series: '") else { return nil }
            return String(line[range.upperBound...].dropLast())
        }
        #expect(inputs.count >= 20)
        var covered: Set<String> = []
        for input in inputs {
            let series = try #require(Self.parseSeries(input), "\(input)")
            #expect(series.labels["job"] != nil && series.labels["instance"] != nil, "\(input): no scrape labels")
            var labels = series.labels
            labels["job"] = nil
            labels["instance"] = nil
            let shape = series.name + "{" + labels.keys.sorted().joined(separator: ",") + "}"
            #expect(shapes.contains(shape), "\(input) is not a series stallmond writes (it writes \(shapes.sorted()))")
            covered.insert(shape)
            if let le = labels["le"] { #expect(buckets.contains(le), "le=\"\(le)\" is not a default bucket") }
            if let fingerprint = labels["fingerprint"] {
                #expect(FieldLimits.isLowercaseHex(fingerprint, digits: 16) || fingerprint == "other")
            }
        }
        // Every series stallmond writes is in the test's input.
        #expect(covered == shapes, "missing: \(shapes.subtracting(covered).sorted())")
    }

    @Test func rulesAndDashboardReadOnlyStallmondsSeriesAndTheRecordingRules() throws {
        let known = Set(Self.renderedSeries().map(\.name)).union(try Self.recordingRules())
        let rules = try Self.ruleExpressions()
        let dashboard = try Self.dashboardExpressions()
        #expect(rules.count == 15)
        #expect(dashboard.count >= 14)
        for expression in rules + dashboard {
            let names = Self.metricNames(in: expression)
            #expect(!names.isEmpty, "\(expression) reads no series")
            #expect(names.isSubset(of: known), "\(expression) reads \(names.subtracting(known).sorted())")
        }
    }

    @Test func dashboardIsAGrafanaDashboard() throws {
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(try Self.file("stallmon-dashboard.json").utf8))
                as? [String: Any])
        #expect(json["uid"] as? String == "stallmon-stalls")
        let panels = try #require(json["panels"] as? [[String: Any]])
        #expect(panels.count >= 10)
        var ids: Set<Int> = []
        for panel in panels {
            let id = try #require(panel["id"] as? Int)
            #expect(ids.insert(id).inserted, "panel id \(id) twice")
            #expect(panel["type"] as? String != nil && panel["title"] as? String != nil)
            let targets = try #require(panel["targets"] as? [[String: Any]])
            #expect(!targets.isEmpty && targets.allSatisfy { ($0["expr"] as? String)?.isEmpty == false })
            let position = try #require(panel["gridPos"] as? [String: Int])
            #expect((position["x"] ?? 99) + (position["w"] ?? 99) <= 24)
        }
    }

    /// promtool: the rules are valid and pass their unit tests, the scrape example is a valid
    /// configuration, and every dashboard expression parses (checked as a recording rule each, the
    /// Grafana variables replaced by values). Skipped without promtool, but where `REQUIRE_TEST_TOOLS=1` (CI).
    @Test(.requires(.promtool)) func promtoolChecksAndTestsTheRules() throws {
        let promtool = try ExternalTool.required(.promtool)
        for arguments in [
            ["check", "rules", "stallmon.rules.yml"], ["test", "rules", "stallmon.rules.test.yml"],
            ["check", "config", "prometheus.yml"],
        ] {
            let result = try ExternalTool.run(promtool, arguments, directory: Self.directory)
            #expect(result.status == 0, "promtool \(arguments.joined(separator: " ")): \(result.output)")
            #expect(result.output.contains("SUCCESS"))
        }
        var rules = "groups:\n  - name: dashboard\n    rules:\n"
        for (index, expression) in try Self.dashboardExpressions().enumerated() {
            var query = expression
            if query.hasPrefix("label_values(") {
                query = Self.labelValuesSelector(query)
            }
            for (variable, value) in [
                ("$__rate_interval", "5m"), ("$__range", "6h"), ("$unit", ".*"), ("$instance", ".*"),
            ] {
                query = query.replacingOccurrences(of: variable, with: value)
            }
            let quoted = query.replacingOccurrences(of: "'", with: "''")
            rules += "      - record: dashboard:expression_\(index)\n        expr: '\(quoted)'\n"
        }
        let path = NSTemporaryDirectory() + "stallmon-dashboard-\(UUID().uuidString).rules.yml"
        try rules.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let result = try ExternalTool.run(promtool, ["check", "rules", path], directory: Self.directory)
        #expect(result.status == 0, "a dashboard expression does not parse: \(result.output)")
    }

    /// `label_values(sel, label)` → `sel`.
    static func labelValuesSelector(_ query: String) -> String {
        let inner = query.dropFirst("label_values(".count).dropLast()
        guard let comma = inner.lastIndex(of: ",") else { return String(inner) }
        return String(inner[..<comma])
    }
}
