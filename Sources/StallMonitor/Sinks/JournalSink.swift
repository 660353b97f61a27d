import StallJournal

/// Writes reports to the systemd journal as structured entries (see `StallRecord` for the fields).
public struct JournalSink: ReportSink {
    private let writer: JournalWriter
    private let syslogIdentifier: String
    private let failures: FailureCounter

    /// - Parameters:
    ///   - syslogIdentifier: `SYSLOG_IDENTIFIER` of stall entries; `nil` uses the program's name.
    ///   - writer: Where entries go; the default is journald's native socket.
    public init(syslogIdentifier: String? = nil, writer: JournalWriter = JournalWriter()) {
        self.writer = writer
        self.syslogIdentifier = syslogIdentifier ?? ProgramName.current
        self.failures = FailureCounter()
    }

    /// Whether journald listens (see ``JournalWriter/isAvailable``).
    public var isAvailable: Bool { writer.isAvailable }

    /// Entries that journald refused (for example while it is down).
    public var failedEntries: Int { failures.count }

    public func emit(_ event: StallMonitorEvent) {
        do {
            try writer.send(Self.fields(for: event, syslogIdentifier: syslogIdentifier))
        } catch {
            failures.increment()
        }
    }

    /// The journal fields of an event: the one mapping from reports to the schema.
    public static func fields(for event: StallMonitorEvent, syslogIdentifier: String) -> [JournalField] {
        switch event {
        case .stallDetected(let report), .stallEnded(let report), .watchdogStall(let report):
            return StallRecord(report: report, syslogIdentifier: syslogIdentifier).fields
        case .suppressed(let suppression):
            return SuppressionRecord(
                message: suppression.message, loop: suppression.loop, threadID: suppression.threadID,
                fingerprint: suppression.fingerprint, frame: suppression.frame, count: suppression.count,
                totalDurationMicroseconds: UInt64(clamping: suppression.totalDuration.microseconds),
                worstDurationMicroseconds: UInt64(clamping: suppression.worstDuration.microseconds),
                rateLimitBurst: suppression.burst,
                rateLimitIntervalMicroseconds: UInt64(clamping: suppression.interval.microseconds),
                priority: Priority.notice, syslogIdentifier: syslogIdentifier
            ).fields
        case .started(let description):
            return lifecycleFields(
                description, syslogIdentifier: syslogIdentifier, event: "started",
                message: "stallmon started: " + description.message)
        case .stopped(let description, let statistics):
            var fields = lifecycleFields(
                description, syslogIdentifier: syslogIdentifier, event: "stopped",
                message:
                    "stallmon stopped monitoring \(description.loop == "main" ? "the main run loop" : "thread \(description.loop)"): "
                    + "\(statistics.stalls) stalls, \(statistics.suppressedReports) reports suppressed, "
                    + "\(statistics.droppedReports) dropped"
            )
            fields.append(JournalField(MonitorField.stalls, String(statistics.stalls)))
            fields.append(JournalField(MonitorField.suppressed, String(statistics.suppressedReports)))
            fields.append(JournalField(MonitorField.dropped, String(statistics.droppedReports)))
            return fields
        }
    }

    private static func lifecycleFields(
        _ description: MonitorDescription, syslogIdentifier: String, event: String, message: String
    ) -> [JournalField] {
        let configuration = description.configuration
        return [
            JournalField("MESSAGE_ID", MessageID.monitorLifecycle),
            JournalField("MESSAGE", message),
            JournalField("PRIORITY", String(Priority.info)),
            JournalField("SYSLOG_IDENTIFIER", syslogIdentifier),
            JournalField(MonitorField.event, event),
            JournalField(StallRecord.Field.loop, description.loop),
            JournalField(StallRecord.Field.threadID, String(description.threadID)),
            JournalField(MonitorField.thresholdMicroseconds, String(configuration.threshold.microseconds)),
            JournalField(MonitorField.sampleIntervalMicroseconds, String(configuration.sampleInterval.microseconds)),
            JournalField(MonitorField.signal, description.signal.map(SignalName.name(of:)) ?? "none"),
            JournalField(MonitorField.configuration, configuration.summary),
        ]
    }
}

/// syslog(3) priorities used by stallmon's entries.
enum Priority {
    static let critical = 2
    static let error = 3
    static let warning = 4
    static let notice = 5
    static let info = 6
}

enum ProgramName {
    /// The name the program was started as, like `program_invocation_short_name`.
    static let current: String = {
        let name = CommandLine.arguments.first?.lastPathComponent ?? ""
        return name.isEmpty ? "stallmon" : name
    }()
}

extension StallRecord {
    init(report: StallReport, syslogIdentifier: String) {
        let stallDuration = report.duration
        self.init(
            event: StallRecord.Event(rawValue: report.event.rawValue)!,
            message: report.message,
            stallID: report.stallID,
            durationMicroseconds: UInt64(clamping: stallDuration.microseconds),
            thresholdMicroseconds: UInt64(clamping: report.threshold.microseconds),
            activity: report.activity.rawValue,
            runLoopMode: report.runLoopMode,
            callout: report.callout.rawValue,
            loop: report.loop,
            threadID: report.threadID,
            threadState: report.threadState,
            threadSyscall: report.syscall ?? "",
            threadWaitChannel: report.waitChannel ?? "",
            cpuMicroseconds: UInt64(clamping: report.cpuTime.microseconds),
            samples: report.samples,
            samplesUnanswered: report.unansweredSamples,
            stackSamples: report.stackSamples,
            fingerprint: report.fingerprint,
            frame: report.culprit?.summary ?? report.noStackReason.map { "(no stack: \($0))" } ?? "",
            backtrace: report.stack.isEmpty ? "(no stack: \(report.noStackReason ?? "unknown"))" : report.backtrace,
            priority: report.event == .watchdog
                ? Priority.critical : stallDuration >= report.threshold * 8 ? Priority.error : Priority.warning,
            syslogIdentifier: syslogIdentifier
        )
        watchdogMicroseconds = UInt64(clamping: report.watchdogInterval?.microseconds ?? 0)
        stackSource = report.stackSource?.rawValue ?? ""
    }
}

/// Counts failures from several threads.
final class FailureCounter: Sendable {
    private let value = AtomicCounter()
    func increment() { value.add(1) }
    var count: Int { value.load() }
}
