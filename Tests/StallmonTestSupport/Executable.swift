import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The project's own executables, next to the test bundle in the build folder.
package struct Executable {
    package var name: String

    package init(name: String) {
        self.name = name
    }

    package static let stallmon = Executable(name: "stallmon")
    package static let stallmond = Executable(name: "stallmond")
    /// The service the tests stall (Sources/StallmonFixture).
    package static let fixture = Executable(name: "StallmonFixture")
    /// The async `@main` service the tests stall (Sources/StallmonAsyncFixture).
    package static let asyncFixture = Executable(name: "StallmonAsyncFixture")
    /// The async service whose monitor is a swift-service-lifecycle `Service` (Sources/StallmonServiceFixture).
    package static let serviceFixture = Executable(name: "StallmonServiceFixture")
    /// The plain C epoll service stallmond watches from outside (Sources/StallmonEpollFixture).
    package static let epollFixture = Executable(name: "StallmonEpollFixture")

    package var url: URL {
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent(name)
    }

    package struct Result {
        package var status: Int32
        package var output: String
        package var errors: String

        package init(status: Int32, output: String, errors: String) {
            self.status = status
            self.output = output
            self.errors = errors
        }
    }

    /// Runs to completion (killed after `timeout` seconds).
    package func run(_ arguments: [String], environment: [String: String] = [:], timeout: Double = 60) throws -> Result
    {
        let process = try start(arguments, environment: environment)
        let killer = DispatchWorkItem {
            if process.process.isRunning { kill(process.process.processIdentifier, SIGKILL) }
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: killer)
        defer { killer.cancel() }
        return process.wait()
    }

    /// Starts in the background; the caller signals and waits. With `input`, the process reads
    /// its standard input from that pipe (the caller writes to it); else it inherits the tests'.
    package func start(_ arguments: [String], environment: [String: String] = [:], input: Pipe? = nil) throws
        -> Running
    {
        let process = Process()
        process.executableURL = url
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        if let input { process.standardInput = input }
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.runWithEmptySignalMask()
        return Running(process: process, output: output, errors: errors)
    }

    package final class Running: @unchecked Sendable {
        package let process: Process
        private let output: Pipe
        private let errors: Pipe
        private let lock = NSLock()
        private var outputData = Data()
        private var errorData = Data()

        package init(process: Process, output: Pipe, errors: Pipe) {
            self.process = process
            self.output = output
            self.errors = errors
            output.fileHandleForReading.readabilityHandler = { [weak self] handle in
                let data = handle.availableData
                self?.lock.withLock { self?.outputData.append(data) }
            }
            errors.fileHandleForReading.readabilityHandler = { [weak self] handle in
                let data = handle.availableData
                self?.lock.withLock { self?.errorData.append(data) }
            }
        }

        package var outputSoFar: String { lock.withLock { String(decoding: outputData, as: UTF8.self) } }
        package var errorsSoFar: String { lock.withLock { String(decoding: errorData, as: UTF8.self) } }

        package func signal(_ number: Int32) { kill(process.processIdentifier, number) }

        /// `signal` (SIGTERM), then SIGKILL if it has not exited after `grace` seconds.
        package func terminate(signal number: Int32 = SIGTERM, grace: Double = 5) -> Result {
            signal(number)
            let deadline = Date(timeIntervalSinceNow: grace)
            while process.isRunning, Date() < deadline { usleep(20_000) }
            if process.isRunning { signal(SIGKILL) }
            return wait()
        }

        /// Polls `condition` on the output so far until it holds or `timeout` passes.
        package func waitForOutput(timeout: Double = 15, _ condition: (String, String) -> Bool) -> Bool {
            let deadline = Date(timeIntervalSinceNow: timeout)
            while Date() < deadline {
                if condition(outputSoFar, errorsSoFar) { return true }
                usleep(50_000)
            }
            return condition(outputSoFar, errorsSoFar)
        }

        package func wait() -> Result {
            process.waitUntilExit()
            usleep(100_000)
            output.fileHandleForReading.readabilityHandler = nil
            errors.fileHandleForReading.readabilityHandler = nil
            let restOut = output.fileHandleForReading.readDataToEndOfFile()
            let restErr = errors.fileHandleForReading.readDataToEndOfFile()
            return lock.withLock {
                outputData.append(restOut)
                errorData.append(restErr)
                return Result(
                    status: process.terminationStatus, output: String(decoding: outputData, as: UTF8.self),
                    errors: String(decoding: errorData, as: UTF8.self))
            }
        }
    }
}
