import CStallCapture
import Foundation
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Where the kernel can take the stack, no signal goes into the program: a perf event on the
    /// stalled thread samples its registers and the top of its stack while the stall lasts, and the
    /// watchdog unwinds each record as it unwinds the signal path's copies.
    @Suite
    struct PerfSamplingTests {
        /// A CPU stall's report comes from perf events, names the same frame as the signal path does
        /// for the same stall, and the stalled thread took no signal: neither the monitor's handler
        /// nor the program's own on SIGPROF and the other real-time signals ran, and nothing is
        /// pending for it. No perf descriptor is open before the stall or after it ends.
        @Test func aCPUStallIsSampledByTheKernelWithNoSignal() throws {
            let run = try FixtureRun.run("perf-stall", timeout: 20)
            #expect(run.exitStatus == 0, "\(run.standardError.suffix(2000))")
            let ended = try #require(run.ended.first)
            #expect(ended.string("STALL_STACK_SOURCE") == "perf")
            #expect(ended.samplesMostlyAnswered)
            #expect(ended.frames.contains { $0["function"] as? String == "Stalls.burnCPU(milliseconds:)" })
            #expect(abs(ended.milliseconds("STALL_DURATION_USEC") - (run.truth("perf-stall") ?? 0)) <= 15)

            let signals = try #require(run.lines.first { $0["type"] as? String == "signals" })
            #expect(signals.number("monitor_handled") == 0)
            #expect(signals.number("program_handled") == 0)
            #expect(signals.string("thread_pending") == "0000000000000000")
            #expect(signals.string("process_pending") == "0000000000000000")

            let descriptors = Dictionary(
                uniqueKeysWithValues: run.lines.filter { $0["type"] as? String == "perf-fds" }.map {
                    ($0.string("when"), $0.number("count"))
                })
            #expect(descriptors == ["before": 0, "during": 1, "after": 0])

            // The same stall through the signal path: the same frame, and the monitor's handler ran.
            let signalled = try FixtureRun.run("perf-stall", arguments: ["--stack-source", "signal"], timeout: 20)
            let signalEnded = try #require(signalled.ended.first)
            #expect(signalEnded.string("STALL_STACK_SOURCE") == "signal")
            #expect(signalEnded.string("STALL_FRAME") == ended.string("STALL_FRAME"))
            let signalCounts = try #require(signalled.lines.first { $0["type"] as? String == "signals" })
            #expect(signalCounts.number("monitor_handled") > 0)
            #expect(signalCounts.number("program_handled") == 0)
        }

        /// Under a seccomp filter (Docker's default profile refuses perf_event_open; a unit's
        /// SystemCallFilter= may kill the process for it), `auto` does not try the call: the monitor
        /// samples with the signal for the life of the process and says why once.
        @Test func underASeccompFilterTheSignalSamplesAndTheLogSaysWhyOnce() throws {
            let run = try FixtureRun.run("perf-stall-denied", timeout: 20)
            #expect(run.exitStatus == 0, "\(run.standardError.suffix(2000))")
            let ended = try #require(run.ended.first)
            #expect(ended.string("STALL_STACK_SOURCE") == "signal")
            #expect(ended.samplesMostlyAnswered)
            #expect(ended.frames.contains { $0["function"] as? String == "Stalls.burnCPU(milliseconds:)" })
            let refusals = run.standardError.split(separator: "\n").filter {
                $0.contains("no perf event tried: a seccomp filter applies to the process")
            }
            #expect(refusals.count == 1, "\(run.standardError.suffix(2000))")
            #expect(refusals.first?.contains("sampled with the signal") == true)
            #expect(run.lines.filter { $0["type"] as? String == "perf-fds" }.allSatisfy { $0.number("count") == 0 })
        }

        /// `stack_source` "perf" never signals, and tries the call under a seccomp filter too (the
        /// service vouches for it): where the kernel refuses, a stall on the CPU has no stack and
        /// says why, and the monitor installed no handler.
        @Test func stackSourcePerfNeverSignalsEvenWhenRefused() throws {
            let run = try FixtureRun.run("perf-stall-denied", arguments: ["--stack-source", "perf"], timeout: 20)
            #expect(run.exitStatus == 0)
            let ended = try #require(run.ended.first)
            #expect(ended.string("STALL_BACKTRACE").contains("the kernel refused a perf event"))
            let signals = try #require(run.lines.first { $0["type"] as? String == "signals" })
            #expect(signals.number("monitor_handled") == 0)
            #expect(
                run.standardError.contains("the kernel refused a perf event (perf_event_open: Operation not permitted)")
            )
            #expect(run.standardError.contains("stack_source is perf: running threads get no stack"))
        }
    }
}
