import Foundation
import StallMonitor
import StallMonitorTestKit
import StallmonTestSupport
import Testing

extension Serial {
    @Suite
    struct WatchdogThreadTests {
        /// Measurements read the watchdog's CPU clock right after `start()`: its thread id must be
        /// known by then, on every start.
        @Test func watchdogThreadIDIsKnownWhenStartReturns() throws {
            let monitor = try StallMonitor(configuration: StallMonitor.Configuration(), sinks: [CollectingSink()])
            var unknown = 0
            for _ in 0..<100 {
                try monitor.start(.currentThread)
                let threadID = monitor.watchdogThreadID
                if threadID == 0 { unknown += 1 }
                if threadID != 0 {
                    let name = try? String(contentsOfFile: "/proc/self/task/\(threadID)/comm", encoding: .utf8)
                    #expect(name == "stallmon-watch\n")
                }
                monitor.stop()
            }
            #expect(unknown == 0, "\(unknown) of 100 starts returned before the watchdog thread had an id")
        }
    }
}
