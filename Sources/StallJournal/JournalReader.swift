#if STALLMON_LINUX
import CSystemd
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One entry read from the journal.
public struct JournalEntry: Sendable, Hashable {
    /// Every field, by name (binary fields are decoded as UTF-8 with replacement). A
    /// ``JournalReader`` keeps at most 64 KiB of each, and cuts the sender's names (`_SYSTEMD_UNIT`,
    /// `_SYSTEMD_USER_UNIT`, `SYSLOG_IDENTIFIER`, `_HOSTNAME`) to 256 bytes, ending in `…`.
    public var fields: [String: String]
    /// Where the entry is, for resuming after it (`sd_journal_get_cursor`).
    public var cursor: String
    /// Microseconds since the epoch when journald received it.
    public var realtimeMicroseconds: UInt64
    /// The sender's boot (`_BOOT_ID`, as 32 hex digits) and the microseconds since that boot when
    /// journald received it (`sd_journal_get_monotonic_usec`): within one boot of one machine,
    /// the order in which its journald received entries. Empty and 0 where unknown.
    public var bootID: String
    public var monotonicMicroseconds: UInt64

    package init(
        fields: [String: String], cursor: String, realtimeMicroseconds: UInt64, bootID: String = "",
        monotonicMicroseconds: UInt64 = 0
    ) {
        self.fields = fields
        self.cursor = cursor
        self.realtimeMicroseconds = realtimeMicroseconds
        self.bootID = bootID
        self.monotonicMicroseconds = monotonicMicroseconds
    }

    /// The value of field `name`, `nil` when the entry has none.
    public subscript(_ name: String) -> String? { fields[name] }

    /// The fields that name the sender, which readers group by: cut, never rejected, when too long.
    package static let identityFields: Set<String> = [
        "_SYSTEMD_UNIT", "_SYSTEMD_USER_UNIT", "SYSLOG_IDENTIFIER", "_HOSTNAME",
        // A stall stallmond saw from outside is the watched process's (StallObservation.subject(of:)).
        "OBJECT_SYSTEMD_UNIT", "OBJECT_SYSTEMD_USER_UNIT",
    ]

    /// The machine the entry came from: `_MACHINE_ID` when it is 32 lowercase hex digits (journald
    /// always sets it, and `systemd-journal-remote` keeps the sender's), else `nil`.
    public var machineID: String? {
        guard let id = fields["_MACHINE_ID"], JournalEntry.isMachineID(id) else { return nil }
        return id
    }

    /// Whether `text` is a machine id: 32 lowercase hex digits.
    package static func isMachineID(_ text: String) -> Bool {
        text.utf8.count == 32 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

#if STALLMON_LINUX
/// Reads the system journal through libsystemd's `sd_journal` API.
///
/// - Important: Not thread-safe; use one reader from one thread.
public final class JournalReader {
    private var journal: OpaquePointer?
    /// The journal namespace read, `nil` for the default one; `nil` too for a directory.
    private let namespace: String?
    private let isSystemJournal: Bool

    /// Opens the local journal (`sd_journal_open` with `SD_JOURNAL_LOCAL_ONLY`), or the journal of
    /// a namespace (`LogNamespace=`; `sd_journal_open_namespace`).
    /// - Throws: ``SystemdError`` when the journal cannot be opened.
    public init(namespace: String? = nil) throws(SystemdError) {
        var handle: OpaquePointer?
        if let namespace {
            try SystemdError.check(
                "sd_journal_open_namespace",
                sd_journal_open_namespace(&handle, namespace, Int32(SD_JOURNAL_LOCAL_ONLY)))
        } else {
            try SystemdError.check("sd_journal_open", sd_journal_open(&handle, Int32(SD_JOURNAL_LOCAL_ONLY)))
        }
        journal = handle
        self.namespace = namespace
        isSystemJournal = true
        // Compressed fields are decompressed only this far (a hint: uncompressed ones come whole).
        _ = sd_journal_set_data_threshold(journal, FieldLimits.readBytes + 1)
    }

    /// Opens every journal this machine may read, the remote and container ones included
    /// (`sd_journal_open` without `SD_JOURNAL_LOCAL_ONLY`, as `journalctl --merge`).
    public init(merge: Bool) throws(SystemdError) {
        var handle: OpaquePointer?
        try SystemdError.check(
            "sd_journal_open", sd_journal_open(&handle, merge ? 0 : Int32(SD_JOURNAL_LOCAL_ONLY)))
        journal = handle
        namespace = nil
        isSystemJournal = !merge
        _ = sd_journal_set_data_threshold(journal, FieldLimits.readBytes + 1)
    }

    /// Opens the journal files in `directory` and in its machine-id subdirectories
    /// (`sd_journal_open_directory`, as `journalctl --directory`): `/var/log/journal/remote` for
    /// what `systemd-journal-remote` received. Files that appear later are read too.
    public init(directory: String) throws(SystemdError) {
        var handle: OpaquePointer?
        try SystemdError.check("sd_journal_open_directory", sd_journal_open_directory(&handle, directory, 0))
        journal = handle
        namespace = nil
        isSystemJournal = false
        _ = sd_journal_set_data_threshold(journal, FieldLimits.readBytes + 1)
    }

    deinit {
        sd_journal_close(journal)
    }

    /// Adds a `FIELD=value` match; matches on different fields must all hold, matches on the same
    /// field are alternatives. The corresponding C function is `sd_journal_add_match`.
    public func addMatch(_ field: String, _ value: String) throws(SystemdError) {
        let match = Array("\(field)=\(value)".utf8)
        let result = match.withUnsafeBytes { sd_journal_add_match(journal, $0.baseAddress, $0.count) }
        try SystemdError.check("sd_journal_add_match", result)
    }

    /// Drops every match (`sd_journal_flush_matches`).
    public func flushMatches() {
        sd_journal_flush_matches(journal)
    }

    /// The values `field` takes in the journal's files, at most `limit` of them
    /// (`sd_journal_query_unique`); matches do not apply.
    public func uniqueValues(of field: String, limit: Int) throws(SystemdError) -> [String] {
        try SystemdError.check("sd_journal_query_unique", sd_journal_query_unique(journal, field))
        var values: [String] = []
        var data: UnsafeRawPointer?
        var length = 0
        while values.count < limit,
            try SystemdError.check("sd_journal_enumerate_unique", sd_journal_enumerate_unique(journal, &data, &length))
                > 0
        {
            guard let data else { continue }
            let bytes = UnsafeRawBufferPointer(start: data, count: length)
            guard let equals = bytes.firstIndex(of: UInt8(ascii: "=")) else { continue }
            values.append(String(decoding: bytes[(equals + 1)...].prefix(FieldLimits.readBytes), as: UTF8.self))
        }
        return values
    }

    /// Starts a new group of matches, alternative to the ones before (`sd_journal_add_disjunction`).
    public func addDisjunction() throws(SystemdError) {
        try SystemdError.check("sd_journal_add_disjunction", sd_journal_add_disjunction(journal))
    }

    public func seekHead() throws(SystemdError) {
        try SystemdError.check("sd_journal_seek_head", sd_journal_seek_head(journal))
    }

    public func seekTail() throws(SystemdError) {
        try SystemdError.check("sd_journal_seek_tail", sd_journal_seek_tail(journal))
    }

    /// Positions the reader at the entry with `cursor`; ``next()`` then returns the entry after it.
    /// - Returns: `false` when the journal no longer holds that entry (vacuumed, or its file
    ///   removed): ``next()`` then returns the first entry after where it was.
    /// - Throws: ``SystemdError`` (`EINVAL`) for a cursor the journal cannot parse.
    @discardableResult
    public func seek(cursor: String) throws(SystemdError) -> Bool {
        try SystemdError.check("sd_journal_seek_cursor", sd_journal_seek_cursor(journal, cursor))
        // sd_journal_seek_cursor positions next to the entry: step onto it so that next() moves
        // past it. When the entry is gone (vacuumed), stepping lands on a later one: step back.
        if try SystemdError.check("sd_journal_next", sd_journal_next(journal)) > 0,
            sd_journal_test_cursor(journal, cursor) <= 0
        {
            _ = sd_journal_previous(journal)
            return false
        }
        return true
    }

    /// Positions the reader at the entries of boot `bootID` (32 hex digits) received
    /// `monotonicMicroseconds` after it booted (`sd_journal_seek_monotonic_usec`); ``next()``
    /// then returns the first at or after that time.
    public func seek(bootID: String, monotonicMicroseconds: UInt64) throws(SystemdError) {
        var boot = sd_id128_t()
        try SystemdError.check("sd_id128_from_string", sd_id128_from_string(bootID, &boot))
        try SystemdError.check(
            "sd_journal_seek_monotonic_usec", sd_journal_seek_monotonic_usec(journal, boot, monotonicMicroseconds))
    }

    /// Positions the reader at entries received since `realtimeMicroseconds`.
    public func seek(realtimeMicroseconds: UInt64) throws(SystemdError) {
        try SystemdError.check(
            "sd_journal_seek_realtime_usec", sd_journal_seek_realtime_usec(journal, realtimeMicroseconds))
    }

    /// The next matching entry, or `nil` at the end.
    public func next() throws(SystemdError) -> JournalEntry? {
        guard try SystemdError.check("sd_journal_next", sd_journal_next(journal)) > 0 else { return nil }
        return try current()
    }

    /// The previous matching entry, or `nil` at the start.
    public func previous() throws(SystemdError) -> JournalEntry? {
        guard try SystemdError.check("sd_journal_previous", sd_journal_previous(journal)) > 0 else { return nil }
        return try current()
    }

    /// Moves back over at most `count` matching entries (`sd_journal_previous_skip`), reading none
    /// of their fields; returns how many it moved over (fewer at the start of the journal).
    /// ``currentEntry()`` then reads the one it stopped on.
    package func skipBackward(_ count: Int) throws(SystemdError) -> Int {
        guard count > 0 else { return 0 }
        return Int(
            try SystemdError.check(
                "sd_journal_previous_skip", sd_journal_previous_skip(journal, UInt64(min(count, Int(Int32.max))))))
    }

    /// The entry the reader stands on (after ``skipBackward(_:)``, ``next()`` or ``previous()``).
    package func currentEntry() throws(SystemdError) -> JournalEntry { try current() }

    /// A descriptor that becomes readable when the journal changes (`sd_journal_get_fd`); call
    /// ``process()`` when it does.
    public func fileDescriptor() throws(SystemdError) -> Int32 {
        try SystemdError.check("sd_journal_get_fd", sd_journal_get_fd(journal))
    }

    /// Acknowledges a wakeup of ``fileDescriptor()`` (`sd_journal_process`).
    @discardableResult
    public func process() throws(SystemdError) -> Int32 {
        try SystemdError.check("sd_journal_process", sd_journal_process(journal))
    }

    /// How long a `poll` on ``fileDescriptor()`` may wait before ``process()`` must be called
    /// anyway, in microseconds; `nil` for as long as it takes (`sd_journal_get_timeout`, as a
    /// relative time).
    public func pollTimeoutMicroseconds() throws(SystemdError) -> UInt64? {
        var deadline: UInt64 = 0
        try SystemdError.check("sd_journal_get_timeout", sd_journal_get_timeout(journal, &deadline))
        guard deadline != UInt64.max else { return nil }
        let current = MonotonicClock.microseconds()
        return deadline > current ? deadline - current : 0
    }

    /// Journal files and directories this process may not read: `sd_journal_open` skips them
    /// without an error, so a reader without permission (outside the `systemd-journal` group)
    /// would see an empty journal. Empty when every file of this machine's journal (in the
    /// namespace read) is readable, under `/run/log/journal` and `/var/log/journal`; always empty
    /// for a reader of a directory.
    public func unreadablePaths() -> [String] {
        guard isSystemJournal else { return [] }
        var machine = sd_id128_t()
        let machineID: String? =
            sd_id128_get_machine(&machine) >= 0
            ? withUnsafeBytes(of: machine.bytes) { bytes in
                bytes.map { String(repeating: "0", count: $0 < 16 ? 1 : 0) + String($0, radix: 16) }.joined()
            } : nil
        var denied: [String] = []
        for root in ["/run/log/journal", "/var/log/journal"] {
            let (names, error) = Self.directoryEntries(root)
            if error == EACCES { denied.append(root) }
            for name in names {
                // This machine's directory: `<machine-id>`, or `<machine-id>.<namespace>`.
                let parts = name.split(separator: ".", maxSplits: 1).map(String.init)
                guard let id = parts.first, id.utf8.count == 32, machineID == nil || id == machineID,
                    parts.count == 2 ? parts[1] == namespace : namespace == nil
                else { continue }
                let directory = root + "/" + name
                let (files, error) = Self.directoryEntries(directory)
                if error == EACCES { denied.append(directory) }
                for file in files where file.hasSuffix(".journal") {
                    let path = directory + "/" + file
                    if faccessat(AT_FDCWD, path, R_OK, AT_EACCESS) != 0, errno == EACCES { denied.append(path) }
                }
            }
        }
        return denied
    }

    /// The names in a directory, or the errno that kept it from being read.
    private static func directoryEntries(_ path: String) -> (names: [String], error: Int32) {
        guard let directory = opendir(path) else { return ([], errno) }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { bytes in
                String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != ".", name != ".." { names.append(name) }
        }
        return (names, 0)
    }

    /// Waits up to `timeoutMicroseconds` for changes (`sd_journal_wait`).
    @discardableResult
    public func wait(timeoutMicroseconds: UInt64) throws(SystemdError) -> Int32 {
        try SystemdError.check("sd_journal_wait", sd_journal_wait(journal, timeoutMicroseconds))
    }

    private func current() throws(SystemdError) -> JournalEntry {
        var fields: [String: String] = [:]
        var data: UnsafeRawPointer?
        var length = 0
        sd_journal_restart_data(journal)
        while try SystemdError.check("sd_journal_enumerate_data", sd_journal_enumerate_data(journal, &data, &length))
            > 0
        {
            guard let data else { continue }
            let bytes = UnsafeRawBufferPointer(start: data, count: length)
            guard let equals = bytes.firstIndex(of: UInt8(ascii: "=")) else { continue }
            let name = String(decoding: bytes[..<equals], as: UTF8.self)
            // At most readBytes (and a byte more, so the schema sees it is too long): a hostile
            // entry's field costs no more than that, whatever its size in the journal.
            let value = bytes[(equals + 1)...].prefix(FieldLimits.readBytes + 1)
            let text = String(decoding: value, as: UTF8.self)
            fields[name] = JournalEntry.identityFields.contains(name) ? FieldLimits.identifier(text) : text
        }
        var cursorPointer: UnsafeMutablePointer<CChar>?
        try SystemdError.check("sd_journal_get_cursor", sd_journal_get_cursor(journal, &cursorPointer))
        let cursor =
            cursorPointer.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: strlen($0)), as: UTF8.self) }
            ?? ""
        free(cursorPointer)
        var realtime: UInt64 = 0
        _ = sd_journal_get_realtime_usec(journal, &realtime)
        var monotonic: UInt64 = 0
        var boot = sd_id128_t()
        let bootID =
            sd_journal_get_monotonic_usec(journal, &monotonic, &boot) >= 0
            ? withUnsafeBytes(of: boot.bytes) { bytes in
                bytes.map { String(repeating: "0", count: $0 < 16 ? 1 : 0) + String($0, radix: 16) }.joined()
            } : ""
        return JournalEntry(
            fields: fields, cursor: cursor, realtimeMicroseconds: realtime, bootID: bootID,
            monotonicMicroseconds: bootID.isEmpty ? 0 : monotonic)
    }
}
#endif  // STALLMON_LINUX
