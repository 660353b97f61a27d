import Foundation
import StallMonitor
import StallMonitorTestKit
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// `withStallDetection`, as a service's own tests use it: the real pool hook and watchdog in
    /// this process, a real stall on a pool thread.
    @Suite
    struct WithStallDetectionTests {
        /// A body that holds its pool thread past the threshold fails with the stall, its frame and
        /// its duration.
        @Test func aBodyThatHoldsAPoolThreadThrowsTheStall() async throws {
            let error = await #expect(throws: StallsDetected.self) {
                try await withStallDetection(threshold: .milliseconds(50)) {
                    spinForDetection(milliseconds: 300)
                }
            }
            let reports = try #require(error?.reports)
            let report = try #require(
                reports.first { $0.stack.contains { $0.function?.contains("spinForDetection") == true } },
                "\(reports.map(\.message))")
            #expect(report.loop == "cooperative-pool")
            #expect(report.duration >= .milliseconds(250) && report.duration < .milliseconds(2_000))
            #expect(report.threshold == .milliseconds(50))
            let description = try #require(error?.description)
            #expect(description.contains("past 50 ms"))
            #expect(description.contains("spinForDetection"))
        }

        /// A body that only awaits (the pool thread is free while it waits) passes, and returns
        /// its value.
        @Test func aBodyThatAwaitsReturnsItsValue() async throws {
            do {
                let value = try await withStallDetection(threshold: .milliseconds(50)) {
                    try await Task.sleep(for: .milliseconds(300))
                    return 42
                }
                #expect(value == 42)
            } catch let error as StallsDetected {
                // Another test's job may hold a pool thread meanwhile (the pool is the process's);
                // never this body's.
                #expect(
                    !error.reports.contains {
                        $0.stack.contains { $0.function?.contains("WithStallDetectionTests") == true }
                    },
                    "\(error)")
            }
        }

        /// What the body throws is what the caller gets, whatever stalled.
        @Test func theBodysErrorComesFirst() async throws {
            struct Failure: Error {}
            await #expect(throws: Failure.self) {
                try await withStallDetection(threshold: .milliseconds(50)) {
                    spinForDetection(milliseconds: 150)
                    throw Failure()
                }
            }
        }

        /// A call inside another's body runs under the outer watch (it waited forever for the
        /// outer call's turn): the stall it makes is the outer call's.
        @Test(.timeLimit(.minutes(1))) func aCallInsideAnothersBodyRunsUnderTheOuterWatch() async throws {
            let error = await #expect(throws: StallsDetected.self) {
                try await withStallDetection(threshold: .milliseconds(50)) {
                    try await withStallDetection(threshold: .milliseconds(50)) {
                        spinForDetection(milliseconds: 300)
                    }
                }
            }
            #expect(
                error?.reports.contains { $0.stack.contains { $0.function?.contains("spinForDetection") == true } }
                    == true)
        }

        /// A body on the main actor runs on the main queue, which is not watched: that is said,
        /// never passed as healthy.
        @Test @MainActor func aBodyOnTheMainActorIsRefusedNotPassed() async throws {
            await #expect(throws: StallDetectionUnavailable.self) {
                try await withStallDetection(threshold: .milliseconds(50)) { spinForDetection(milliseconds: 100) }
            }
        }

        /// Calls at once take turns: each watches the pool alone, and neither is refused.
        @Test func callsAtOnceTakeTurns() async throws {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for index in 0..<3 {
                    group.addTask {
                        try await withStallDetection(threshold: .milliseconds(200)) {
                            try await Task.sleep(for: .milliseconds(50))
                            return index
                        }
                    }
                }
                var seen: Set<Int> = []
                for try await index in group { seen.insert(index) }
                #expect(seen == [0, 1, 2])
            }
        }
    }
}

/// Burns the calling thread's CPU for `milliseconds`.
@inline(never)
func spinForDetection(milliseconds: Int) {
    let end = Date().addingTimeInterval(Double(milliseconds) / 1000)
    var hash: UInt64 = 0
    while Date() < end {
        for index in 0..<1000 { hash = (hash ^ UInt64(index)) &* 0x100_0000_01b3 }
    }
    if hash == 42 { print("") }
}
