import StallMonitor

/// Reports as the monitor makes them, for the tests of what it writes.
enum Reports {
    /// A 312 ms stall in a timer callout of the main run loop, at `Service.refresh()` unless `stack`
    /// says otherwise.
    static func report(event: StallReport.Event = .ended, stack: [StallFrame]? = nil) -> StallReport {
        StallReport(
            event: event, stallID: "0123456789abcdef0123456789abcdef", loop: "main", threadID: 42,
            duration: .milliseconds(312), threshold: .milliseconds(250), activity: .afterWaiting,
            runLoopMode: "kCFRunLoopDefaultMode", callout: .timer, threadState: "R", syscall: nil, waitChannel: nil,
            cpuTime: .milliseconds(300), samples: 15, unansweredSamples: 0, stackSamples: 14,
            stack: stack ?? [
                StallFrame(
                    address: 0x1000, image: "/usr/bin/service", symbol: "Service.Service.refresh() -> ()",
                    function: "Service.refresh()", offset: 12, file: "/src/Service.swift", line: 42),
                StallFrame(
                    address: 0x2000, image: "/usr/lib/libFoundation.so",
                    symbol: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__",
                    function: "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__"),
            ],
            fingerprint: "00000000deadbeef", noStackReason: nil, startNanoseconds: 1, pausedTime: .zero
        )
    }
}
