// An async service built on swift-service-lifecycle: its monitor is a StallMonitorService in a
// ServiceGroup, next to a worker service that stalls the main actor once. The tests run it as a
// child process, send SIGTERM, and read what it printed (one JSON object a line) and its exit status.
//
//   StallmonServiceFixture SCENARIO [--threshold-ms N] [--journal --identifier NAME]
//
// Scenarios:
//   sigterm  the worker stalls the main actor for 600 ms, prints {"type":"ready"}, and waits for
//            graceful shutdown (SIGTERM); the group then shuts down in reverse order
//   return   the worker stalls, then returns: the group cancels the other services and ends with
//            an error, which main() prints before it returns

import Dispatch
import Foundation
import Logging
import ServiceLifecycle
import StallJournal
import StallMonitor
import StallMonitorServiceLifecycle
import StallmonFixtureKit
import UnixSignals

#if canImport(Glibc)
import Glibc
#endif

@main
enum ServiceFixture {
    static func main() async throws {
        var scenario = "sigterm"
        var threshold = 100
        var journal = false
        var identifier = "stallmon-service-fixture"
        var iterator = CommandLine.arguments.dropFirst().makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--threshold-ms": threshold = Int(iterator.next() ?? "") ?? threshold
            case "--journal": journal = true
            case "--identifier": identifier = iterator.next() ?? identifier
            default: scenario = argument
            }
        }
        guard scenario == "sigterm" || scenario == "return" else {
            FileHandle.standardError.write(Data("unknown scenario \(scenario)\n".utf8))
            exit(64)
        }

        var configuration = StallMonitor.Configuration()
        configuration.threshold = .milliseconds(threshold)
        configuration.sampleInterval = .milliseconds(10)
        configuration.syslogIdentifier = identifier
        var sinks: [any ReportSink] = [JSONLinesSink(identifier: identifier)]
        if journal { sinks.append(JournalSink(syslogIdentifier: identifier)) }

        // The adoption under test: the service starts the monitor here, before main()'s first await.
        let monitor = try StallMonitorService(StallMonitor(configuration: configuration, sinks: sinks))
        let logger = Logger(label: "stallmon-service-fixture")
        let group = ServiceGroup(
            services: [monitor, Worker(returns: scenario == "return")],
            gracefulShutdownSignals: [.sigterm],
            logger: logger
        )
        do {
            try await group.run()
        } catch {
            // A worker that returns ends the group with an error (ServiceGroupError), after cancelling the others.
            Fixture.print(["type": "group-error", "description": "\(error)"])
        }
        Fixture.print([
            "type": "exited", "running": monitor.monitor.isRunning, "stalls": monitor.monitor.statistics.stalls,
        ])
    }
}

/// Stalls the main actor once, then waits for graceful shutdown (or returns).
struct Worker: Service {
    let returns: Bool

    func run() async throws {
        // Past the reporter's symbol loading, which competes for the CPU at first.
        try await Task.sleep(for: .milliseconds(800))
        await MainActor.run {
            Fixture.truth("main-actor-cpu") { Work.render(milliseconds: 600) }
        }
        try await Task.sleep(for: .milliseconds(200))
        Fixture.print(["type": "ready"])
        if returns {
            Fixture.print(["type": "worker-returned"])
            return
        }
        try await gracefulShutdown()
        Fixture.print(["type": "worker-shutdown", "ns": Fixture.now()])
    }
}

enum Work {
    /// Main-actor work busy on the CPU (FNV hashing).
    @MainActor @inline(never)
    static func render(milliseconds: Int) {
        let end = Fixture.now() + UInt64(milliseconds) * 1_000_000
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while Fixture.now() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        if hash == 42 { Swift.print("") }
    }
}
