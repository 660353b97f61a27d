import Foundation
import StallJournal
import Testing

#if canImport(Glibc)
import Glibc
#endif

struct JournalWriterTests {
    /// A datagram socket bound at `path`, as journald binds its own; returns the descriptor.
    func bind(_ path: String) throws -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        try #require(descriptor >= 0)
        let bound = JournalWriter.withSocketAddress(path) { Glibc.bind(descriptor, $0, $1) }
        try #require(bound == 0, "bind \(path): errno \(errno)")
        return descriptor
    }

    /// Available means listening: a socket left behind by a journald that exited refuses entries.
    @Test func availableOnlyWhileSomethingListensOnTheSocket() throws {
        let directory = NSTemporaryDirectory() + "stallmon-socket-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/socket"
        let writer = JournalWriter(socketPath: path)

        #expect(!writer.isAvailable, "no socket")
        let descriptor = try bind(path)
        #expect(writer.isAvailable, "listening")
        close(descriptor)
        #expect(FileManager.default.fileExists(atPath: path))
        #expect(!writer.isAvailable, "stale socket of a listener that is gone")

        try FileManager.default.removeItem(atPath: path)
        try "not a socket".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(!writer.isAvailable, "a regular file")
        #expect(!JournalWriter(socketPath: directory + "/" + String(repeating: "x", count: 200)).isAvailable)
    }

    /// An entry goes to the writer's own socket, in journald's native format (a value with a
    /// newline as its name, its length and its bytes), and a socket that takes nothing fails the
    /// send within the timeout rather than blocking it.
    @Test func sendsTheNativeFormatToItsSocketAndNeverWaitsPastTheTimeout() throws {
        let directory = NSTemporaryDirectory() + "stallmon-socket-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/socket"
        let descriptor = try bind(path)
        defer { close(descriptor) }
        let writer = JournalWriter(socketPath: path)
        try writer.send([JournalField("MESSAGE", "hello"), JournalField("STALL_BACKTRACE", "#0\n#1")])
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(descriptor, &buffer, buffer.count, Int32(MSG_DONTWAIT))
        try #require(count > 0)
        var expected = Array("MESSAGE=hello\nSTALL_BACKTRACE\n".utf8)
        withUnsafeBytes(of: UInt64(5).littleEndian) { expected.append(contentsOf: $0) }
        expected += Array("#0\n#1\n".utf8)
        #expect(Array(buffer.prefix(count)) == expected)

        // Nothing reads the socket: its queue fills, and a send then fails after the timeout.
        let started = Date()
        var failure: SystemdError?
        for _ in 0..<10_000 {
            do {
                try writer.send([JournalField("MESSAGE", String(repeating: "x", count: 60_000))])
            } catch let error as SystemdError {
                failure = error
                break
            }
        }
        let waited = Date().timeIntervalSince(started)
        #expect(failure?.errno == ETIMEDOUT, "\(String(describing: failure))")
        #expect(waited < JournalWriter.sendTimeout / .seconds(1) + 5, "\(waited) s")
    }
}
