// What the fixture services share: their clocks, the JSON lines they print on standard output
// (one object a line, which the tests read), and the true extent of the stalls they cause.

import Foundation
import StallJournal
import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

package enum Fixture {
    /// CLOCK_MONOTONIC in nanoseconds, the monitor's clock.
    package static func now() -> UInt64 { MonotonicClock.now() }

    package static func milliseconds() -> Double { Double(now()) / 1e6 }

    /// CLOCK_THREAD_CPUTIME_ID of the calling thread.
    package static func threadCPU() -> UInt64 { nanoseconds(CLOCK_THREAD_CPUTIME_ID) }

    package static func processCPU() -> UInt64 { nanoseconds(CLOCK_PROCESS_CPUTIME_ID) }

    private static func nanoseconds(_ clock: clockid_t) -> UInt64 {
        var time = timespec()
        clock_gettime(clock, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// One JSON object on standard output, on a line of its own.
    package static func print(_ object: [String: Any]) {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }

    /// Records the true extent of a stall, the CPU time its thread used meanwhile (on a busy
    /// machine a CPU-bound stall gets less CPU than its duration), and whether it ran on the main
    /// thread: the tests compare them with what the monitor reported.
    package static func truth(_ name: String, _ body: () -> Void) {
        let startCPU = threadCPU()
        let start = now()
        body()
        let end = now()
        let cpu = threadCPU() - startCPU
        print([
            "type": "truth", "name": name, "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "cpu_ns": cpu, "main_thread": Thread.isMainThread,
        ])
    }
}

/// Prints every event as one JSON line: the journal fields, the event, when it was emitted, and
/// the symbolicated frames.
package struct JSONLinesSink: ReportSink {
    let identifier: String

    package init(identifier: String) {
        self.identifier = identifier
    }

    package func emit(_ event: StallMonitorEvent) {
        var object: [String: Any] = ["ns": Fixture.now()]
        for field in JournalSink.fields(for: event, syslogIdentifier: identifier) {
            object[field.name] = field.value
        }
        // `started`, `stopped`, `suppressed`, or the stall's event: `detected`, `ended`, `watchdog`.
        object["type"] = event.report?.event.rawValue ?? event.kind.description
        if let statistics = event.statistics {
            object["stalls"] = statistics.stalls
            object["suppressed"] = statistics.suppressedReports
            object["dropped"] = statistics.droppedReports
            object["lost"] = statistics.lostReports
        }
        if let report = event.report {
            object["duration_ns"] = report.duration.nanoseconds
            object["paused_ns"] = report.pausedTime.nanoseconds
            object["start_ns"] = report.startNanoseconds
            object["reported_ns"] = Fixture.now()
            object["frames"] = report.stack.map { frame in
                [
                    "function": frame.function ?? "", "symbol": frame.symbol ?? "", "file": frame.file ?? "",
                    "line": frame.line, "image": frame.image ?? "",
                ] as [String: Any]
            }
            object["functions"] = report.stack.map { $0.function ?? "" }
            object["culprit"] = report.culprit?.summary ?? ""
        }
        Fixture.print(object)
    }
}
