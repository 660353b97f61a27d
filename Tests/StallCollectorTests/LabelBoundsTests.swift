import StallJournal
import Testing

@testable import StallCollector

/// Prometheus label values stay bounded and distinct, whatever the journal held.
struct LabelBoundsTests {
    @Test func longLabelValuesAreCutAndStayDistinct() {
        let a = String(repeating: "A", count: 100_000) + "a"
        let b = String(repeating: "A", count: 100_000) + "b"
        let labelA = PrometheusTextfile.escape(a)
        let labelB = PrometheusTextfile.escape(b)
        #expect(labelA.utf8.count <= PrometheusTextfile.maximumLabelBytes)
        #expect(labelB.utf8.count <= PrometheusTextfile.maximumLabelBytes)
        #expect(labelA != labelB)
        #expect(labelA.hasPrefix("AAAA"))
        #expect(labelA.contains("…#"))
        // Short values are only escaped.
        #expect(PrometheusTextfile.escape("foo.service") == "foo.service")
        // A newline (a control character) is shown as `\u{A}`, then escaped as the format asks.
        #expect(PrometheusTextfile.escape("a\"b\\c\nd") == "a\\\"b\\\\c\\\\u{A}d")
        // Escaping after the cut: a cut value never ends in half an escape.
        let quotes = String(repeating: "\"", count: 1_000)
        let escaped = PrometheusTextfile.escape(quotes)
        #expect(escaped.hasPrefix("\\\""))
        #expect(escaped.utf8.count <= 2 * PrometheusTextfile.maximumLabelBytes)
    }
}
