import StallConfiguration
import StallJournal

/// One stall as the collector counts it, from an ended (or watchdog) journal entry.
package struct StallObservation: Sendable, Hashable {
    /// `_SYSTEMD_UNIT`, or `SYSLOG_IDENTIFIER` for processes outside a unit.
    package var unit: String
    package var stallID: String
    package var fingerprint: String
    package var frame: String
    package var callout: String
    package var durationMicroseconds: UInt64
    /// When journald received the entry (microseconds since the epoch).
    package var realtimeMicroseconds: UInt64
    package var backtrace: String
    /// A stall that outlasted `WatchdogSec=` (systemd killed the service).
    package var isWatchdog: Bool
    /// The machine it happened on (`_MACHINE_ID`; empty where the entry has none)…
    package var machineID: String
    /// …and that machine's name (`_HOSTNAME`, cut like other identities; empty where none).
    package var host: String
    /// Who wrote it, by journald's trusted fields: `nil` for a system unit, else the writer's
    /// `_UID` (`""` where the entry has none). See ``owner(of:)``.
    package var owner: String?
    /// The request the stall served (`STALL_REQUEST_*`, `STALL_TRACE_ID`), `nil` outside any.
    package var request: StallRecord.Request?
    /// Whether stallmond saw it from outside and it is attributed to the watched process
    /// (``isSeenFromOutside(_:)``).
    package var seenFromOutside = false

    package init(
        unit: String, stallID: String, fingerprint: String, frame: String, callout: String,
        durationMicroseconds: UInt64, realtimeMicroseconds: UInt64, backtrace: String, isWatchdog: Bool,
        machineID: String = "", host: String = ""
    ) {
        self.machineID = machineID
        self.host = host
        self.unit = unit
        self.stallID = stallID
        self.fingerprint = fingerprint
        self.frame = frame
        self.callout = callout
        self.durationMicroseconds = durationMicroseconds
        self.realtimeMicroseconds = realtimeMicroseconds
        self.backtrace = backtrace
        self.isWatchdog = isWatchdog
    }

    /// The unit an entry came from: `_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`, or `(SYSLOG_IDENTIFIER)`
    /// outside any unit. Outside a system unit and written by a user other than root, the
    /// writer's `_UID` follows, `(tool) (uid 1000)`: anyone may write any identifier, so two
    /// users' entries are never one series.
    package static func unit(of fields: [String: String]) -> String {
        unit(named: name(of: fields), owner: owner(of: fields))
    }

    /// The trusted fields an entry is attributed by: its own, or for a stall stallmond saw from
    /// outside (`STALL_SOURCE=external`, `OBJECT_PID=`) written by root, the watched process's,
    /// which journald added as `OBJECT_SYSTEMD_UNIT`, `OBJECT_UID`, … . journald adds those for a
    /// writer of UID 0 only, and a writer that is not root cannot pass its own for the
    /// underscore fields: its entries stay its own.
    /// `_PID` is the watched process's too (`OBJECT_PID`), for those who show it.
    package static func subject(of fields: [String: String]) -> [String: String] {
        guard isSeenFromOutside(fields) else { return fields }
        var subject = fields
        for (trusted, object) in objectFields {
            subject[trusted] = fields[object]
        }
        return subject
    }

    /// Whether an entry is a stall stallmond saw from outside that counts as the watched
    /// process's: ``StallJournal/StallRecord/Source/external`` (`STALL_SOURCE=external`), with
    /// `OBJECT_PID=`, written by root (`_UID` 0). Anyone may write `STALL_SOURCE=external`; on
    /// another writer's entry it is the writer's own stall, attributed to the writer.
    package static func isSeenFromOutside(_ fields: [String: String]) -> Bool {
        fields[StallRecord.Field.source] == StallRecord.Source.external.rawValue && fields["_UID"] == "0"
            && fields["OBJECT_PID"] != nil
    }

    /// The trusted fields of a writer and the `OBJECT_` fields journald adds for the process an
    /// entry names (`OBJECT_PID` itself is the writer's, trusted as root's).
    static let objectFields = [
        ("_SYSTEMD_UNIT", "OBJECT_SYSTEMD_UNIT"), ("_SYSTEMD_USER_UNIT", "OBJECT_SYSTEMD_USER_UNIT"),
        ("_SYSTEMD_OWNER_UID", "OBJECT_SYSTEMD_OWNER_UID"), ("_SYSTEMD_SLICE", "OBJECT_SYSTEMD_SLICE"),
        ("_UID", "OBJECT_UID"), ("_COMM", "OBJECT_COMM"), ("_PID", "OBJECT_PID"),
    ]

    /// The unit an entry names, before its writer's uid: `_SYSTEMD_UNIT`, `_SYSTEMD_USER_UNIT`, or
    /// `(SYSLOG_IDENTIFIER)`. See ``unit(of:)``.
    package static func name(of fields: [String: String]) -> String {
        let fields = subject(of: fields)
        return fields["_SYSTEMD_UNIT"] ?? fields["_SYSTEMD_USER_UNIT"] ?? fields["SYSLOG_IDENTIFIER"].map { "(\($0))" }
            ?? "(unknown)"
    }

    /// `name` as ``unit(of:)`` shows it for a writer (``owner(of:)``): ` (uid N)` after it, unless a
    /// system unit or root wrote it. A caller that cuts the name for its output (`stallmon follow`)
    /// cuts it before, so that the uid is always seen.
    package static func unit(named name: String, owner: String?) -> String {
        guard let owner, !owner.isEmpty, owner != "0" else { return name }
        return name + " (uid \(owner))"
    }

    /// Who wrote an entry, by the fields journald sets itself and no writer can forge: `nil` when
    /// a system unit did (`_SYSTEMD_UNIT`, outside any user's slice, session or user manager:
    /// no `_SYSTEMD_USER_UNIT` and no `_SYSTEMD_OWNER_UID`), else the writer's `_UID` (`""`
    /// where the entry has none, as in an exported journal without it).
    package static func owner(of fields: [String: String]) -> String? {
        let fields = subject(of: fields)
        if let unit = fields["_SYSTEMD_UNIT"], fields["_SYSTEMD_USER_UNIT"] == nil,
            fields["_SYSTEMD_OWNER_UID"] == nil, !(fields["_SYSTEMD_SLICE"]?.hasPrefix("user") ?? false),
            !(unit.hasPrefix("session-") && unit.hasSuffix(".scope")), !unit.hasPrefix("user@"),
            !unit.hasPrefix("user-runtime-dir@")
        {
            return nil
        }
        guard let uid = fields["_UID"], (1...10).contains(uid.utf8.count),
            uid.utf8.allSatisfy({ (48...57).contains($0) })
        else { return "" }
        return uid
    }

    package init(
        record: StallRecord, unit: String, realtimeMicroseconds: UInt64, machineID: String = "", host: String = ""
    ) {
        self.init(
            unit: unit, stallID: record.stallID, fingerprint: record.fingerprint, frame: record.frame,
            callout: record.callout, durationMicroseconds: record.durationMicroseconds,
            realtimeMicroseconds: realtimeMicroseconds, backtrace: record.backtrace,
            isWatchdog: record.event == .watchdog, machineID: machineID, host: host
        )
        request = record.request
    }

    /// A stall read from `entry`, with its unit, writer, time and host.
    package init(record: StallRecord, entry: JournalEntry) {
        self.init(
            record: record, unit: Self.unit(of: entry.fields), realtimeMicroseconds: entry.realtimeMicroseconds,
            machineID: entry.machineID ?? "", host: entry["_HOSTNAME"] ?? "")
        owner = Self.owner(of: entry.fields)
        seenFromOutside = Self.isSeenFromOutside(entry.fields)
    }
}
