#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if STALLMON_LINUX
import Synchronization

/// A datagram socket of our own to journald, speaking its native protocol, with every send bounded.
///
/// libsystemd's `sd_journal_sendv` blocks without limit while journald takes no entries (its
/// socket's queue holds `net.unix.max_dgram_qlen` datagrams, 10 by default, then the sender
/// waits), and reports success without sending anything when the socket file is missing. Here a
/// send waits at most `timeout` for room; after a send timed out, the connection refuses sends at
/// once for `backoff`, so a backlog of reports costs one timeout, not one each. A journald that
/// restarted on a new socket is found again on the next send.
///
/// The one writer of journal entries: ``JournalWriter`` (stallmond, the CLI) and the monitor's
/// `JournalSink` send through it.
package final class JournalConnection: Sendable {
    /// Why an entry did not reach journald.
    package struct Failure: Error, CustomStringConvertible {
        /// The errno of the failed call; `ETIMEDOUT` when journald took nothing within the timeout.
        package var code: Int32
        package var call: String

        package var description: String {
            code == ETIMEDOUT ? "journald took no entry within the send timeout" : "\(call): \(Self.message(code))"
        }

        private static func message(_ code: Int32) -> String {
            strerror(code).map { String(cString: $0) } ?? "errno \(code)"
        }
    }

    package let path: String
    private let timeout: UInt64
    private let backoff: UInt64
    private let state = Mutex<State>(State())

    private struct State {
        var descriptor: Int32 = -1
        /// Until when sends fail at once: journald did not take the last entry in time.
        var refuseUntil: UInt64 = 0
    }

    /// - Parameters:
    ///   - path: journald's native socket.
    ///   - timeout: How long one send may wait for room in the socket's queue.
    ///   - backoff: How long sends fail at once after one timed out.
    package init(path: String, timeout: Duration, backoff: Duration = .seconds(1)) {
        self.path = path
        self.timeout = Self.nanoseconds(timeout)
        self.backoff = Self.nanoseconds(backoff)
    }

    private static func nanoseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0, attoseconds >= 0 else { return 0 }
        return UInt64(clamping: seconds) &* 1_000_000_000 &+ UInt64(attoseconds / 1_000_000_000)
    }

    deinit {
        state.withLock { if $0.descriptor >= 0 { close($0.descriptor) } }
    }

    /// Sends one entry in the native format (see ``encode(_:)``).
    /// - Throws: ``Failure`` when journald does not take it.
    package func send(_ datagram: [UInt8]) throws(Failure) {
        try state.withLock { (state: inout State) throws(Failure) in
            let start = MonotonicClock.now()
            guard start >= state.refuseUntil else { throw Failure(code: ETIMEDOUT, call: "send") }
            var reconnected = false
            while true {
                if state.descriptor < 0 {
                    state.descriptor = try connectSocket()
                    reconnected = true
                }
                let descriptor = state.descriptor
                let sent = datagram.withUnsafeBytes {
                    Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                if sent >= 0 { return }
                let code = errno
                if code == EINTR { continue }
                if code == EAGAIN {
                    // The queue is full: wait for room, up to the timeout.
                    let elapsed = MonotonicClock.now() - start
                    guard elapsed < timeout, waitWritable(state.descriptor, for: timeout - elapsed) else {
                        state.refuseUntil = MonotonicClock.now() + backoff
                        throw Failure(code: ETIMEDOUT, call: "send")
                    }
                    continue
                }
                if [ECONNREFUSED, ENOTCONN, ECONNRESET, EPIPE].contains(code) {
                    // journald went away; a new one may listen on a new socket at the same path.
                    close(state.descriptor)
                    state.descriptor = -1
                    if !reconnected { continue }
                }
                throw Failure(code: code, call: "send")
            }
        }
    }

    private func connectSocket() throws(Failure) -> Int32 {
        let descriptor = socket(
            AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(code: errno, call: "socket") }
        // As libsystemd does: room for large entries (capped by net.core.wmem_max).
        var size: Int32 = 8 * 1024 * 1024
        _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        let connected = JournalWriter.withSocketAddress(path) { connect(descriptor, $0, $1) }
        guard connected == 0 else {
            let code = connected == nil ? ENAMETOOLONG : errno
            close(descriptor)
            throw Failure(code: code, call: "connect \(path)")
        }
        return descriptor
    }

    private func waitWritable(_ descriptor: Int32, for nanoseconds: UInt64) -> Bool {
        var entry = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
        let milliseconds = Int32(clamping: (nanoseconds + 999_999) / 1_000_000)
        let ready = poll(&entry, 1, milliseconds)
        return ready > 0
    }

    /// journald's native format: `NAME=value\n` per field, or, for a value holding a newline,
    /// `NAME\n`, its length as 64-bit little-endian, the value and `\n`.
    package static func encode(_ fields: [JournalField]) -> [UInt8] {
        var datagram: [UInt8] = []
        for field in fields {
            datagram.append(contentsOf: field.name.utf8)
            let value = Array(field.value.utf8)
            if value.contains(UInt8(ascii: "\n")) {
                datagram.append(UInt8(ascii: "\n"))
                withUnsafeBytes(of: UInt64(value.count).littleEndian) { datagram.append(contentsOf: $0) }
            } else {
                datagram.append(UInt8(ascii: "="))
            }
            datagram.append(contentsOf: value)
            datagram.append(UInt8(ascii: "\n"))
        }
        return datagram
    }
}
#else
/// No journald here: every send fails, so a `JournalSink` hands each entry to its fallback (the
/// default sinks' standard error) or counts it as lost, and ``JournalWriter`` throws `ENOSYS`.
package final class JournalConnection: Sendable {
    package struct Failure: Error, CustomStringConvertible {
        package var code: Int32 { ENOSYS }
        package var call: String { "send" }
        package var description: String { "there is no journald on this platform" }
    }

    package let path: String

    package init(path: String, timeout: Duration, backoff: Duration = .seconds(1)) {
        self.path = path
    }

    package func send(_ datagram: [UInt8]) throws(Failure) {
        throw Failure()
    }

    package static func encode(_ fields: [JournalField]) -> [UInt8] { [] }
}
#endif  // STALLMON_LINUX
