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

    public init(
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

    public var fields: [JournalField] {
        [
            JournalField("MESSAGE_ID", MessageID.collectorDigest),
            JournalField("MESSAGE", message),
            JournalField("PRIORITY", String(priority)),
            JournalField("SYSLOG_IDENTIFIER", syslogIdentifier),
            JournalField(Field.stalls, String(stalls)),
            JournalField(Field.units, String(units)),
            JournalField(Field.windowMicroseconds, String(windowMicroseconds)),
            JournalField(Field.worstMicroseconds, String(worstMicroseconds)),
            JournalField(Field.worstUnit, worstUnit),
            JournalField(Field.worstFrame, worstFrame),
        ]
    }

    /// Decodes an entry read from the journal.
    /// - Throws: ``JournalDecodingError`` naming the field that is missing or malformed.
    public init(journalFields fields: [String: String]) throws(JournalDecodingError) {
        let reader = FieldReader(fields: fields)
        let messageID = try reader.string("MESSAGE_ID")
        guard messageID == MessageID.collectorDigest else {
            throw JournalDecodingError(field: "MESSAGE_ID", value: messageID, reason: "not a collector digest")
        }
        message = try reader.string("MESSAGE")
        priority = try reader.integer("PRIORITY", as: Int.self)
        syslogIdentifier = reader.optionalString("SYSLOG_IDENTIFIER") ?? ""
        stalls = try reader.integer(Field.stalls, as: Int.self)
        units = try reader.integer(Field.units, as: Int.self)
        windowMicroseconds = try reader.integer(Field.windowMicroseconds, as: UInt64.self)
        worstMicroseconds = try reader.integer(Field.worstMicroseconds, as: UInt64.self)
        worstUnit = reader.optionalString(Field.worstUnit) ?? ""
        worstFrame = reader.optionalString(Field.worstFrame) ?? ""
    }
}
