import Logging

/// Logs reports through a swift-log `Logger`: stalls as warnings with structured metadata.
public struct LoggerSink: ReportSink {
    private let logger: Logger

    public init(logger: Logger) {
        self.logger = logger
    }

    public func emit(_ event: StallMonitorEvent) {
        switch event {
        case .started(let description):
            logger.info("\(description.message)")
        case .stopped(let description, let statistics):
            logger.info(
                "stopped monitoring \(description.loop)",
                metadata: [
                    "stalls": "\(statistics.stalls)", "suppressed": "\(statistics.suppressedReports)",
                    "dropped": "\(statistics.droppedReports)", "lost": "\(statistics.lostReports)",
                ]
            )
        case .suppressed(let suppression):
            logger.notice("\(suppression.message)", metadata: ["stall.fingerprint": "\(suppression.fingerprint)"])
        case .stallDetected(let report), .stallEnded(let report), .watchdogStall(let report):
            logger.warning(
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
        }
    }
}
