import ArgumentParser
import Foundation
import StallCollector
import StallJournal

extension ExitStatus {
    /// EX_CANTCREAT: the flame graph's file cannot be written.
    static let cannotCreate = ExitCode(73)
}

extension Report {
    /// `--flamegraph FILE` and `--folded`: where the matching stalls spent their time, from their
    /// sampled stacks.
    func drawStacks(_ graph: FlameGraph) throws {
        if folded, !graph.isEmpty { print(graph.folded) }
        // What was cut and left out, where the folded text (one line per stack) cannot say it.
        if folded, !graph.remarks.isEmpty { JournalSource.complain("report", graph.remarks.joined(separator: "; ")) }
        guard let flamegraph else { return }
        var title = "stallmon report"
        if let namespace { title += " --namespace \(namespace)" }
        if let unit { title += " --unit \(unit)" }
        if let since { title += " --since \(since)" }
        do {
            try Data(graph.svg(title: title).utf8).write(to: URL(fileURLWithPath: flamegraph), options: .atomic)
        } catch {
            JournalSource.complain("report", "cannot write the flame graph to \(flamegraph): \(error)")
            throw ExitStatus.cannotCreate
        }
        if !folded { print("flame graph of \(graph.summary) written to \(DisplayText.escaped(flamegraph))") }
    }
}
