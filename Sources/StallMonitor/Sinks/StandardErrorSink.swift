#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes reports to standard error in a readable form: the fallback where no journal exists.
public struct StandardErrorSink: ReportSink {
    private let prefix: String

    /// - Parameter prefix: Starts every line, e.g. the program's name.
    public init(prefix: String? = nil) {
        self.prefix = prefix ?? "stallmon[\(getpid())]"
    }

    /// Writes the event's lines (none for a kind this version does not know).
    /// - Throws: ``WriteError`` when standard error does not take them (closed, a full disk).
    public func emit(_ event: StallMonitorEvent) throws {
        let rendered = Self.render(event)
        guard !rendered.isEmpty else { return }
        var text = rendered.split(separator: "\n", omittingEmptySubsequences: false)
            .map { "\(prefix): \($0)" }.joined(separator: "\n")
        text += "\n"
        // One write per event so that lines of concurrent writers do not interleave.
        let failure = text.withUTF8 { bytes -> Int32? in
            var offset = 0
            while offset < bytes.count {
                let written = write(STDERR_FILENO, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                if written <= 0 { return written < 0 ? errno : EIO }
                offset += written
            }
            return nil
        }
        if let failure { throw WriteError(code: failure) }
    }

    /// Standard error did not take an event; `code` is the errno of `write`.
    public struct WriteError: Error, CustomStringConvertible {
        public var code: Int32
        public var description: String { "write to standard error failed (errno \(code))" }
    }

    /// The readable form of an event: its message, then details and the backtrace indented; empty
    /// for a kind this version does not know.
    package static func render(_ event: StallMonitorEvent) -> String {
        if let suppression = event.suppression { return suppression.message }
        guard let report = event.report else {
            switch (event.kind, event.monitor, event.statistics) {
            case (.started, let description?, _):
                return "started: " + description.message
            case (.stopped, let description?, let statistics?):
                return "stopped monitoring \(description.loop): \(statistics.stalls) stalls, "
                    + "\(statistics.suppressedReports) reports suppressed, \(statistics.droppedReports) dropped, "
                    + "\(statistics.lostReports) lost"
            default:
                return ""
            }
        }
        var lines = [report.message]
        var details =
            "  stall \(report.stallID) \(report.event.rawValue): \(report.activity.rawValue), mode \(report.runLoopMode), "
        details += "tid \(report.threadID) state \(report.threadState)"
        if let syscall = report.syscall { details += " in \(syscall)" }
        details += ", cpu \(report.cpuTime.milliseconds) ms, samples \(report.stackSamples)/\(report.samples)"
        if report.unansweredSamples > 0 { details += " (\(report.unansweredSamples) unanswered)" }
        details += ", fingerprint \(report.fingerprint)"
        lines.append(details)
        if report.stack.isEmpty {
            lines.append("  (no stack: \(report.noStackReason ?? "unknown"))")
        } else {
            lines += report.stack.enumerated().map { "  #\($0.offset) \($0.element.backtraceLine)" }
        }
        return lines.joined(separator: "\n")
    }
}
