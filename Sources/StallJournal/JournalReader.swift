import CSystemd

#if canImport(Glibc)
    import Glibc
#endif

/// One entry read from the journal.
public struct JournalEntry: Sendable, Hashable {
    /// Every field, by name (binary fields are decoded as UTF-8 with replacement).
    public var fields: [String: String]
    /// Where the entry is, for resuming after it (`sd_journal_get_cursor`).
    public var cursor: String
    /// Microseconds since the epoch when journald received it.
    public var realtimeMicroseconds: UInt64

    public init(fields: [String: String], cursor: String, realtimeMicroseconds: UInt64) {
        self.fields = fields
        self.cursor = cursor
        self.realtimeMicroseconds = realtimeMicroseconds
    }

    public subscript(_ name: String) -> String? { fields[name] }
}

/// Reads the system journal through libsystemd's `sd_journal` API.
///
/// - Important: Not thread-safe; use one reader from one thread.
public final class JournalReader {
    private var journal: OpaquePointer?

    /// Opens the local journal (`sd_journal_open` with `SD_JOURNAL_LOCAL_ONLY`).
    /// - Throws: ``SystemdError`` when the journal cannot be opened.
    public init() throws(SystemdError) {
        var handle: OpaquePointer?
        try SystemdError.check("sd_journal_open", sd_journal_open(&handle, Int32(SD_JOURNAL_LOCAL_ONLY)))
        journal = handle
        _ = sd_journal_set_data_threshold(journal, 0)
    }

    /// Opens the journal files in `directory` (`sd_journal_open_directory`).
    public init(directory: String) throws(SystemdError) {
        var handle: OpaquePointer?
        try SystemdError.check("sd_journal_open_directory", sd_journal_open_directory(&handle, directory, 0))
        journal = handle
        _ = sd_journal_set_data_threshold(journal, 0)
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
    public func seek(cursor: String) throws(SystemdError) {
        try SystemdError.check("sd_journal_seek_cursor", sd_journal_seek_cursor(journal, cursor))
        // sd_journal_seek_cursor positions next to the entry: step onto it so that next() moves
        // past it. When the entry is gone (vacuumed), stepping lands on a later one: step back.
        if try SystemdError.check("sd_journal_next", sd_journal_next(journal)) > 0,
            sd_journal_test_cursor(journal, cursor) <= 0
        {
            _ = sd_journal_previous(journal)
        }
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
            fields[name] = String(decoding: bytes[(equals + 1)...], as: UTF8.self)
        }
        var cursorPointer: UnsafeMutablePointer<CChar>?
        try SystemdError.check("sd_journal_get_cursor", sd_journal_get_cursor(journal, &cursorPointer))
        let cursor =
            cursorPointer.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: strlen($0)), as: UTF8.self) }
            ?? ""
        free(cursorPointer)
        var realtime: UInt64 = 0
        _ = sd_journal_get_realtime_usec(journal, &realtime)
        return JournalEntry(fields: fields, cursor: cursor, realtimeMicroseconds: realtime)
    }
}
