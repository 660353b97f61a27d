import StallJournal

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes reports to standard error: as one JSON object a line, for a container's log collector,
/// or in a readable form, for a terminal.
///
/// Each event is one `write`, so that lines of other writers never land inside it: on a pipe (a
/// container's standard error) the kernel keeps a write whole up to `PIPE_BUF` (4 KiB) always, and a
/// longer one whole while the pipe has room for it (64 KiB unless resized), which a reading collector
/// leaves.
public struct StandardErrorSink: ReportSink {
    /// How events are written.
    public struct Format: Sendable, Hashable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable {
            case text, json
        }

        private let value: Value

        private init(_ value: Value) {
            self.value = value
        }

        /// The message line, then details and the backtrace indented, every line prefixed.
        public static let text = Self(.text)
        /// One JSON object a line with every field of the journal entry, named as the journal
        /// names them (`MESSAGE` as `message`), with `time` (RFC 3339, microseconds) and `level`
        /// (syslog's name); at most 16 KiB a line (what was cut is named in `truncated`).
        public static let json = Self(.json)

        /// `text` or `json`.
        public var description: String { value.rawValue }
    }

    private let format: Format
    private let prefix: String
    private let syslogIdentifier: String

    /// - Parameters:
    ///   - format: ``Format/text`` or ``Format/json``.
    ///   - prefix: Starts every line of the text, e.g. the program's name.
    ///   - syslogIdentifier: `SYSLOG_IDENTIFIER` of the JSON lines; `nil` uses the program's name.
    public init(format: Format = .text, prefix: String? = nil, syslogIdentifier: String? = nil) {
        self.format = format
        self.prefix = prefix ?? "stallmon[\(getpid())]"
        self.syslogIdentifier = FieldLimits.identifier(syslogIdentifier ?? ProgramName.current)
    }

    /// The format the default sinks write when journald takes no entry: the text on a terminal, so
    /// that a person reads it, and JSON lines everywhere else (a container's log collector).
    public static var automaticFormat: Format {
        isatty(STDERR_FILENO) == 1 ? .text : .json
    }

    /// Writes the event (nothing for a kind this version does not know).
    /// - Throws: ``WriteError`` when standard error does not take it (closed, a full disk).
    public func emit(_ event: StallMonitorEvent) throws {
        if format == .json {
            try writeLine(JournalSink.fields(for: event, syslogIdentifier: syslogIdentifier))
            return
        }
        let rendered = Self.render(event)
        guard !rendered.isEmpty else { return }
        var text = rendered.split(separator: "\n", omittingEmptySubsequences: false)
            .map { "\(prefix): \($0)" }.joined(separator: "\n")
        text += "\n"
        if let failure = Self.writeAll(Array(text.utf8)) { throw WriteError(code: failure) }
    }

    /// What ``emit(_:)`` does in JSON past the mapping of the event to fields: the line of
    /// `fields`, written (the benchmark times this part alone).
    package func writeLine(_ fields: [JournalField]) throws {
        let line = JSONLine.encode(fields, time: JSONLine.now())
        guard !line.isEmpty else { return }
        if let failure = Self.writeAll(line) { throw WriteError(code: failure) }
    }

    /// One `write` of the whole event (more only when the kernel takes part of it); the errno when
    /// standard error takes none.
    private static func writeAll(_ bytes: [UInt8]) -> Int32? {
        bytes.withUnsafeBufferPointer { bytes -> Int32? in
            var offset = 0
            while offset < bytes.count {
                let written = write(STDERR_FILENO, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                if written <= 0 { return written < 0 ? errno : EIO }
                offset += written
            }
            return nil
        }
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
