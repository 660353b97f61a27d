import Foundation
import StallJournal
import StallMonitor
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Swift's cooperative pool, watched with `cooperative_pool` on, in the async fixture service
    /// (Sources/StallmonAsyncFixture) as a child process: jobs that hold a pool thread in `usleep`, a
    /// blocking `read`, `DispatchSemaphore.wait` and a CPU loop.
    @Suite
    struct CooperativePoolTests {
        struct Stall: Sendable, CustomTestStringConvertible {
            var truth: String
            var function: String
            var syscall: String?

            var onCPU: Bool { syscall == nil }
            var testDescription: String { truth }
        }

        static let stalls = [
            Stall(truth: "pool-usleep", function: "PoolWork.napInPool(milliseconds:)", syscall: "clock_nanosleep"),
            Stall(truth: "pool-read", function: "PoolWork.readFromPipe(milliseconds:)", syscall: "read"),
            Stall(truth: "pool-semaphore", function: "PoolWork.waitForSemaphore(milliseconds:)", syscall: "futex"),
            Stall(truth: "pool-cpu", function: "PoolWork.crunch(milliseconds:)"),
        ]

        static func run(_ scenario: String, seconds: String) throws -> FixtureRun {
            try FixtureRun.run(
                scenario, arguments: ["--seconds", seconds, "--threshold-ms", "100"], executable: .asyncFixture)
        }

        static func poolReports(_ lines: [[String: Any]]) -> [[String: Any]] {
            lines.filter { $0.string("STALL_LOOP") == "cooperative-pool" }
        }

        /// `cooperative_pool` on, and left at its default (watched for an async main).
        @Test(arguments: ["pool-stalls", "pool-default"])
        func poolJobsThatHoldTheirThreadAreEachReportedOnceWithThreadFunctionAndState(scenario: String) throws {
            let run = try Self.run(scenario, seconds: "4.8")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let detected = Self.poolReports(run.detected)
            let ended = Self.poolReports(run.ended)
            try #require(detected.count == 4, "detected: \(detected.count)\n\(run.standardError)")
            try #require(ended.count == 4, "ended: \(ended.count)")
            // The main loop saw none of it: pool jobs are not the main actor's.
            #expect(run.detected.count == 4 && run.ended.count == 4)
            for (index, expected) in Self.stalls.enumerated() {
                let truthLine = try #require(run.truths.first { $0.string("name") == expected.truth })
                let thread = try #require(
                    run.lines.first { $0.string("type") == "pool-thread" && $0.string("name") == expected.truth })
                let truth = truthLine.number("duration_ns") / 1e6
                let (detected, ended) = (detected[index], ended[index])
                #expect(detected.string("STALL_ID") == ended.string("STALL_ID"))
                #expect(detected.milliseconds("STALL_DURATION_USEC") >= 100)
                #expect(detected.milliseconds("STALL_DURATION_USEC") < 100 + 40)
                let duration = ended.milliseconds("STALL_DURATION_USEC")
                #expect(abs(duration - truth) <= 15, "\(expected.truth): reported \(duration) ms, true \(truth) ms")
                #expect(ended.number("STALL_THREAD_TID") == thread.number("tid"), "\(expected.truth)")
                #expect(ended.string("STALL_ACTIVITY") == "pool-job")
                #expect(ended.string("STALL_CALLOUT") == "pool-job")
                #expect(ended.milliseconds("STALL_THRESHOLD_USEC") == 100)
                #expect(ended.string("STALL_FRAME").hasPrefix(expected.function), "\(ended.string("STALL_FRAME"))")
                let frame = try #require(ended.frames.first { $0["function"] as? String == expected.function })
                #expect((frame["file"] as? String)?.hasSuffix("AsyncFixture.swift") == true)
                #expect((frame["line"] as? Int ?? 0) > 0)
                #expect(
                    ended.string("MESSAGE").hasPrefix("cooperative-pool thread \(Int(thread.number("tid"))) stalled"))
                let cpu = ended.milliseconds("STALL_CPU_USEC")
                if expected.onCPU {
                    #expect(ended.string("STALL_THREAD_STATE") == "R")
                    // A perf event on the pool thread (the tests run where the kernel allows one).
                    #expect(ended.string("STALL_STACK_SOURCE") == "perf")
                    let trueCPU = truthLine.number("cpu_ns") / 1e6
                    #expect(abs(cpu - trueCPU) <= 30, "\(expected.truth): cpu \(cpu) ms, truly \(trueCPU) ms")
                } else {
                    // Blocked: unwound from the kernel's view, never signalled.
                    #expect(ended.string("STALL_THREAD_STATE") == "S")
                    #expect(ended.string("STALL_THREAD_SYSCALL") == expected.syscall)
                    #expect(ended.string("STALL_STACK_SOURCE") == "kernel")
                    #expect(cpu <= duration * 0.2, "\(expected.truth): cpu \(cpu) ms of \(duration) ms")
                }
            }
            // The monitor never ended the usleep early with EINTR.
            let nap = try #require(run.lines.first { $0.string("type") == "usleep" })
            #expect(nap.number("result") == 0 && nap.number("slept_ms") >= 400, "\(nap)")
            #expect(run.lines.first { $0.string("type") == "statistics" }?.number("stalls") == 4)
            // The hook is the monitor's while it runs, and gone once it stops.
            let hooks = run.lines.filter { $0.string("type") == "pool-hook" }
            #expect(hooks.map { $0["monitor_hook"] as? Bool } == [true, false], "\(hooks)")
            #expect(hooks.last?["hook_set"] as? Bool == false)
        }

        /// The runtime's Job layout is checked against the runtime's own answers before the hook is
        /// set. A check made to find another value (`--mismatch`, through the test seam) leaves the
        /// hook unset and the pool unwatched, says so in one warning that names the check, and the
        /// service runs on; with no mismatch, the hook is set as before.
        @Test(arguments: ["task-id", "job-kind", "priority", "queue-kind", "invoke", nil])
        func aRuntimeLayoutThatDiffersInstallsNoHookAndSaysWhyOnce(check: String?) throws {
            let mismatch = check.map { ["--mismatch", $0] } ?? []
            let run = try FixtureRun.run(
                "pool-layout", arguments: ["--seconds", "1.5", "--threshold-ms", "100"] + mismatch,
                executable: .asyncFixture)
            #expect(run.exitStatus == 0, "\(run.standardError)")
            // The service ran its pool job all the same.
            #expect(try #require(run.truth("pool-usleep")) >= 300)
            let hooks = run.lines.filter { $0.string("type") == "pool-hook" }
            let warnings = run.standardError.split(separator: "\n").filter {
                $0.contains("does not watch the cooperative pool")
            }
            guard let check else {
                #expect(hooks.map { $0["monitor_hook"] as? Bool } == [true, false], "\(hooks)")
                #expect(hooks.first?["layout_verified"] as? Bool == true)
                #expect(warnings.isEmpty, "\(warnings)")
                #expect(Self.poolReports(run.detected).count == 1)
                return
            }
            #expect(hooks.count == 2 && hooks.allSatisfy { $0["hook_set"] as? Bool == false }, "\(hooks)")
            #expect(hooks.first?["layout_verified"] as? Bool == false)
            #expect(hooks.first?.string("layout_problem").hasPrefix("\(check): ") == true, "\(hooks)")
            #expect(warnings.count == 1, "\(run.standardError)")
            #expect(warnings.first?.contains("(\(check): ") == true, "\(warnings)")
            #expect(warnings.first?.contains("expected") == true, "\(warnings)")
            #expect(Self.poolReports(run.lines).isEmpty)
            #expect(!run.lines.contains { $0.string("type") == "pool-switches" })
        }

        @Test func poolMonitoringOffInstallsNoHookAndReportsNoPoolStall() throws {
            let run = try Self.run("pool-off", seconds: "2")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            #expect(try #require(run.truth("pool-usleep")) >= 400)
            let hooks = run.lines.filter { $0.string("type") == "pool-hook" }
            #expect(hooks.count == 2 && hooks.allSatisfy { $0["hook_set"] as? Bool == false }, "\(hooks)")
            #expect(Self.poolReports(run.lines).isEmpty)
            #expect(!run.lines.contains { $0.string("type") == "pool-switches" })
            #expect(run.detected.isEmpty && run.ended.isEmpty)
        }

        /// A stop of the process (SIGSTOP, a debugger) in the middle of pool jobs is no stall: the
        /// time nothing ran is no job's. Jobs of 40 ms of CPU time under a 200 ms threshold, the
        /// process stopped three times for 400 ms.
        @Test func aStopOfTheProcessInTheMiddleOfPoolJobsIsNotAStall() throws {
            let run = try FixtureRun.run(
                "pool-busy", arguments: ["--seconds", "3.5", "--threshold-ms", "200"], executable: .asyncFixture
            ) { pid in
                for _ in 0..<3 {
                    usleep(500_000)
                    kill(pid, SIGSTOP)
                    usleep(400_000)
                    kill(pid, SIGCONT)
                }
            }
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let busy = try #require(run.lines.first { $0.string("type") == "pool-busy" })
            #expect(busy.number("jobs") >= 20)
            // A job took the stop in only if it lasted that long.
            try #require(busy.number("longest_ns") >= 400e6, "no stop landed inside a job: \(busy)")
            let reports = Self.poolReports(run.detected + run.ended)
            #expect(reports.isEmpty, "\(reports.map { $0.string("MESSAGE") })")
            #expect(run.lines.first { $0.string("type") == "statistics" }?.number("stalls") == 0)
        }

        /// The watchdog sweeps the table of open spans on its wakeups, once a second while the
        /// pool is busy and as it parks: inside a span, the pool hook stays on and a task the
        /// request makes serves it; once the span has ended, the first park clears the hook's sign;
        /// the next span sets it again.
        @Test func theWatchdogsSweepsTurnThePoolHookOffBetweenSpansOnly() throws {
            let run = try Self.run("pool-spans", seconds: "6")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let moments = Dictionary(
                run.lines.filter { $0.string("type") == "spans" }.map { ($0.string("moment"), $0) }
            ) { $1 }
            let before = try #require(moments["before"], "\(run.lines)")
            let busy = try #require(moments["busy"])
            let parked = try #require(moments["parked"])
            let after = try #require(moments["after"])
            let again = try #require(moments["again"])
            #expect(before["may_be_open"] as? Bool == false)
            // 2.5 s of a busy pool: two sweeps at least, the span open in each.
            #expect(busy.number("sweeps") - before.number("sweeps") >= 2, "\(busy)")
            #expect(busy["may_be_open"] as? Bool == true)
            // 0.4 s of an idle pool: the park's sweep.
            #expect(parked.number("sweeps") > busy.number("sweeps"), "\(parked)")
            #expect(parked["may_be_open"] as? Bool == true)
            #expect(parked["child_found"] as? Bool == true)
            #expect(parked.number("inherited") > before.number("inherited"))
            // The span ended, the pool idle: the park that follows sweeps the sign clear.
            #expect(after.number("sweeps") > parked.number("sweeps"), "\(after)")
            #expect(after["may_be_open"] as? Bool == false, "\(after)")
            #expect(again["may_be_open"] as? Bool == true)
            // (Its task may reuse the first one's alias, at the same address: no new alias counted.)
            #expect(again["child_found"] as? Bool == true)
        }

        @Test func idlePoolCostsItsWatchdogNoWakeups() throws {
            let run = try Self.run("pool-idle", seconds: "6.4")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            #expect(run.detected.isEmpty && run.ended.isEmpty)
            let readings = run.lines.filter { $0.string("type") == "pool-switches" }.map {
                (seconds: $0.number("elapsed_ns") / 1e9, count: Int($0.number("count")))
            }
            let first = try #require(readings.first { $0.seconds >= 0.9 })
            let last = try #require(readings.last { $0.seconds <= 6.1 })
            #expect(last.count - first.count == 0, "\(readings)")
        }
    }
}
