import Foundation

/// A mutex for classes that guard several stored properties at once.
final class Lock: @unchecked Sendable {
    private let lock = NSLock()

    func withLock<Result>(_ body: () throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}
