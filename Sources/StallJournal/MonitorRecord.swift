/// Field names of the monitor's start and stop entries (MESSAGE_ID ``MessageID/monitorLifecycle``).
public enum MonitorField {
    /// `started` or `stopped`.
    public static let event = "STALLMON_EVENT"
    /// Every configuration value, `key=value` separated by spaces.
    public static let configuration = "STALLMON_CONFIGURATION"
    public static let thresholdMicroseconds = "STALLMON_THRESHOLD_USEC"
    public static let sampleIntervalMicroseconds = "STALLMON_SAMPLE_INTERVAL_USEC"
    public static let signal = "STALLMON_SIGNAL"
    public static let stalls = "STALLMON_STALLS"
    public static let suppressed = "STALLMON_SUPPRESSED"
    public static let dropped = "STALLMON_DROPPED"
    /// Reports a sink failed to deliver (journald down with no fallback, standard error closed).
    public static let lost = "STALLMON_LOST"
}

/// A monitor's `started` or `stopped` entry (`MESSAGE_ID` ``MessageID/monitorLifecycle``): which
/// loop, watched how, and at the stop what it counted. The one mapping of these entries to fields.
package struct MonitorRecord: Sendable, Hashable {
    package enum Event: String, Sendable {
        case started
        case stopped
    }

    /// What a monitor counted, in its `stopped` entry.
    package struct Counts: Sendable, Hashable {
        package var stalls: Int
        package var suppressed: Int
        package var dropped: Int
        package var lost: Int

        package init(stalls: Int, suppressed: Int, dropped: Int, lost: Int) {
            self.stalls = stalls
            self.suppressed = suppressed
            self.dropped = dropped
            self.lost = lost
        }
    }

    package var event: Event
    package var message: String
    package var loop: String
    package var threadID: Int
    package var thresholdMicroseconds: Int64
    package var sampleIntervalMicroseconds: Int64
    /// The sampling signal's name, or `none`.
    package var signal: String
    /// Every configuration value, `key=value` separated by spaces.
    package var configuration: String
    /// For `stopped` entries.
    package var counts: Counts?
    package var syslogIdentifier: String

    package init(
        event: Event, message: String, loop: String, threadID: Int, thresholdMicroseconds: Int64,
        sampleIntervalMicroseconds: Int64, signal: String, configuration: String, counts: Counts? = nil,
        syslogIdentifier: String
    ) {
        self.event = event
        self.message = message
        self.loop = loop
        self.threadID = threadID
        self.thresholdMicroseconds = thresholdMicroseconds
        self.sampleIntervalMicroseconds = sampleIntervalMicroseconds
        self.signal = signal
        self.configuration = configuration
        self.counts = counts
        self.syslogIdentifier = syslogIdentifier
    }

    /// syslog's `info`.
    static let priority = 6

    package var fields: [JournalField] {
        var fields = [
            JournalField("MESSAGE_ID", MessageID.monitorLifecycle),
            JournalField("MESSAGE", message),
            JournalField("PRIORITY", String(Self.priority)),
            JournalField("SYSLOG_IDENTIFIER", syslogIdentifier),
            JournalField(MonitorField.event, event.rawValue),
            JournalField(StallRecord.Field.loop, loop),
            JournalField(StallRecord.Field.threadID, String(threadID)),
            JournalField(MonitorField.thresholdMicroseconds, String(thresholdMicroseconds)),
            JournalField(MonitorField.sampleIntervalMicroseconds, String(sampleIntervalMicroseconds)),
            JournalField(MonitorField.signal, signal),
            JournalField(MonitorField.configuration, configuration),
        ]
        if let counts {
            fields.append(JournalField(MonitorField.stalls, String(counts.stalls)))
            fields.append(JournalField(MonitorField.suppressed, String(counts.suppressed)))
            fields.append(JournalField(MonitorField.dropped, String(counts.dropped)))
            fields.append(JournalField(MonitorField.lost, String(counts.lost)))
        }
        return fields
    }
}
