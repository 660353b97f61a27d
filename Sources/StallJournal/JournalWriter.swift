#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Sends structured entries to the systemd journal, in journald's native protocol over a datagram
/// socket of its own: the writer the monitor's journal sink uses too. A send waits at most
/// ``sendTimeout`` for room in journald's queue, where libsystemd's `sd_journal_sendv` would wait
/// without limit while journald takes nothing. There is no journal but on Linux: elsewhere
/// ``isAvailable`` is false and ``send(_:)`` throws `ENOSYS`.
package struct JournalWriter: Sendable {
    /// journald's native socket, where ``isAvailable`` looks and ``send(_:)`` sends.
    package let socketPath: String
    /// How long one send may wait for journald to take the entry.
    package static let sendTimeout: Duration = .seconds(1)
    private let connection: JournalConnection

    /// - Parameter sendTimeout: How long one send may wait for journald; after such a wait, sends
    ///   are refused at once for a second (``JournalConnection``).
    package init(socketPath: String = "/run/systemd/journal/socket", sendTimeout: Duration = Self.sendTimeout) {
        self.socketPath = socketPath
        connection = JournalConnection(path: socketPath, timeout: sendTimeout)
    }

    /// Whether journald listens on ``socketPath``: a datagram socket connects to it.
    ///
    /// A missing socket, and a socket left behind by a journald that has since exited (it refuses
    /// every entry, `ECONNREFUSED`), both read as unavailable.
    /// Under systemd the socket belongs to PID 1, so a journald that restarts stays available.
    package var isAvailable: Bool {
        #if STALLMON_LINUX
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        let connected = Self.withSocketAddress(socketPath) { connect(descriptor, $0, $1) }
        return connected == 0
        #else
        false
        #endif
    }

    #if STALLMON_LINUX

    /// Calls `body` with `path` as a Unix socket address; `nil` when the path does not fit one.
    package static func withSocketAddress<Result>(
        _ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Result
    ) -> Result? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                body($0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }
    #endif

    /// Checks an entry before it is sent, whoever sends it: fields whose names journald would
    /// silently drop are rejected, and so are values that no reader would accept: a
    /// `SYSLOG_IDENTIFIER` longer than ``FieldLimits/identifierBytes`` or any value longer than
    /// ``FieldLimits/readBytes``. The records (``StallRecord``, ``SuppressionRecord``,
    /// ``DigestRecord``) clamp their own fields, far below that.
    /// - Throws: ``JournalDecodingError`` naming the field.
    package static func validate(_ fields: [JournalField]) throws(JournalDecodingError) {
        for field in fields {
            guard JournalField.isValidName(field.name) else {
                throw JournalDecodingError(field: field.name, value: nil, reason: "not a valid journal field name")
            }
            let length = field.value.utf8.count
            let limit = field.name == "SYSLOG_IDENTIFIER" ? FieldLimits.identifierBytes : FieldLimits.readBytes
            guard length <= limit else {
                throw JournalDecodingError(
                    field: field.name, value: field.value,
                    reason: "\(length) bytes long, longer than the \(limit) allowed")
            }
        }
    }

    /// Sends one entry, after ``validate(_:)``.
    /// - Throws: ``SystemdError`` naming the call that failed (`ETIMEDOUT` when journald took
    ///   nothing within ``sendTimeout``), or ``JournalDecodingError`` for a bad field name or an
    ///   over-long value.
    package func send(_ fields: [JournalField]) throws {
        do {
            try deliver(fields)
        } catch let error as JournalConnection.Failure {
            throw SystemdError(function: error.call, errno: error.code)
        }
    }

    /// ``send(_:)``, throwing the connection's own ``JournalConnection/Failure`` when journald does
    /// not take the entry (its message says so in words, for a sink's caller).
    package func deliver(_ fields: [JournalField]) throws {
        try Self.validate(fields)
        guard !fields.isEmpty else { return }
        try connection.send(JournalConnection.encode(fields))
    }
}
