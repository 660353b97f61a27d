import CSystemd

#if canImport(Glibc)
    import Glibc
#endif

/// Sends structured entries to the systemd journal.
///
/// The corresponding C function is `sd_journal_sendv` (`sd_journal_send` is variadic and cannot be
/// called from Swift).
public struct JournalWriter: Sendable {
    /// Where journald listens for native-protocol entries.
    public var socketPath: String

    public init(socketPath: String = "/run/systemd/journal/socket") {
        self.socketPath = socketPath
    }

    /// Whether a journald socket exists. Without one, `sd_journal_sendv` succeeds and sends nothing.
    public var isAvailable: Bool {
        var status = stat()
        return stat(socketPath, &status) == 0 && (status.st_mode & S_IFMT) == S_IFSOCK
    }

    /// Sends one entry. Fields whose names journald would silently drop are rejected up front.
    /// - Throws: ``SystemdError`` from `sd_journal_sendv`, or ``JournalDecodingError`` for a bad field name.
    public func send(_ fields: [JournalField]) throws {
        for field in fields where !JournalField.isValidName(field.name) {
            throw JournalDecodingError(field: field.name, value: nil, reason: "not a valid journal field name")
        }
        guard !fields.isEmpty else { return }
        // All fields in one buffer; each iovec points at its NAME=value slice.
        var buffer = [UInt8]()
        var ranges = [Range<Int>]()
        ranges.reserveCapacity(fields.count)
        for field in fields {
            let start = buffer.count
            buffer.append(contentsOf: field.name.utf8)
            buffer.append(UInt8(ascii: "="))
            buffer.append(contentsOf: field.value.utf8)
            ranges.append(start..<buffer.count)
        }
        let result = buffer.withUnsafeMutableBytes { bytes in
            let vectors = ranges.map { iovec(iov_base: bytes.baseAddress! + $0.lowerBound, iov_len: $0.count) }
            return vectors.withUnsafeBufferPointer { sd_journal_sendv($0.baseAddress, Int32($0.count)) }
        }
        try SystemdError.check("sd_journal_sendv", result)
    }
}
