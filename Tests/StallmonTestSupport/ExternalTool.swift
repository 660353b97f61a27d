import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A program from `PATH`, run to completion.
package enum ExternalTool {
    package static func find(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return (path.split(separator: ":").map(String.init) + ["/usr/bin", "/usr/local/bin"])
            .map { $0 + "/" + name }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    package struct Result {
        package var status: Int32
        package var output: String
    }

    /// Runs `tool` with standard output and error together; after `timeout` seconds, or once it
    /// exits, its process group is killed. The output goes to a file, not a pipe: helpers that a
    /// tool leaves behind (Chromium's) would hold a pipe open, and a read to its end would never
    /// return.
    package static func run(_ tool: String, _ arguments: [String], directory: String? = nil, timeout: Double = 120)
        throws
        -> Result
    {
        let outputPath = FileManager.default.temporaryDirectory
            .appendingPathComponent("stallmon-tool-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        guard FileManager.default.createFile(atPath: outputPath, contents: nil),
            let output = FileHandle(forWritingAtPath: outputPath)
        else { throw CocoaError(.fileWriteUnknown) }
        defer { try? FileManager.default.removeItem(atPath: outputPath) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        try? output.close()
        let pid = process.processIdentifier
        // Foundation starts the tool in a process group of its own.
        let killer = DispatchWorkItem { kill(-pid, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: killer)
        process.waitUntilExit()
        killer.cancel()
        // What the tool left behind in its group, if anything.
        kill(-pid, SIGKILL)
        let data = FileManager.default.contents(atPath: outputPath) ?? Data()
        return Result(status: process.terminationStatus, output: String(decoding: data, as: UTF8.self))
    }
}
