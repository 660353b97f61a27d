import Foundation
import StallJournal
import StallMonitor
import StallmonTestSupport
import Testing

extension Serial {
    /// Services with an async `@main` (Sources/StallmonAsyncFixture), as child processes. On Linux
    /// their main thread runs no run loop unless the monitor runs one (`start(.asyncMain)`); a
    /// monitor started as for a run-loop service sees nothing, and says so instead of calling the
    /// service healthy.
    @Suite
    struct AsyncServiceTests {
        static func run(
            _ scenario: String, arguments: [String] = [], environment: [String: String] = [:]
        ) throws -> FixtureRun {
            try FixtureRun.run(scenario, arguments: arguments, environment: environment, executable: .asyncFixture)
        }

        /// Watchdog context switches between two of the fixture's half-second readings.
        static func switches(_ run: FixtureRun, from start: Double, to end: Double) throws -> Int {
            let readings = run.lines.filter { $0.string("type") == "switches" }.map {
                (seconds: $0.number("elapsed_ns") / 1e9, count: Int($0.number("count")))
            }
            let first = try #require(readings.first { $0.seconds >= start }, "no reading after \(start) s")
            let last = try #require(readings.last { $0.seconds <= end }, "no reading before \(end) s")
            return last.count - first.count
        }

        /// README's first snippet, `start()`, in an async `main()`: the main run loop it would watch
        /// never runs there on Linux, so it throws at once, saying what to call, rather than leave
        /// the service unwatched.
        @Test func asyncMainStartedLikeARunLoopServiceThrowsAtOnceSayingWhatToCall() throws {
            let run = try Self.run("unwatched")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let error = try #require(run.lines.first { $0.string("type") == "error" }, "start() did not throw")
            #expect(error.string("code") == "runLoopTargetInAsyncMain")
            #expect(error.string("description").contains("call start(.asyncMain) in main() before its first await"))
            #expect(error.string("description").contains("startService()"))
            #expect(run.detected.isEmpty && run.ended.isEmpty)
        }

        @Test func runLoopServiceStartedBeforeItsLoopStillGetsPings() throws {
            let socket = try NotifySocket()
            defer { socket.close() }
            let run = try FixtureRun.run(
                "idle", arguments: ["--seconds", "2"],
                environment: ["NOTIFY_SOCKET": socket.path, "WATCHDOG_USEC": "1000000"]
            )
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let pings = socket.messages().filter { $0.text == "WATCHDOG=1" }.map(\.time)
            #expect(pings.count >= 3, "\(pings.count) pings in 2 s")
            for (earlier, later) in zip(pings, pings.dropFirst()) {
                #expect(Double(later - earlier) / 1e6 < 700, "pings \(Double(later - earlier) / 1e6) ms apart")
            }
            #expect(!run.standardError.contains("cannot see"))
        }

        struct Stall: Sendable, CustomTestStringConvertible {
            var truth: String
            var callout: String
            var function: String
            var onCPU: Bool
            var syscall: String?

            var testDescription: String { truth }
        }

        static let stalls = [
            Stall(
                truth: "main-actor-cpu", callout: "main-actor", function: "AsyncWork.recompute(milliseconds:)",
                onCPU: true),
            Stall(
                truth: "main-actor-syscall", callout: "main-actor",
                function: "AsyncWork.readConfiguration(milliseconds:)", onCPU: false, syscall: "poll"),
            Stall(
                truth: "main-actor-lock", callout: "main-actor", function: "AsyncWork.waitForCache(_:)", onCPU: false,
                syscall: "futex"),
            Stall(
                truth: "main-queue-cpu", callout: "main-queue", function: "AsyncWork.flushMetrics(milliseconds:)",
                onCPU: true),
        ]

        @Test func mainActorAndMainQueueStallsOfAnAsyncMainAreEachReportedOnce() throws {
            let run = try Self.run("stalls", arguments: ["--seconds", "5.2"])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            try #require(run.detected.count == 4, "detected: \(run.detected.count)\n\(run.standardError)")
            try #require(run.ended.count == 4, "ended: \(run.ended.count)")
            #expect(!run.standardError.contains("cannot see"))
            for (index, expected) in Self.stalls.enumerated() {
                let truthLine = try #require(run.truths.first { $0.string("name") == expected.truth })
                // Main-actor work runs on the main thread, as on Darwin.
                #expect(truthLine["main_thread"] as? Bool == true, "\(expected.truth) ran off the main thread")
                let truth = truthLine.number("duration_ns") / 1e6
                let detected = run.detected[index]
                let ended = run.ended[index]
                #expect(detected.string("STALL_ID") == ended.string("STALL_ID"))
                #expect(detected.milliseconds("STALL_DURATION_USEC") >= 100)
                #expect(detected.milliseconds("STALL_DURATION_USEC") < 100 + 40)
                let duration = ended.milliseconds("STALL_DURATION_USEC")
                #expect(abs(duration - truth) <= 15, "\(expected.truth): reported \(duration) ms, true \(truth) ms")
                #expect(ended.string("STALL_CALLOUT") == expected.callout, "\(expected.truth)")
                #expect(ended.string("STALL_LOOP") == "main")
                #expect(ended.string("STALL_FRAME").hasPrefix(expected.function), "\(ended.string("STALL_FRAME"))")
                let frame = try #require(ended.frames.first { $0["function"] as? String == expected.function })
                #expect((frame["file"] as? String)?.hasSuffix("AsyncFixture.swift") == true)
                #expect((frame["line"] as? Int ?? 0) > 0)
                #expect(
                    ended.samplesMostlyAnswered,
                    "\(ended.number("STALL_SAMPLES_UNANSWERED")) of \(ended.number("STALL_SAMPLES")) samples unanswered"
                )
                // The CPU time the thread really used: on a busy machine a CPU-bound stall gets
                // less than its duration, and the report says so.
                let cpu = ended.milliseconds("STALL_CPU_USEC")
                let trueCPU = truthLine.number("cpu_ns") / 1e6
                #expect(abs(cpu - trueCPU) <= 15, "\(expected.truth): cpu \(cpu) ms, truly \(trueCPU) ms")
                if expected.onCPU {
                    #expect(ended.string("STALL_THREAD_STATE") == "R")
                    #expect(ended.string("MESSAGE").contains("on CPU"))
                } else {
                    #expect(ended.string("STALL_THREAD_STATE") == "S")
                    #expect(ended.string("STALL_THREAD_SYSCALL") == expected.syscall)
                    #expect(cpu <= duration * 0.2, "\(expected.truth): cpu \(cpu) ms of \(duration) ms")
                }
            }
            #expect(run.lines.first { $0.string("type") == "statistics" }?.number("stalls") == 4)
        }

        @Test func mainActorStallsOfAnAsyncMainReadBackFromTheJournal() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let identifier = "stallmon-async-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try Self.run("stalls", arguments: ["--seconds", "5.2", "--journal", "--identifier", identifier])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let ended = try Journald.host.entries(
                ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)"], atLeast: 4)
            try #require(ended.count == 4)
            #expect(ended.map { $0["STALL_CALLOUT"] } == ["main-actor", "main-actor", "main-actor", "main-queue"])
            #expect(ended.allSatisfy { $0["STALL_THREAD_TID"] == $0["_PID"] && $0["STALL_LOOP"] == "main" })
            // The light drain runs no run-loop mode.
            #expect(ended.allSatisfy { $0["STALL_RUNLOOP_MODE"] == "none" })
            #expect(
                ended[0]["MESSAGE"]?.hasPrefix("main run loop stalled") == true
                    && ended[0]["MESSAGE"]?.contains("in main-actor job at AsyncWork.recompute(milliseconds:)") == true,
                "\(ended[0]["MESSAGE"] ?? "")")
            #expect(ended[1]["STALL_THREAD_SYSCALL"] == "poll")
            #expect(ended[2]["STALL_THREAD_SYSCALL"] == "futex")
            for (entry, printed) in zip(ended, run.ended) {
                #expect(entry["STALL_DURATION_USEC"] == printed.string("STALL_DURATION_USEC"))
                #expect(entry["STALL_FRAME"] == printed.string("STALL_FRAME"))
            }
            let record = try StallRecord(journalFields: ended[0])
            #expect(record.callout == "main-actor")
        }

        @Test func stallsOfAnAsyncMainThatRunsTheMainRunLoopAreReportedLikeTheLightDrains() throws {
            let run = try Self.run("stalls", arguments: ["--seconds", "5.2", "--drain", "run-loop"])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            try #require(run.ended.count == 4, "ended: \(run.ended.count)\n\(run.standardError)")
            #expect(run.ended.map { $0.string("STALL_CALLOUT") } == Self.stalls.map(\.callout))
            #expect(run.ended.allSatisfy { $0.string("STALL_RUNLOOP_MODE") == "kCFRunLoopDefaultMode" })
            #expect(run.ended.allSatisfy { $0.frames.contains { $0["function"] as? String == "CFRunLoopRun" } })
            for (expected, ended) in zip(Self.stalls, run.ended) {
                let truth = try #require(run.truth(expected.truth))
                let duration = ended.milliseconds("STALL_DURATION_USEC")
                #expect(abs(duration - truth) <= 15, "\(expected.truth): reported \(duration) ms, true \(truth) ms")
                #expect(ended.string("STALL_FRAME").hasPrefix(expected.function))
            }
        }

        @Test func runLoopTimersFireUnderTheRunLoopDrainOnlyAsUnderDispatchMain() throws {
            let light = try Self.run("timers", arguments: ["--seconds", "1.2"])
            let runLoop = try Self.run("timers", arguments: ["--seconds", "1.2", "--drain", "run-loop"])
            #expect(light.exitStatus == 0 && runLoop.exitStatus == 0, "\(light.standardError)\(runLoop.standardError)")
            let lightFired = try #require(light.lines.first { $0.string("type") == "timers" }).number("fired")
            let runLoopFired = try #require(runLoop.lines.first { $0.string("type") == "timers" }).number("fired")
            #expect(lightFired == 0)
            #expect(runLoopFired >= 5, "\(runLoopFired) firings in 1 s")
        }

        @Test func idleAsyncMainIsNeverReportedAndCostsTheWatchdogNoWakeups() throws {
            let run = try Self.run("idle", arguments: ["--seconds", "10.4"])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            #expect(run.detected.isEmpty && run.ended.isEmpty)
            #expect(!run.standardError.contains("cannot see"))
            #expect(try Self.switches(run, from: 0.9, to: 10.1) == 0)
        }

        @Test func asyncMainWatchdogPingsStopDuringAMainActorStall() throws {
            let socket = try NotifySocket()
            defer { socket.close() }
            let run = try Self.run(
                "watchdog", arguments: ["--seconds", "5"],
                environment: ["NOTIFY_SOCKET": socket.path, "WATCHDOG_USEC": "1000000"]
            )
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let truth = try #require(run.truths.first)
            let stallStart = UInt64(truth.number("start_ns"))
            let stallEnd = UInt64(truth.number("end_ns"))
            let pings = socket.messages().filter { $0.text == "WATCHDOG=1" }.map(\.time)
            #expect(pings.filter { $0 < stallStart }.count >= 2)
            #expect(
                pings.allSatisfy { $0 < stallStart + 100_000_000 || $0 >= stallEnd }, "a ping went out during the stall"
            )
            let firstAfter = try #require(pings.first { $0 > stallEnd })
            #expect(Double(firstAfter - stallEnd) / 1e6 < 100)
            let finals = run.lines.filter { $0.string("type") == "watchdog" }
            #expect(finals.count == 1)
            #expect(finals.first?.string("STALL_CALLOUT") == "main-actor")
            let ended = try #require(run.ended.first)
            #expect(abs(ended.milliseconds("STALL_DURATION_USEC") - Double(stallEnd - stallStart) / 1e6) <= 15)
        }

        @Test func startingForAnAsyncMainAfterItsFirstAwaitThrowsSayingWhy() throws {
            let run = try Self.run("late")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let error = try #require(run.lines.first { $0.string("type") == "error" })
            #expect(error["main_thread"] as? Bool == false)
            #expect(
                error.string("description").contains(
                    "start(.asyncMain) must run on the main thread, in main() before its first await"))
            #expect(run.lines.allSatisfy { $0.string("type") != "started" })
        }

        @Test func anAsyncMainHasOneDrainAndStartingForTheOtherThrowsSayingWhy() throws {
            let run = try Self.run("other-drain")
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let error = try #require(run.lines.first { $0.string("type") == "error" })
            #expect(error.string("description").contains("an earlier start chose the other drain of the main queue"))
            // The light drain chosen first still runs main-actor work on the main thread.
            #expect(run.lines.first { $0.string("type") == "drained" }?["main_thread"] as? Bool == true)
            #expect(run.lines.filter { $0.string("type") == "started" }.count == 1)
        }

        @Test func startingForAnAsyncMainOffTheMainThreadThrows() throws {
            let monitor = try StallMonitor(configuration: StallMonitor.Configuration(), sinks: [])
            #expect(throws: StallMonitorError.self) { try monitor.start(.asyncMain) }
            #expect(!monitor.isRunning)
        }
    }
}
