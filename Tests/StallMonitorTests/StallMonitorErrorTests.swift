import Logging
import StallmonTestSupport
import Testing

@testable import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// Callers match a failed start on its code, never on its text. The monitors run in this process.
extension Serial {
    @Suite
    struct StallMonitorErrorTests {
        @Test func everyErrorCodeIsDistinctAndNamed() {
            let codes: [StallMonitorError.Code] = [
                .alreadyRunning, .signalUnavailable, .tooManyMonitors, .outOfMemory, .asyncMainOffMainThread,
                .asyncMainHookUnavailable, .eventLoopDidNotAnswer, .runLoopTargetInAsyncMain,
            ]
            #expect(Set(codes).count == codes.count)
            #expect(Set(codes.map(\.description)).count == codes.count)
            #expect(StallMonitorError.Code.alreadyRunning.description == "alreadyRunning")
            let errors: [StallMonitorError] = [
                .alreadyRunning(), .signalUnavailable(SIGUSR2, reason: "another handler owns it"), .tooManyMonitors(),
                .outOfMemory(), .asyncMainOffMainThread(), .asyncMainHookUnavailable(reason: "no hook"),
                .eventLoopDidNotAnswer(), .runLoopTargetInAsyncMain(),
            ]
            #expect(errors.map(\.code) == codes)
            #expect(errors[1].description == "sampling signal SIGUSR2 is unavailable: another handler owns it")
            #expect(errors[7].description.contains("call start(.asyncMain)"))
            #expect(StallMonitorError.Code.eventLoopCountsNoTicks.description == "eventLoopCountsNoTicks")
        }

        @Test func errorsOfOneCodeAreEqualWhereverTheyWereRaised() {
            let first = StallMonitorError.alreadyRunning()
            let second = StallMonitorError.alreadyRunning()
            #expect(first.line != second.line)
            #expect(first == second)
            #expect(first != StallMonitorError.tooManyMonitors())
        }

        @Test func startingARunningMonitorThrowsAlreadyRunning() throws {
            let monitor = try StallMonitor(configuration: StallMonitor.Configuration(), logger: .quiet, sinks: [])
            try monitor.start(.currentThread)
            defer { monitor.stop() }
            let error = #expect(throws: StallMonitorError.self) { try monitor.start(.currentThread) }
            #expect(error?.code == .alreadyRunning)
            #expect(monitor.isRunning)
        }

        @Test func aSamplingSignalSomeoneElseHandlesThrowsSignalUnavailable() throws {
            let signal = __libc_current_sigrtmin() + 7
            let previous = Glibc.signal(signal, SIG_IGN)
            defer { _ = Glibc.signal(signal, previous) }
            var configuration = StallMonitor.Configuration()
            configuration.signal = signal
            let monitor = try StallMonitor(configuration: configuration, logger: .quiet, sinks: [])
            let error = #expect(throws: StallMonitorError.self) { try monitor.start(.currentThread) }
            #expect(error?.code == .signalUnavailable)
            #expect(error?.description.contains("SIGRTMIN+7") == true)
            #expect(!monitor.isRunning)
        }

        @Test func startingForAnAsyncMainOffTheMainThreadThrowsAsyncMainOffMainThread() throws {
            let monitor = try StallMonitor(configuration: StallMonitor.Configuration(), logger: .quiet, sinks: [])
            let error = #expect(throws: StallMonitorError.self) { try monitor.start(.asyncMain) }
            #expect(error?.code == .asyncMainOffMainThread)
        }
    }
}
