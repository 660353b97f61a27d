import Logging

extension StallMonitor {
    /// The sinks that ``Configuration/sink`` names (`sink`, `STALLMON_SINK`). By default (`"auto"`)
    /// the journal, falling back to standard error for each entry that journald does not take (no
    /// socket, as in a container; down, not started yet, or taking nothing for 100 ms): decided per
    /// entry, so reports return to the journal as soon as journald does. On standard error an entry
    /// is one JSON line, or the readable text when standard error is a terminal
    /// (``StandardErrorSink/automaticFormat``).
    /// - Parameters:
    ///   - configuration: Its `sink` and `syslogIdentifier`.
    ///   - logger: Where `"logger"` sends reports (a ``LoggerSink``).
    public static func defaultSinks(_ configuration: Configuration, logger: Logger = .current) -> [any ReportSink] {
        let identifier = configuration.syslogIdentifier
        switch configuration.sink {
        case .journal?:
            return [JournalSink(syslogIdentifier: identifier)]
        case .json?:
            return [StandardErrorSink(format: .json, syslogIdentifier: identifier)]
        case .text?:
            return [StandardErrorSink(format: .text)]
        case .logger?:
            return [LoggerSink(logger: logger)]
        default:
            let fallback = StandardErrorSink(format: StandardErrorSink.automaticFormat, syslogIdentifier: identifier)
            return [JournalSink(syslogIdentifier: identifier, fallback: fallback)]
        }
    }
}
