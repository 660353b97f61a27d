#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A libsystemd call that failed, as ``JournalReader`` throws it: the function and its `errno`
/// (libsystemd returns `-errno`).
public struct SystemdError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The C function that failed, e.g. `sd_journal_open` or `send`.
    public var function: String
    /// The positive errno value.
    public var errno: Int32

    package init(function: String, errno: Int32) {
        self.function = function
        self.errno = errno
    }

    public var description: String {
        "\(function): \(String(cString: strerror(errno))) (errno \(errno))"
    }

    /// Returns `result` when it is not negative, and throws for `-errno` otherwise.
    @discardableResult
    package static func check(_ function: String, _ result: Int32) throws(SystemdError) -> Int32 {
        guard result >= 0 else { throw SystemdError(function: function, errno: -result) }
        return result
    }
}
