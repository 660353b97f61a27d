import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// The monitor never changes the program it watches: a system call the stalled thread sits in
    /// is not ended by the sampling signal (a handler ends nanosleep, poll and epoll_wait with EINTR
    /// whatever SA_RESTART says), and a signal the program took over after start() is never sent.
    @Suite
    struct UntouchedProgramTests {
        struct Case: Sendable, CustomTestStringConvertible {
            var scenario: String
            var call: String
            var function: String
            var syscall: String
            var testDescription: String { scenario }
        }

        static let blocked: [Case] = [
            Case(
                scenario: "blocked-usleep", call: "usleep", function: "SyscallStalls.sleepWithUsleep(milliseconds:)",
                syscall: "clock_nanosleep"),
            Case(
                scenario: "blocked-poll", call: "poll", function: "SyscallStalls.pollEmptyPipe(milliseconds:)",
                syscall: "poll"),
            Case(
                scenario: "blocked-epoll", call: "epoll_wait", function: "SyscallStalls.waitInEpoll(milliseconds:)",
                syscall: "epoll_wait"),
        ]

        @Test(arguments: blocked)
        func systemCallInsideAStallRunsItsCourseAndTheStackIsUnwoundInPlace(_ expected: Case) throws {
            let run = try FixtureRun.run(expected.scenario)
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            let call = try #require(run.syscalls.first { $0.string("call") == expected.call })
            #expect(
                call.number("result") == 0,
                "\(expected.call) returned \(call.number("result")), errno \(call.number("errno"))")
            #expect(call.number("errno") == 0)
            #expect(call.number("elapsed_ms") >= 600, "\(expected.call) returned after \(call.number("elapsed_ms")) ms")

            try #require(run.detected.count == 1 && run.ended.count == 1, "\(run.standardError)")
            for report in [run.detected[0], run.ended[0]] {
                #expect(report.string("STALL_STACK_SOURCE") == "kernel")
                #expect(report.string("STALL_FRAME").hasPrefix(expected.function), "\(report.string("STALL_FRAME"))")
                let frame = try #require(
                    report.frames.first { ($0["function"] as? String) == expected.function },
                    "\(report.frames.map { $0["function"] ?? "" })")
                #expect((frame["file"] as? String)?.hasSuffix("SyscallStalls.swift") == true)
                #expect((frame["line"] as? Int ?? 0) > 0)
                #expect(report.string("STALL_THREAD_SYSCALL") == expected.syscall)
            }
            let ended = run.ended[0]
            #expect(ended.number("STALL_SAMPLES") >= 20)
            #expect(
                ended.samplesMostlyAnswered,
                "\(ended.number("STALL_SAMPLES_UNANSWERED")) of \(ended.number("STALL_SAMPLES")) samples unanswered")
            // Unwound through the Swift frames down to the run loop, not only the C library's wrapper.
            #expect(ended.string("STALL_CALLOUT") == "main-queue")
            #expect(ended.string("STALL_BACKTRACE").contains("CFRunLoopRunSpecific"))
            #expect(!run.standardError.contains("EINTR"), "\(run.standardError)")
        }

        /// A thread that sleeps in 50 µs steps runs only microseconds at a time: it is not
        /// signalled while it keeps blocking, so a signal (1 ms samples for two seconds, some 1,500)
        /// almost never lands in its next sleep. What remains is the few microseconds between the
        /// last look and the signal. Signalled on every sample, over 1,000 of its calls end with
        /// EINTR.
        @Test func threadThatKeepsEnteringShortSystemCallsIsAlmostNeverInterrupted() throws {
            let run = try FixtureRun.run(
                "short-sleeps",
                arguments: [
                    "--threshold-ms", "10", "--sample-interval-ms", "1", "--stall-ms", "50", "--stack-source", "signal",
                ])
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            let loop = try #require(run.lines.first { $0["type"] as? String == "short-sleeps" })
            let calls = try #require(loop["calls"] as? Int)
            let interrupted = try #require(loop["eintr"] as? Int)
            #expect(calls > 1000)
            #expect(interrupted <= 3, "\(interrupted) of \(calls) calls ended with EINTR")
            let ended = try #require(run.ended.first)
            #expect(ended.number("STALL_SAMPLES") >= 500)
            #expect(ended.string("STALL_FRAME").hasPrefix("SyscallStalls.sleepInShortSteps(seconds:microseconds:)"))
        }

        /// `interrupt_blocked_threads` is the documented opt-in: the blocked thread is signalled,
        /// and its poll ends with EINTR at the first sample, which the logger says once.
        @Test func interruptingBlockedThreadsIsOptInAndEndsTheCallWithEINTR() throws {
            let run = try FixtureRun.run("blocked-poll", arguments: ["--interrupt-blocked"])
            #expect(run.exitStatus == 0, "fixture failed: \(run.standardError)")
            let call = try #require(run.syscalls.first)
            #expect(call.number("result") == -1)
            #expect(call.number("errno") == Double(EINTR))
            #expect(call.number("elapsed_ms") < 600)
            let ended = try #require(run.ended.first)
            #expect(ended.string("STALL_STACK_SOURCE") == "signal")
            #expect(ended.string("STALL_FRAME").hasPrefix("SyscallStalls.pollEmptyPipe(milliseconds:)"))
            #expect(run.standardError.components(separatedBy: "returned EINTR").count == 2, "\(run.standardError)")
        }

        static let takeovers: [(scenario: String, how: String)] = [
            ("signal-default", "reset it to SIG_DFL"), ("signal-ignore", "ignores it"),
            ("signal-handler", "installed its own handler"),
        ]

        /// After start(), the program resets the sampling signal to SIG_DFL (which would kill it),
        /// ignores it, or handles it itself. The monitor sends it no more: a stall on the CPU gets a
        /// report that says why it has no stack, a blocked one its stack from the kernel's view, and
        /// the logger says it once.
        @Test(arguments: takeovers)
        func signalTheProgramTookOverIsNeverSent(_ takeover: (scenario: String, how: String)) throws {
            // The signal path: perf events would take the stack with no signal at all.
            let run = try FixtureRun.run(takeover.scenario, arguments: ["--stack-source", "signal"])
            #expect(run.exitStatus == 0, "fixture died: \(run.exitStatus) \(run.standardError)")
            let handler = try #require(run.lines.first { $0["type"] as? String == "handler" })
            #expect(handler["calls"] as? Int == 0, "the program's own handler ran")
            try #require(run.ended.count == 2, "ended reports: \(run.ended.count)\n\(run.standardError)")

            let onCPU = run.ended[0]
            let reason = "the program took over SIGRTMAX-4 (\(takeover.how))"
            #expect(onCPU.string("MESSAGE").contains(reason), "\(onCPU.string("MESSAGE"))")
            #expect(onCPU.string("STALL_BACKTRACE").contains("no stack: \(reason)"))
            #expect(onCPU.string("STALL_STACK_SOURCE") == "")
            #expect(onCPU.number("STALL_SAMPLES_UNANSWERED") == onCPU.number("STALL_SAMPLES"))
            let truth = try #require(run.truth("\(takeover.scenario)-cpu"))
            #expect(abs(onCPU.milliseconds("STALL_DURATION_USEC") - truth) <= 15)

            let blocked = run.ended[1]
            #expect(blocked.string("STALL_STACK_SOURCE") == "kernel")
            #expect(blocked.string("STALL_FRAME").hasPrefix("SyscallStalls.pollEmptyPipe(milliseconds:)"))
            let call = try #require(run.syscalls.first)
            #expect(call.number("result") == 0 && call.number("elapsed_ms") >= 600)

            let warnings = run.standardError.components(separatedBy: "took over the sampling signal").count - 1
            #expect(warnings == 1, "\(run.standardError)")
        }
    }
}

extension FixtureRun {
    /// What the fixture's system calls returned (`SyscallStalls`).
    var syscalls: [[String: Any]] { lines.filter { $0["type"] as? String == "syscall" } }
}
