import Logging

/// Logs reports through a swift-log `Logger`: stalls as warnings with structured metadata (errors
/// from eight times the threshold on, critical for a stall that outlasted the service watchdog, as
/// in the journal), the monitor's start and stop at debug.
public struct LoggerSink: ReportSink {
    private let logger: Logger

    public init(logger: Logger) {
        self.logger = logger
    }

    public func emit(_ event: StallMonitorEvent) {
        if let report = event.report {
            let level: Logger.Level =
                report.event == .watchdog ? .critical : report.duration >= report.threshold * 8 ? .error : .warning
            logger.log(
                level: level,
                "\(report.message)",
                metadata: [
                    "stall.id": "\(report.stallID)",
                    "stall.event": "\(report.event.rawValue)",
                    "stall.duration_ms": "\(report.duration.milliseconds)",
                    "stall.callout": "\(report.callout.rawValue)",
                    "stall.fingerprint": "\(report.fingerprint)",
                    "stall.backtrace": "\(report.backtrace)",
                ]
            )
        } else if let suppression = event.suppression {
            logger.notice("\(suppression.message)", metadata: ["stall.fingerprint": "\(suppression.fingerprint)"])
        } else if let description = event.monitor, event.kind == .started {
            logger.debug("\(description.message)")
        } else if let description = event.monitor, let statistics = event.statistics, event.kind == .stopped {
            logger.debug(
                "stopped monitoring \(description.loop)",
                metadata: [
                    "stalls": "\(statistics.stalls)", "suppressed": "\(statistics.suppressedReports)",
                    "dropped": "\(statistics.droppedReports)", "lost": "\(statistics.lostReports)",
                ]
            )
        }
    }
}
