import Foundation
import StallmonTestSupport
import Testing

extension Serial {
    /// Real stalls of a real main run loop, in child processes: each kind is detected at the threshold,
    /// its duration matches the truth measured around the stalling code, and the heaviest stack names
    /// the stalling function with file:line.
    @Suite
    struct StallDetectionTests {
        struct Case: Sendable, CustomTestStringConvertible {
            var scenario: String
            var callout: String
            /// Functions the heaviest stack must hold, with a source location.
            var functions: [String]
            var onCPU: Bool
            var syscall: String?
            var truth: String?
            var loop = "main"

            var testDescription: String { scenario }
        }

        static let cases: [Case] = [
            Case(scenario: "timer-cpu", callout: "timer", functions: ["Stalls.burnCPU(milliseconds:)"], onCPU: true),
            Case(
                scenario: "main-queue-syscall", callout: "main-queue",
                functions: ["Stalls.sleepInSyscall(milliseconds:)"],
                onCPU: false, syscall: "poll"),
            Case(
                scenario: "lock-wait", callout: "main-queue", functions: ["Stalls.waitForLock(_:)"], onCPU: false,
                syscall: "futex"),
            Case(
                scenario: "main-actor", callout: "main-actor",
                functions: ["MainActorWork.recompute(milliseconds:)", "Stalls.burnCPU(milliseconds:)"], onCPU: true),
            Case(
                scenario: "source0", callout: "source0",
                functions: ["Source0.handle(milliseconds:)", "Stalls.sleepInSyscall(milliseconds:)"], onCPU: false,
                syscall: "poll"),
            Case(
                scenario: "observer", callout: "observer", functions: ["ObserverWork.flush(milliseconds:)"],
                onCPU: false,
                syscall: "poll"),
            // Observers that run at the top of a run, before the sources: under RunLoop.run(),
            // every pass enters the loop again.
            Case(
                scenario: "observer-before-timers", callout: "observer",
                functions: ["EarlyObserverWork.prepare(_:milliseconds:)"], onCPU: false, syscall: "poll"),
            Case(
                scenario: "observer-entry", callout: "observer",
                functions: ["EarlyObserverWork.prepare(_:milliseconds:)"], onCPU: false, syscall: "poll"),
            Case(
                scenario: "perform-block", callout: "perform-block", functions: ["PerformWork.render(milliseconds:)"],
                onCPU: true),
            Case(
                scenario: "nested", callout: "timer",
                functions: ["Stalls.burnCPU(milliseconds:)", "NestedLoop.runFor(seconds:mode:)"], onCPU: true),
            Case(
                scenario: "after-nested", callout: "timer", functions: ["Stalls.burnCPU(milliseconds:)"], onCPU: true),
            Case(scenario: "exit-reenter", callout: "timer", functions: ["Stalls.burnCPU(milliseconds:)"], onCPU: true),
            Case(
                scenario: "thread-loop", callout: "timer", functions: ["Stalls.burnCPU(milliseconds:)"], onCPU: true,
                loop: "StallmonFixture"),
        ]

        @Test(arguments: cases)
        func stallIsReportedWithItsCalloutFunctionAndDuration(_ expected: Case) throws {
            let run = try FixtureRun.run(expected.scenario)
            #expect(!run.standardError.contains(StrippedFoundation.warning))
            try check(run, expected)
        }

        /// Against a libFoundation stripped of CoreFoundation's local symbols: every callout kind
        /// is still named (from the call sites of the monitor's probe run, and libdispatch's
        /// exported main-queue callback), nesting still counts, and the monitor says once that the
        /// symbols are missing.
        @Test(arguments: [
            "timer-cpu", "main-queue-syscall", "main-actor", "source0", "observer", "perform-block", "nested",
            "after-nested", "observer-entry",
        ])
        func stallIsReportedWithItsCalloutWithoutCoreFoundationSymbols(_ scenario: String) throws {
            let expected = try #require(Self.cases.first { $0.scenario == scenario })
            let run = try FixtureRun.run(scenario, environment: try StrippedFoundation.environment())
            #expect(run.standardError.components(separatedBy: StrippedFoundation.warning).count == 2)
            try check(run, expected)
        }

        private func check(_ run: FixtureRun, _ expected: Case) throws {
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            try #require(run.detected.count == 1, "detected reports: \(run.detected.count)\n\(run.standardError)")
            try #require(run.ended.count == 1, "ended reports: \(run.ended.count)")
            let detected = run.detected[0]
            let ended = run.ended[0]
            let truth = try #require(run.truth(expected.truth ?? expected.scenario))

            #expect(detected.string("STALL_ID") == ended.string("STALL_ID"))
            #expect(detected.string("STALL_ID").count == 32)
            // Detected at the threshold (100 ms), not a sampling period later.
            #expect(detected.milliseconds("STALL_DURATION_USEC") >= 100)
            #expect(detected.milliseconds("STALL_DURATION_USEC") < 100 + 40)
            // The window holds the stalling code and little else.
            let duration = ended.milliseconds("STALL_DURATION_USEC")
            #expect(duration >= truth - 1 && duration <= truth + 15, "reported \(duration) ms, true \(truth) ms")

            #expect(ended.string("STALL_CALLOUT") == expected.callout)
            #expect(["before-sources", "after-waiting"].contains(ended.string("STALL_ACTIVITY")))
            #expect(ended.string("STALL_LOOP") == expected.loop)
            #expect(ended.string("STALL_FINGERPRINT").count == 16)
            #expect(ended.number("STALL_SAMPLES") >= 20)
            #expect(
                ended.samplesMostlyAnswered,
                "\(ended.number("STALL_SAMPLES_UNANSWERED")) of \(ended.number("STALL_SAMPLES")) samples unanswered")

            for function in expected.functions {
                let frame = ended.frames.first { ($0["function"] as? String) == function }
                let found = try #require(frame, "\(function) not in \(ended.frames.map { $0["function"] ?? "" })")
                #expect((found["file"] as? String)?.hasSuffix(".swift") == true)
                #expect((found["line"] as? Int ?? 0) > 0)
            }
            #expect(ended.string("MESSAGE").contains(ended.string("STALL_FRAME")))
            #expect(ended.string("STALL_BACKTRACE").contains(expected.functions[0]))

            let cpu = ended.milliseconds("STALL_CPU_USEC")
            if expected.onCPU {
                #expect(ended.string("STALL_THREAD_STATE") == "R")
                // All the CPU the stalling code used (on a busy machine, less than the duration).
                let truthCPU =
                    run.truths.first { $0.string("name") == expected.truth ?? expected.scenario }
                    .map { $0.number("cpu_ns") / 1e6 } ?? .nan
                #expect(cpu >= truthCPU * 0.99 - 2, "cpu \(cpu) ms, the stalling code used \(truthCPU) ms")
                #expect(ended.string("MESSAGE").contains("on CPU"))
            } else {
                #expect(ended.string("STALL_THREAD_STATE") == "S")
                #expect(ended.string("STALL_THREAD_SYSCALL") == expected.syscall)
                #expect(cpu <= duration * 0.2, "cpu \(cpu) ms of \(duration) ms")
                #expect(ended.string("MESSAGE").contains("blocked in \(expected.syscall ?? "")"))
            }
        }

        /// Real-time threads take every CPU for 30 ms out of every 80, so the watchdog often wakes
        /// late because it waited for a CPU. That is no stop of the process: the stall is reported
        /// once with its whole duration.
        @Test(arguments: ["timer-cpu", "nested"])
        func stallOnACrowdedMachineKeepsItsDuration(_ scenario: String) throws {
            let hogs = CPUHogs(busy: 0.030, period: 0.080)
            defer { hogs.stop() }
            let run = try FixtureRun.run(scenario)
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            try #require(run.detected.count == 1, "detected reports: \(run.detected.count)\n\(run.standardError)")
            try #require(run.ended.count == 1, "ended reports: \(run.ended.count)")
            let truth = try #require(run.truth(scenario))
            let duration = run.ended[0].milliseconds("STALL_DURATION_USEC")
            #expect(duration >= truth - 1 && duration <= truth + 40, "reported \(duration) ms, true \(truth) ms")
        }

        @Test func sameStallInTwoRunsHasTheSameFingerprint() throws {
            let first = try FixtureRun.run("timer-cpu")
            let second = try FixtureRun.run("timer-cpu")
            let a = try #require(first.ended.first).string("STALL_FINGERPRINT")
            let b = try #require(second.ended.first).string("STALL_FINGERPRINT")
            #expect(a == b)
            let other = try #require(try FixtureRun.run("main-queue-syscall").ended.first).string("STALL_FINGERPRINT")
            #expect(other != a)
        }

        @Test func monitorStoppedAndStartedAgainReportsBothStallsOnce() throws {
            let run = try FixtureRun.run("restart")
            #expect(run.ended.count == 2)
            #expect(run.detected.count == 2)
            #expect(run.stopped.count == 2)
            let durations = run.ended.map { $0.milliseconds("STALL_DURATION_USEC") }
            for (duration, truth) in zip(durations, [run.truth("restart-1"), run.truth("restart-2")]) {
                let truth = try #require(truth)
                #expect(abs(duration - truth) <= 15)
            }
            #expect(run.ended.last?.string("STALL_THREAD_SYSCALL") == "poll")
        }

        @Test func repeatedStallsAreRateLimitedWithCounts() throws {
            let run = try FixtureRun.run("repeat")
            let stalls = try #require(run.stopped.first?["stalls"] as? Int)
            let suppressed = run.lines.filter { $0["type"] as? String == "suppressed" }
            let summarized = suppressed.map { Int($0.string("STALL_SUPPRESSED_COUNT")) ?? 0 }.reduce(0, +)
            #expect(stalls >= 8)
            #expect(!suppressed.isEmpty)
            // Every stall is either reported (detected and ended) or counted in a summary.
            #expect(run.ended.count + summarized == stalls)
            #expect(run.detected.count == run.ended.count)
            #expect(suppressed.allSatisfy { $0.string("MESSAGE_ID") == "1332568df10e41a0927f220ff4dc212b" })
            #expect(
                suppressed.allSatisfy { $0.string("STALL_FINGERPRINT") == run.ended.first?.string("STALL_FINGERPRINT") }
            )
            #expect(suppressed.allSatisfy { $0.string("STALL_RATE_LIMIT_BURST") == "2" })
            #expect(suppressed.allSatisfy { (Double($0.string("STALL_SUPPRESSED_WORST_USEC")) ?? 0) >= 150_000 })
        }

        @Test func workInsideAllowingStallIsNotReported() throws {
            let run = try FixtureRun.run("allowed")
            // The 500 ms inside allowingStall is not reported; the 400 ms burn after it is.
            #expect(run.ended.count == 1)
            let truth = try #require(run.truth("allowed"))
            #expect(abs((run.ended.first?.milliseconds("STALL_DURATION_USEC") ?? 0) - truth) <= 15)
            #expect(run.ended.first?.string("STALL_THREAD_STATE") == "R")
        }

        @Test func stallInsideStartupGracePeriodIsNotReported() throws {
            let run = try FixtureRun.run("grace")
            #expect(run.ended.count == 1)
            let truth = try #require(run.truth("grace"))
            #expect(abs((run.ended.first?.milliseconds("STALL_DURATION_USEC") ?? 0) - truth) <= 15)
            #expect(run.stopped.first?["stalls"] as? Int == 2, "both stalls are counted, one is reported")
        }
    }
}
