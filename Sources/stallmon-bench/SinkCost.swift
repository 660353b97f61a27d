import CStallCapture
import Foundation
import Logging
import StallJournal
import StallMonitor
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What one report costs each sink, on the thread that delivers it: a typical ended report (a
/// 20-frame stack, 12 sampled stacks, a traced request) through
///
/// - `journal`: `JournalSink` to a datagram socket of the benchmark's own that a thread drains (as
///   journald would, without journald's own work);
/// - `json`: `StandardErrorSink(format: .json)`, standard error a pipe that a thread drains (a
///   container's log collector);
/// - `text`: the same sink's readable text, into the same pipe;
/// - `logger`: `LoggerSink` through swift-log's `StreamLogHandler` into the same pipe.
///
/// Each report timed alone, the sinks in turn report by report, so that the machine's noise weighs
/// on each alike: `sink_<name>_report_us_p50` and `_p99`. Most of a report's cost is the mapping
/// from the report to the journal's fields (`sink_fields_us_*`: the backtrace and the sampled
/// stacks as text), which the journal, the JSON line and the Logger share; past it,
/// `sink_journal_send_us_*` (checking, encoding and sending the entry) and `sink_json_write_us_*`
/// (encoding and writing the line), and `sink_json_over_journal_ratio`, the second's median over
/// the first's (at most 1: a container's report costs no more than the journal's).
enum SinkCost {
    static let names = ["journal", "json", "text", "logger"]

    static func figures(scale: Double) -> [Figure] {
        let reports = max(300, Int(5_000 * scale))
        let journal = JournalReceiver()
        defer { journal.stop() }
        let pipe = StandardErrorPipe()
        let sinks: [any ReportSink] = [
            JournalSink(syslogIdentifier: "bench", socketPath: journal.path),
            StandardErrorSink(format: .json, syslogIdentifier: "bench"),
            StandardErrorSink(format: .text, prefix: "bench[1]"),
            LoggerSink(logger: Logger(label: "bench") { StreamLogHandler.standardError(label: $0) }),
        ]
        let event = StallMonitorEvent.stallEnded(report())
        let fields = JournalSink.fields(for: event, syslogIdentifier: "bench")
        let journalSink = JournalSink(syslogIdentifier: "bench", socketPath: journal.path)
        let jsonSink = StandardErrorSink(format: .json, syslogIdentifier: "bench")
        // Each sink's whole report, then the journal's and the JSON line's own part: past the
        // mapping from the event to fields, which they share.
        let steps: [() throws -> Void] =
            sinks.map { sink in { try sink.emit(event) } } + [
                { try journalSink.send(fields) }, { try jsonSink.writeLine(fields) },
                { _ = JournalSink.fields(for: event, syslogIdentifier: "bench") },
            ]
        var times = Array(repeating: [Double](), count: steps.count)
        var failures = 0
        for round in 0..<(reports + reports / 10) {
            for (index, step) in steps.enumerated() {
                let start = DispatchTime.now().uptimeNanoseconds
                do { try step() } catch { failures += 1 }
                let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e3
                if round >= reports / 10 { times[index].append(elapsed) }  // the first tenth warms up
            }
        }
        let written = pipe.restore()
        check(failures == 0, "\(failures) reports failed")
        check(journal.received.load(ordering: .relaxed) > 0, "the journal socket received nothing")
        check(written > 0, "standard error received nothing")
        var figures: [Figure] = []
        func add(_ key: String, _ target: Target?, _ value: Double) {
            var figure = Figure(key, target)
            figure.values = [value]
            figures.append(figure)
        }
        for (name, values) in zip(names, times) {
            add("sink_\(name)_report_us_p50", nil, Statistics.median(values) ?? .nan)
            add("sink_\(name)_report_us_p99", nil, Statistics.percentile(values, 0.99) ?? .nan)
        }
        for (name, values) in zip(["journal_send", "json_write", "fields"], times.suffix(3)) {
            add("sink_\(name)_us_p50", nil, Statistics.median(values) ?? .nan)
            add("sink_\(name)_us_p99", nil, Statistics.percentile(values, 0.99) ?? .nan)
        }
        // Past the fields both build the same way: the line against the entry.
        add(
            "sink_json_over_journal_ratio", .atMost(1),
            (Statistics.median(times[5]) ?? .nan) / (Statistics.median(times[4]) ?? .nan))
        return figures
    }

    /// A typical ended report of a traced request: 20 frames, 12 sampled stacks.
    static func report() -> StallReport {
        let frames = (0..<20).map {
            StallFrame(
                address: UInt(0x10_0000 + $0 * 64), image: "/usr/bin/service", symbol: "Service.Frame\($0)() -> ()",
                function: "Service.Frame\($0)()", offset: 4, file: "/src/Service.swift", line: 10 + $0)
        }
        var report = StallReport(
            event: .ended, stallID: "0123456789abcdef0123456789abcdef", loop: "cooperative-pool", threadID: 42,
            duration: .milliseconds(412), threshold: .milliseconds(100), activity: .poolJob, runLoopMode: "",
            callout: .poolJob, threadState: "R", syscall: nil, waitChannel: nil, cpuTime: .milliseconds(400),
            samples: 20, unansweredSamples: 0, stackSamples: 12, stack: frames, fingerprint: "00000000deadbeef",
            noStackReason: nil, startNanoseconds: 1, pausedTime: .zero)
        report.sampledStacks = (0..<12).map { SampledStack(frames: Array(frames.dropFirst($0 % 4)), count: 1 + $0) }
        report.request = StallRecord.Request(
            operation: "GET /users/:id", method: "GET", route: "/users/:id",
            traceID: "4bf92f3577b34da6a3ce929d0e0e4736", spanID: "00f067aa0ba902b7")
        return report
    }

    private static func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        guard !condition else { return }
        FileHandle.standardError.write(Data("stallmon-bench: sinks: \(message())\n".utf8))
        exit(1)
    }

    /// A datagram socket in place of journald's, drained by a thread of its own.
    final class JournalReceiver: Sendable {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(
            "stallmon-bench-journal-\(getpid()).socket"
        ).path
        let received = Atomic<Int>(0)
        private let stopping = Atomic<Bool>(false)
        private let descriptor: Int32
        private let done = DispatchSemaphore(value: 0)

        init() {
            unlink(path)
            descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            var size: Int32 = 8 * 1024 * 1024
            _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            var timeout = timeval()
            timeout.tv_usec = 100_000
            _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { buffer in
                for (index, byte) in path.utf8.prefix(buffer.count - 1).enumerated() { buffer[index] = byte }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            precondition(descriptor >= 0 && bound == 0, "cannot bind \(path): errno \(errno)")
            let thread = Thread { [self] in
                var buffer = [UInt8](repeating: 0, count: 256 * 1024)
                while !stopping.load(ordering: .relaxed) {
                    if recv(descriptor, &buffer, buffer.count, 0) > 0 { received.add(1, ordering: .relaxed) }
                }
                done.signal()
            }
            thread.start()
        }

        func stop() {
            stopping.store(true, ordering: .relaxed)
            done.wait()
            close(descriptor)
            unlink(path)
        }
    }

    /// Standard error as a pipe that a thread drains, until ``restore()``.
    final class StandardErrorPipe: @unchecked Sendable {
        private let saved: Int32
        private let reader: Int32
        private let writer: Int32
        private let bytes = Atomic<Int>(0)
        private let done = DispatchSemaphore(value: 0)

        init() {
            var ends: [Int32] = [0, 0]
            precondition(pipe(&ends) == 0)
            (reader, writer) = (ends[0], ends[1])
            saved = dup(STDERR_FILENO)
            dup2(writer, STDERR_FILENO)
            let thread = Thread { [self] in
                var buffer = [UInt8](repeating: 0, count: 64 * 1024)
                while true {
                    let count = read(reader, &buffer, buffer.count)
                    if count <= 0 { break }
                    bytes.add(count, ordering: .relaxed)
                }
                done.signal()
            }
            thread.start()
        }

        /// Puts standard error back; returns the bytes the pipe carried.
        func restore() -> Int {
            dup2(saved, STDERR_FILENO)
            close(saved)
            close(writer)
            done.wait()
            close(reader)
            return bytes.load(ordering: .relaxed)
        }
    }
}
