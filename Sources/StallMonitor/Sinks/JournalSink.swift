import StallJournal

/// Writes reports to the systemd journal as structured entries (see `StallRecord` for the fields).
///
/// Each entry goes over a socket of the sink's own in journald's native protocol, and one send
/// waits at most `sendTimeout` for journald (see `JournalConnection` in StallJournal). An entry journald does
/// not take goes to `fallback` when there is one (the default sinks fall back to standard error),
/// and counts as lost otherwise. Every entry tries the journal first, so reports return to it as
/// soon as journald listens again, whether or not it listened when the sink was made.
public struct JournalSink: ReportSink {
    private let writer: JournalWriter
    private let syslogIdentifier: String
    private let fallback: (any ReportSink)?
    private let failures: FailureCounter

    /// - Parameters:
    ///   - syslogIdentifier: `SYSLOG_IDENTIFIER` of stall entries; `nil` uses the program's name.
    ///     Cut to 256 bytes (ending in `…`), the longest readers accept.
    ///   - socketPath: journald's native socket (`/run/systemd/journal.NAMESPACE/socket` for a
    ///     journal namespace).
    ///   - sendTimeout: How long one entry may wait for a journald that takes none; after such a
    ///     wait, entries skip the journal for a second.
    ///   - fallback: Where entries go that journald did not take; `nil` counts them as lost. It
    ///     runs where the journal sink does, on the reporting thread: a fallback that blocks
    ///     delays every report (the default, ``StandardErrorSink``, makes one `write` per event).
    public init(
        syslogIdentifier: String? = nil, socketPath: String = "/run/systemd/journal/socket",
        sendTimeout: Duration = .milliseconds(100), fallback: (any ReportSink)? = nil
    ) {
        self.writer = JournalWriter(socketPath: socketPath, sendTimeout: sendTimeout)
        self.syslogIdentifier = FieldLimits.identifier(syslogIdentifier ?? ProgramName.current)
        self.fallback = fallback
        self.failures = FailureCounter()
    }

    /// Whether journald listens on the socket: a datagram socket connects to it. A socket left
    /// behind by a journald that has since exited refuses every entry, and reads as unavailable.
    public var isAvailable: Bool { writer.isAvailable }

    /// Entries that journald did not take (for example while it is down), whether or not the
    /// fallback then had them.
    public var failedEntries: Int { failures.count }

    /// Sends the event to the journal, or to the fallback when journald does not take it.
    /// - Throws: ``JournalDecodingError`` for a field journald would drop or no reader would accept;
    ///   without a fallback, the reason journald did not take the entry; with one, the fallback's error.
    public func emit(_ event: StallMonitorEvent) throws {
        let fields = Self.fields(for: event, syslogIdentifier: syslogIdentifier)
        guard !fields.isEmpty else { return }
        do {
            try writer.deliver(fields)
        } catch let error as JournalDecodingError {
            throw error
        } catch {
            failures.increment()
            guard let fallback else { throw error }
            try fallback.emit(event)
        }
    }

    /// What ``emit(_:)`` does past the mapping of the event to fields, without a fallback: checks
    /// the fields and sends them (the benchmark times this part alone).
    package func send(_ fields: [JournalField]) throws { try writer.deliver(fields) }

    /// The journal fields of an event: the one mapping from reports to the schema; none for a kind
    /// this version does not know.
    package static func fields(for event: StallMonitorEvent, syslogIdentifier: String) -> [JournalField] {
        if let report = event.report {
            return StallRecord(report: report, syslogIdentifier: syslogIdentifier).fields
        }
        if let suppression = event.suppression {
            return SuppressionRecord(
                message: suppression.message, loop: suppression.loop, threadID: suppression.threadID,
                fingerprint: suppression.fingerprint, frame: suppression.frame, count: suppression.count,
                totalDurationMicroseconds: UInt64(clamping: suppression.totalDuration.microseconds),
                worstDurationMicroseconds: UInt64(clamping: suppression.worstDuration.microseconds),
                rateLimitBurst: suppression.burst,
                rateLimitIntervalMicroseconds: UInt64(clamping: suppression.interval.microseconds),
                priority: Priority.notice, syslogIdentifier: syslogIdentifier
            ).fields
        }
        switch (event.kind, event.monitor, event.statistics) {
        case (.started, let description?, _):
            return lifecycleRecord(
                description, syslogIdentifier: syslogIdentifier, event: .started,
                message: "stallmon started: " + description.message
            ).fields
        case (.stopped, let description?, let statistics?):
            var record = lifecycleRecord(
                description, syslogIdentifier: syslogIdentifier, event: .stopped,
                message:
                    "stallmon stopped monitoring \(Self.monitored(description.loop)): "
                    + "\(statistics.stalls) stalls, \(statistics.suppressedReports) reports suppressed, "
                    + "\(statistics.droppedReports) dropped, \(statistics.lostReports) lost"
            )
            record.counts = MonitorRecord.Counts(
                stalls: statistics.stalls, suppressed: statistics.suppressedReports,
                dropped: statistics.droppedReports, lost: statistics.lostReports)
            return record.fields
        default:
            return []
        }
    }

    /// `the main run loop`, `the cooperative pool` or `thread NIO-ELT-0-#0`.
    private static func monitored(_ loop: String) -> String {
        loop == "main"
            ? "the main run loop"
            : loop == MonitorDescription.cooperativePoolLoop ? "the cooperative pool" : "thread \(loop)"
    }

    private static func lifecycleRecord(
        _ description: MonitorDescription, syslogIdentifier: String, event: MonitorRecord.Event, message: String
    ) -> MonitorRecord {
        let configuration = description.configuration
        return MonitorRecord(
            event: event, message: message, loop: description.loop, threadID: description.threadID,
            thresholdMicroseconds: configuration.threshold.microseconds,
            sampleIntervalMicroseconds: configuration.sampleInterval.microseconds,
            signal: description.signal.map(SignalName.name(of:)) ?? "none", configuration: configuration.summary,
            syslogIdentifier: syslogIdentifier)
    }
}

/// syslog(3) priorities used by stallmon's entries.
enum Priority {
    static let critical = 2
    static let error = 3
    static let warning = 4
    static let notice = 5
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
        sampledStacks = SampledStacks(report.sampledStacks, backtrace: Self.clampBacktrace(backtrace))
        stackSource = report.stackSource?.rawValue ?? ""
        request = report.request
    }
}

/// Counts failures from several threads.
final class FailureCounter: Sendable {
    private let value = AtomicCounter()
    func increment() { value.add(1) }
    var count: Int { value.load() }
}
