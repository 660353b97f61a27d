import Foundation

/// Starts children (this executable again, as `/proc/self/exe --child …`) and reads their result.
struct ChildRunner {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Where children's standard error goes; shown when a child fails.
    private let errorLog: URL

    init() {
        errorLog = FileManager.default.temporaryDirectory.appendingPathComponent("stallmon-bench-\(getpid()).stderr")
    }

    /// The real path of this executable, for wrappers (valgrind's own /proc/self/exe is valgrind).
    static var executablePath: String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    /// Runs one child to its end and returns its result line.
    /// - Parameters:
    ///   - wrapper: A command to run the child under (e.g. valgrind and its options).
    ///   - executable: The executable the wrapper runs; this one by default.
    func run(_ request: ChildRequest, under wrapper: [String] = [], executable: String? = nil) throws -> [String:
        Double]
    {
        let process = Process()
        if let tool = wrapper.first {
            process.executableURL = URL(fileURLWithPath: tool)
            process.arguments = Array(wrapper.dropFirst()) + [executable ?? Self.executablePath] + request.arguments
        } else {
            process.executableURL = URL(fileURLWithPath: "/proc/self/exe")
            process.arguments = request.arguments
        }
        let output = Pipe()
        process.standardOutput = output
        _ = FileManager.default.createFile(atPath: errorLog.path, contents: nil)
        let errors = try FileHandle(forWritingTo: errorLog)
        defer { try? errors.close() }
        process.standardError = errors
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()

        let text = String(decoding: data, as: UTF8.self)
        let line = text.split(separator: "\n").last { $0.hasPrefix(Child.resultMarker) }
        guard process.terminationStatus == 0, let line,
            let object = try? JSONSerialization.jsonObject(with: Data(line.dropFirst(Child.resultMarker.count).utf8)),
            let dictionary = object as? [String: Any]
        else {
            let log = (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
            throw Failure(
                description: "child \(request.arguments.joined(separator: " ")) failed "
                    + "(status \(process.terminationStatus)): \(log.suffix(2000))"
            )
        }
        return dictionary.compactMapValues { ($0 as? NSNumber)?.doubleValue }
    }

    func removeLog() {
        try? FileManager.default.removeItem(at: errorLog)
    }
}
