import ArgumentParser
import Dispatch
import Foundation
import Logging
import StallJournal
import StallMonitor
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Runs a small service on the main run loop under the monitor, stalls it three ways, and prints
/// what was reported (read back from the journal when journald runs).
struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a small service that stalls its main run loop three ways, and show the reports.",
        discussion: """
            The service stalls in a timer callout busy on the CPU, in a main-queue block blocked in \
            a system call, and waiting for a lock another thread holds. The monitor runs with its \
            default configuration (config/stallmon.json) unless told otherwise.
            """
    )

    @Option(name: .customLong("stall-ms"), help: "How long each stall lasts, in milliseconds.")
    var stallMilliseconds = 400

    @Option(name: .customLong("config"), help: "A configuration file like config/stallmon.json.")
    var configurationFile: String?

    @Flag(help: "Print the reports as JSON lines (the journal fields).")
    var json = false

    @Flag(help: "Run an HTTP server on SwiftNIO event loops instead, and stall three of its handlers.")
    var nio = false

    func validate() throws {
        guard (1...60_000).contains(stallMilliseconds) else {
            throw ValidationError("--stall-ms must be between 1 and 60000, not \(stallMilliseconds).")
        }
    }

    func run() throws {
        if nio {
            try NIODemo(stallMilliseconds: stallMilliseconds, configurationFile: configurationFile, json: json).run()
            return
        }
        var configuration: StallMonitor.Configuration
        do {
            configuration = try configurationFile.map(StallMonitor.Configuration.init(contentsOfFile:)) ?? .init()
        } catch {
            FileHandle.standardError.write(Data("stallmon demo: \(error)\n".utf8))
            throw ExitStatus.configuration
        }
        guard Duration.milliseconds(stallMilliseconds) > configuration.threshold else {
            FileHandle.standardError.write(
                Data(
                    "stallmon demo: --stall-ms \(stallMilliseconds) does not exceed the threshold (\(configuration.threshold)); nothing would be reported\n"
                        .utf8))
            throw ExitCode.validationFailure
        }
        configuration.syslogIdentifier = configuration.syslogIdentifier ?? "stallmon-demo"
        configuration.rateLimit.burst = max(configuration.rateLimit.burst, 3)

        let journal = JournalSink(syslogIdentifier: configuration.syslogIdentifier)
        let collected = EndedReports()
        var logger = Logger(label: "stallmon.demo")
        logger.logLevel = .warning
        let monitor = try StallMonitor(
            configuration: configuration, logger: logger,
            sinks: journal.isAvailable ? [journal, collected] : [collected]
        )
        let stall = stallMilliseconds
        let gap = Double(stall) / 1000 + 0.4

        print(
            "stallmon demo: pid \(getpid()), threshold \(configuration.threshold.milliseconds) ms, stalls of \(stall) ms"
        )
        try monitor.start()
        let lock = NSLock()
        schedule(after: 0.3) {
            print("  1. a timer callout refreshes a cache on the CPU…")
            DemoService.refreshCache(milliseconds: stall)
        }
        schedule(after: 0.3 + gap) {
            print("  2. a main-queue block reads its configuration in a blocking system call…")
            DispatchQueue.main.async { DemoService.readConfiguration(milliseconds: stall) }
        }
        schedule(after: 0.3 + 2 * gap) {
            print("  3. a main-queue block waits for a lock another thread holds…")
            let held = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                lock.lock()
                held.signal()
                usleep(UInt32(stall) * 1000)
                lock.unlock()
            }
            held.wait()
            DispatchQueue.main.async { DemoService.updateSharedState(lock) }
        }
        let identifier = configuration.syslogIdentifier ?? ""
        schedule(after: 0.3 + 3 * gap + 0.2) {
            monitor.stop()
            let status = report(collected: collected, journal: journal.isAvailable, identifier: identifier)
            Foundation.exit(status)
        }
        RunLoop.main.run()
    }

    private func schedule(after seconds: Double, _ body: @escaping @Sendable () -> Void) {
        RunLoop.main.add(
            Timer(fire: Date(timeIntervalSinceNow: seconds), interval: 0, repeats: false) { _ in body() },
            forMode: .common)
    }

    /// Prints the ended reports, from the journal when there is one. Returns the exit status.
    private func report(collected: EndedReports, journal: Bool, identifier: String) -> Int32 {
        let reports = collected.reports
        var records: [StallRecord] = []
        var source = "memory (journald is not running)"
        if journal {
            do {
                records = try readBack(identifier: identifier, expected: reports.count)
                source = "the journal"
            } catch {
                FileHandle.standardError.write(Data("stallmon demo: reading the journal back failed: \(error)\n".utf8))
                return ExitStatus.dataError.rawValue
            }
        } else {
            do {
                records = try reports.map {
                    try StallRecord.decode(JournalSink.fields(for: .stallEnded($0), syslogIdentifier: identifier))
                }
            } catch {
                FileHandle.standardError.write(Data("stallmon demo: \(error)\n".utf8))
                return ExitStatus.software.rawValue
            }
        }
        print("\n\(records.count) stall\(records.count == 1 ? "" : "s") reported, read back from \(source):\n")
        for (index, record) in records.enumerated() {
            if json {
                print(JSONLines.encode(record.fields))
                continue
            }
            print("\(index + 1). \(DisplayText.escaped(record.message))")
            print(
                DisplayText.escaped(
                    "   callout \(record.callout), \(record.activity), mode \(record.runLoopMode), thread \(record.threadState)"
                        + (record.threadSyscall.isEmpty ? "" : " in \(record.threadSyscall)"))
                    + ", cpu \(record.cpuMicroseconds / 1000) ms, \(record.stackSamples)/\(record.samples) samples, fingerprint \(record.fingerprint)"
            )
            let lines = record.backtrace.split(separator: "\n")
            let culprit = lines.firstIndex { $0.contains(record.frame.split(separator: " (").first ?? "") } ?? 0
            for line in lines[culprit...].prefix(4) { print("   \(DisplayText.escaped(String(line)))") }
            print("")
        }
        if journal {
            print("See them with: journalctl MESSAGE_ID=\(MessageID.stallEnded) _PID=\(getpid())")
        }
        return records.count == 3 ? 0 : ExitStatus.software.rawValue
    }

    private func readBack(identifier: String, expected: Int) throws -> [StallRecord] {
        let deadline = Date(timeIntervalSinceNow: 5)
        var records: [StallRecord] = []
        repeat {
            let reader = try JournalReader()
            try reader.addMatch("MESSAGE_ID", MessageID.stallEnded)
            try reader.addMatch("_PID", String(getpid()))
            try reader.seekHead()
            records = []
            while let entry = try reader.next() {
                records.append(try StallRecord(journalFields: entry.fields))
            }
            if records.count >= expected { break }
            usleep(100_000)
        } while Date() < deadline
        return records
    }
}

extension StallRecord {
    fileprivate static func decode(_ fields: [JournalField]) throws(JournalDecodingError) -> StallRecord {
        var dictionary: [String: String] = [:]
        for field in fields { dictionary[field.name] = field.value }
        return try StallRecord(journalFields: dictionary)
    }
}

enum JSONLines {
    static func encode(_ fields: [JournalField]) -> String {
        var object: [String: String] = [:]
        for field in fields { object[field.name] = field.value }
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return "{}"
        }
        return JSONText.escapingControls(String(decoding: data, as: UTF8.self))
    }
}

/// The demo's own sink: the ended reports, kept for the summary it prints.
private final class EndedReports: ReportSink, Sendable {
    private let kept = Mutex<[StallReport]>([])

    func emit(_ event: StallMonitorEvent) {
        guard event.kind == .stallEnded, let report = event.report else { return }
        kept.withLock { $0.append(report) }
    }

    var reports: [StallReport] { kept.withLock { $0 } }
}
