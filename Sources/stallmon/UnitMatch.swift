import StallCollector
import StallJournal

/// How `report` and `follow` keep one unit's stalls (`--unit`): the unit's own entries
/// (`_SYSTEMD_UNIT`), and the stalls stallmond saw from outside in the unit's processes, which
/// stallmond wrote as root and journald gave the process's `OBJECT_SYSTEMD_UNIT`. The journal's
/// matches select both; ``accepts(_:unit:)`` then keeps the entries that
/// ``StallObservation/subject(of:)`` attributes to the unit, so that stallmond's own unit is not
/// given the stalls it saw in others.
enum UnitMatch {
    /// The journal matches for `unit`, as terms: the fields of a term are all matched, and an entry
    /// matching any term is read. One empty term without a unit.
    static func terms(_ unit: String?) -> [[(String, String)]] {
        guard let unit else { return [[]] }
        return [
            [("_SYSTEMD_UNIT", unit)],
            [
                ("OBJECT_SYSTEMD_UNIT", unit), (StallRecord.Field.source, StallRecord.Source.external.rawValue),
                ("_UID", "0"),
            ],
        ]
    }

    /// Whether an entry the matches selected counts as `unit`'s (every entry without a unit).
    static func accepts(_ entry: JournalEntry, unit: String?) -> Bool {
        guard let unit else { return true }
        // The entry's unit fields are cut when read (JournalEntry.identityFields): so is the unit.
        return StallObservation.subject(of: entry.fields)["_SYSTEMD_UNIT"] == FieldLimits.identifier(unit)
    }
}
