/// stallmond's periodic digest of the stalls it collected, as stored in the journal.
public struct DigestRecord: Sendable, Hashable {
    public var message: String
    /// Stalls in the window, across all units.
    public var stalls: Int
    /// Units that stalled in the window.
    public var units: Int
    public var windowMicroseconds: UInt64
    public var worstMicroseconds: UInt64
    public var worstUnit: String
    public var worstFrame: String
    public var priority: Int
    public var syslogIdentifier: String

    package init(
        message: String, stalls: Int, units: Int, windowMicroseconds: UInt64, worstMicroseconds: UInt64,
        worstUnit: String, worstFrame: String, priority: Int = 6, syslogIdentifier: String = "stallmond"
    ) {
        self.message = message
        self.stalls = stalls
        self.units = units
        self.windowMicroseconds = windowMicroseconds
        self.worstMicroseconds = worstMicroseconds
        self.worstUnit = worstUnit
        self.worstFrame = worstFrame
        self.priority = priority
        self.syslogIdentifier = syslogIdentifier
    }

    public enum Field {
        public static let stalls = "STALLMOND_STALLS"
        public static let units = "STALLMOND_UNITS"
        public static let windowMicroseconds = "STALLMOND_WINDOW_USEC"
        public static let worstMicroseconds = "STALLMOND_WORST_USEC"
        public static let worstUnit = "STALLMOND_WORST_UNIT"
        public static let worstFrame = "STALLMOND_WORST_FRAME"
    }

    /// The entry's fields, every value clamped to its bound in ``FieldLimits``.
    package var fields: [JournalField] {
        [
            JournalField("MESSAGE_ID", MessageID.collectorDigest),
            JournalField("MESSAGE", FieldLimits.clamp(message, toBytes: FieldLimits.messageBytes)),
            JournalField("PRIORITY", String(min(max(priority, 0), 7))),
            JournalField("SYSLOG_IDENTIFIER", FieldLimits.identifier(syslogIdentifier)),
            JournalField(Field.stalls, String(FieldLimits.count(stalls))),
            JournalField(Field.units, String(FieldLimits.count(units))),
            JournalField(Field.windowMicroseconds, String(FieldLimits.microseconds(windowMicroseconds))),
            JournalField(Field.worstMicroseconds, String(FieldLimits.microseconds(worstMicroseconds))),
            JournalField(Field.worstUnit, FieldLimits.identifier(worstUnit)),
            JournalField(Field.worstFrame, FieldLimits.clamp(worstFrame, toBytes: FieldLimits.frameBytes)),
        ]
    }

    /// Decodes an entry read from the journal (``JournalEntry/fields``, or a line of `journalctl -o json`),
    /// holding every field to the bound that writers clamp it to.
    /// - Throws: ``JournalDecodingError`` naming the field that is missing, malformed or out of bounds.
    public init(journalFields fields: [String: String]) throws(JournalDecodingError) {
        let reader = FieldReader(fields: fields)
        let messageID = try reader.string("MESSAGE_ID", maximumBytes: 32)
        guard messageID == MessageID.collectorDigest else {
            throw JournalDecodingError(field: "MESSAGE_ID", value: messageID, reason: "not a collector digest")
        }
        message = try reader.string("MESSAGE", maximumBytes: FieldLimits.messageBytes)
        priority = try reader.priority()
        syslogIdentifier = reader.identifier("SYSLOG_IDENTIFIER") ?? ""
        stalls = try reader.count(Field.stalls)
        units = try reader.count(Field.units)
        windowMicroseconds = try reader.microseconds(Field.windowMicroseconds)
        worstMicroseconds = try reader.microseconds(Field.worstMicroseconds)
        worstUnit = reader.identifier(Field.worstUnit) ?? ""
        worstFrame = try reader.optionalString(Field.worstFrame, maximumBytes: FieldLimits.frameBytes) ?? ""
    }
}
