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
}
