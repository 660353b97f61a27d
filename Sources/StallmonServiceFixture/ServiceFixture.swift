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
            Output.print(["type": "group-error", "description": "\(error)"])
        }
        Output.print([
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
            Output.truth("main-actor-cpu") { Work.render(milliseconds: 600) }
        }
        try await Task.sleep(for: .milliseconds(200))
        Output.print(["type": "ready"])
        if returns {
            Output.print(["type": "worker-returned"])
            return
        }
        try await gracefulShutdown()
        Output.print(["type": "worker-shutdown", "ns": Output.now()])
    }
}

enum Work {
    /// Main-actor work busy on the CPU (FNV hashing).
    @MainActor @inline(never)
    static func render(milliseconds: Int) {
        let end = Output.now() + UInt64(milliseconds) * 1_000_000
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while Output.now() < end {
            for byte in 0..<UInt64(4096) { hash = (hash ^ byte) &* 0x100_0000_01b3 }
        }
        if hash == 42 { Swift.print("") }
    }
}

enum Output {
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    static func threadCPU() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    static func print(_ object: [String: Any]) {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }

    /// Records the true extent of a stall, its thread's CPU time, and whether it ran on the main thread.
    static func truth(_ name: String, _ body: () -> Void) {
        let startCPU = threadCPU()
        let start = now()
        body()
        let end = now()
        print([
            "type": "truth", "name": name, "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "cpu_ns": threadCPU() - startCPU, "main_thread": Thread.isMainThread,
        ])
    }
}

/// Prints every event as one JSON line: the journal fields, the event, the thread that emitted it.
struct JSONLinesSink: ReportSink {
    let identifier: String

    func emit(_ event: StallMonitorEvent) {
        var object: [String: Any] = ["ns": Output.now()]
        for field in JournalSink.fields(for: event, syslogIdentifier: identifier) {
            object[field.name] = field.value
        }
        switch event {
        case .started: object["type"] = "started"
        case .stopped: object["type"] = "stopped"
        case .suppressed: object["type"] = "suppressed"
        case .stallDetected(let report), .stallEnded(let report), .watchdogStall(let report):
            object["type"] = report.event.rawValue
            object["functions"] = report.stack.map { $0.function ?? "" }
        }
        Output.print(object)
    }
}
