/// A summary of stall reports that rate limiting held back, as stored in the journal.
public struct SuppressionRecord: Sendable, Hashable {
    public var message: String
    public var loop: String
    public var threadID: Int
    public var fingerprint: String
    public var frame: String
    /// Stalls whose reports were suppressed.
    public var count: Int
    public var totalDurationMicroseconds: UInt64
    public var worstDurationMicroseconds: UInt64
    public var rateLimitBurst: Int
    public var rateLimitIntervalMicroseconds: UInt64
    public var priority: Int
    public var syslogIdentifier: String

    package init(
        message: String, loop: String, threadID: Int, fingerprint: String, frame: String, count: Int,
        totalDurationMicroseconds: UInt64, worstDurationMicroseconds: UInt64, rateLimitBurst: Int,
        rateLimitIntervalMicroseconds: UInt64, priority: Int, syslogIdentifier: String
    ) {
        self.message = message
        self.loop = loop
        self.threadID = threadID
        self.fingerprint = fingerprint
        self.frame = frame
        self.count = count
        self.totalDurationMicroseconds = totalDurationMicroseconds
        self.worstDurationMicroseconds = worstDurationMicroseconds
        self.rateLimitBurst = rateLimitBurst
        self.rateLimitIntervalMicroseconds = rateLimitIntervalMicroseconds
        self.priority = priority
        self.syslogIdentifier = syslogIdentifier
    }

    public enum Field {
        public static let count = "STALL_SUPPRESSED_COUNT"
        public static let totalDurationMicroseconds = "STALL_SUPPRESSED_TOTAL_USEC"
        public static let worstDurationMicroseconds = "STALL_SUPPRESSED_WORST_USEC"
        public static let rateLimitBurst = "STALL_RATE_LIMIT_BURST"
        public static let rateLimitIntervalMicroseconds = "STALL_RATE_LIMIT_INTERVAL_USEC"
    }

    /// The entry's fields, every value clamped to its bound in ``FieldLimits``.
    package var fields: [JournalField] {
        [
            JournalField("MESSAGE_ID", MessageID.reportsSuppressed),
            JournalField("MESSAGE", FieldLimits.clamp(message, toBytes: FieldLimits.messageBytes)),
            JournalField("PRIORITY", String(min(max(priority, 0), 7))),
            JournalField("SYSLOG_IDENTIFIER", FieldLimits.identifier(syslogIdentifier)),
            JournalField(StallRecord.Field.loop, FieldLimits.clamp(loop, toBytes: FieldLimits.nameBytes)),
            JournalField(StallRecord.Field.threadID, String(threadID)),
            JournalField(StallRecord.Field.fingerprint, fingerprint),
            JournalField(StallRecord.Field.frame, FieldLimits.clamp(frame, toBytes: FieldLimits.frameBytes)),
            JournalField(Field.count, String(FieldLimits.count(count))),
            JournalField(Field.totalDurationMicroseconds, String(FieldLimits.microseconds(totalDurationMicroseconds))),
            JournalField(Field.worstDurationMicroseconds, String(FieldLimits.microseconds(worstDurationMicroseconds))),
            JournalField(Field.rateLimitBurst, String(FieldLimits.count(rateLimitBurst))),
            JournalField(
                Field.rateLimitIntervalMicroseconds, String(FieldLimits.microseconds(rateLimitIntervalMicroseconds))),
        ]
    }

    /// Decodes an entry read from the journal (``JournalEntry/fields``, or a line of `journalctl -o json`),
    /// holding every field to the bound that writers clamp it to.
    /// - Throws: ``JournalDecodingError`` naming the field that is missing, malformed or out of bounds.
    public init(journalFields fields: [String: String]) throws(JournalDecodingError) {
        let reader = FieldReader(fields: fields)
        let messageID = try reader.string("MESSAGE_ID", maximumBytes: 32)
        guard messageID == MessageID.reportsSuppressed else {
            throw JournalDecodingError(field: "MESSAGE_ID", value: messageID, reason: "not a suppression summary")
        }
        message = try reader.string("MESSAGE", maximumBytes: FieldLimits.messageBytes)
        priority = try reader.priority()
        syslogIdentifier = reader.identifier("SYSLOG_IDENTIFIER") ?? ""
        loop = try reader.optionalString(StallRecord.Field.loop, maximumBytes: FieldLimits.nameBytes) ?? "main"
        threadID = try reader.threadID(StallRecord.Field.threadID)
        fingerprint = try reader.hex(StallRecord.Field.fingerprint, digits: FieldLimits.fingerprintDigits)
        frame = try reader.optionalString(StallRecord.Field.frame, maximumBytes: FieldLimits.frameBytes) ?? ""
        count = try reader.count(Field.count)
        totalDurationMicroseconds = try reader.microseconds(Field.totalDurationMicroseconds)
        worstDurationMicroseconds = try reader.microseconds(Field.worstDurationMicroseconds)
        rateLimitBurst = try reader.count(Field.rateLimitBurst)
        rateLimitIntervalMicroseconds = try reader.microseconds(Field.rateLimitIntervalMicroseconds)
    }
}
