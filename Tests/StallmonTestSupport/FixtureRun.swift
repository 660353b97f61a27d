import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One run of the fixture service (Sources/StallmonFixture) as a child process, and what it printed.
package struct FixtureRun {
    /// Everything the fixture printed, one JSON object a line.
    package var lines: [[String: Any]]
    package var exitStatus: Int32
    package var standardError: String

    package var detected: [[String: Any]] { lines.filter { $0["type"] as? String == "detected" } }
    package var ended: [[String: Any]] { lines.filter { $0["type"] as? String == "ended" } }
    package var truths: [[String: Any]] { lines.filter { $0["type"] as? String == "truth" } }
    package var stopped: [[String: Any]] { lines.filter { $0["type"] as? String == "stopped" } }

    package func truth(_ name: String) -> Double? {
        truths.first { $0["name"] as? String == name }.flatMap { ($0["duration_ns"] as? NSNumber)?.doubleValue }.map {
            $0 / 1e6
        }
    }

    /// Runs a scenario and waits for it (killing it after `timeout` seconds).
    /// - Parameter whileRunning: Called with the child's pid once it runs (for SIGSTOP tests).
    package static func run(
        _ scenario: String, arguments: [String] = [], environment: [String: String] = [:], timeout: Double = 30,
        executable: Executable = .fixture, whileRunning: ((pid_t) -> Void)? = nil
    ) throws -> FixtureRun {
        let running = try executable.start([scenario] + arguments, environment: environment)
        let killer = DispatchWorkItem { if running.process.isRunning { running.signal(SIGKILL) } }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: killer)
        defer { killer.cancel() }
        whileRunning?(running.process.processIdentifier)
        let result = running.wait()
        let lines = result.output.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
        return FixtureRun(lines: lines, exitStatus: result.status, standardError: result.errors)
    }
}

extension Dictionary where Key == String, Value == Any {
    package func string(_ key: String) -> String { self[key] as? String ?? "" }
    package func number(_ key: String) -> Double {
        if let number = self[key] as? NSNumber { return number.doubleValue }
        return Double(self[key] as? String ?? "") ?? .nan
    }
    /// Whether a report's samples got stacks of their own, all but a few. A sample that finds the
    /// thread inside a system call it has finished but not yet left (it waits for a CPU: on a
    /// loaded machine, at the end of a blocked stall) does not signal it, and the previous stack
    /// stands in, counted in `STALL_SAMPLES_UNANSWERED`: one in twenty samples, or one, may be so.
    /// Sampling that does not work leaves most of them unanswered.
    package var samplesMostlyAnswered: Bool {
        let samples = number("STALL_SAMPLES")
        let unanswered = number("STALL_SAMPLES_UNANSWERED")
        return samples > 0 && unanswered >= 0 && unanswered <= Swift.max(1, (samples / 20).rounded(.down))
    }

    /// Milliseconds from a `STALL_*_USEC` field.
    package func milliseconds(_ key: String) -> Double { number(key) / 1000 }
    package var frames: [[String: Any]] { self["frames"] as? [[String: Any]] ?? [] }
}
