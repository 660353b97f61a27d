import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A copy of the libFoundation this process runs with, stripped of its local symbols
/// (`strip --strip-unneeded`, as distributions ship libraries), for child processes started with
/// ``environment()``: CoreFoundation's callout and wait functions have no names there.
package enum StrippedFoundation {
    package struct Failure: Error, CustomStringConvertible {
        package var description: String
    }

    /// The warning a monitor logs, once, when CoreFoundation's symbols are missing.
    package static let warning = "CoreFoundation's local symbols are missing"

    /// `LD_LIBRARY_PATH` with the stripped copy first, then the original's folder for its neighbours.
    package static func environment() throws -> [String: String] { try made.get() }

    private static let made = Result { () throws -> [String: String] in try make() }

    private static func make() throws -> [String: String] {
        // procfs files report no size: read to the end rather than by size.
        let data = FileHandle(forReadingAtPath: "/proc/self/maps")?.readDataToEndOfFile() ?? Data()
        let maps = String(decoding: data, as: UTF8.self)
        guard let line = maps.split(separator: "\n").first(where: { $0.hasSuffix("/libFoundation.so") }),
            let original = line.split(separator: " ").last.map(String.init)
        else { throw Failure(description: "libFoundation.so is not mapped in the test process") }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-stripped-foundation-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        strippedDirectory = directory.path
        atexit { try? FileManager.default.removeItem(atPath: StrippedFoundation.strippedDirectory) }
        let strip = Process()
        strip.executableURL = URL(fileURLWithPath: "/usr/bin/strip")
        strip.arguments = [
            "--strip-unneeded", "-o", directory.appendingPathComponent("libFoundation.so").path, original,
        ]
        try strip.run()
        strip.waitUntilExit()
        guard strip.terminationStatus == 0 else {
            throw Failure(description: "strip --strip-unneeded \(original) exited \(strip.terminationStatus)")
        }
        let originalDirectory = URL(fileURLWithPath: original).deletingLastPathComponent().path
        return ["LD_LIBRARY_PATH": "\(directory.path):\(originalDirectory)"]
    }

    nonisolated(unsafe) private static var strippedDirectory = ""
}
