import Synchronization
import Testing

@testable import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// What the watchdogs take for a stop of the process, as against a wakeup late for another reason.
@Suite struct StopDetectorTests {
    /// A wall clock that the test steps.
    final class WallClock: Sendable {
        let offset = Atomic<Int64>(0)
        func step(by nanoseconds: Int64) { offset.add(nanoseconds, ordering: .relaxed) }
    }

    /// A timed wait on a DispatchSemaphore ends at a wall-clock deadline: stepped back by 150 ms
    /// during the wait, the wall clock makes it 150 ms late. That is no stop, and the wakeup is not
    /// late by it; the same lateness without the step is a stop.
    @Test func aStepBackOfTheWallClockDuringAWaitIsNoStop() {
        let clock = WallClock()
        let stops = StopDetector(
            threshold: 100_000_000, sampleTimeout: 5_000_000, wallClockOffset: { clock.offset.load(ordering: .relaxed) }
        )
        let deadline: UInt64 = 1_000_000_000
        let woke = deadline + 150_000_000

        stops.measuringWait { clock.step(by: -150_000_000) }
        #expect(!stops.wasStopped(wokeAt: woke, deadline: deadline))
        #expect(stops.lateness(wokeAt: woke, deadline: deadline) == 0)
        #expect(!stops.isLate(woke, after: deadline))

        stops.measuringWait {}
        #expect(stops.wasStopped(wokeAt: woke, deadline: deadline))
        #expect(stops.lateness(wokeAt: woke, deadline: deadline) == 150_000_000)

        // A step forward ends the wait early, which is never a stop; it explains no lateness.
        stops.measuringWait { clock.step(by: 500_000_000) }
        #expect(stops.wasStopped(wokeAt: woke, deadline: deadline))
    }

    /// The real clocks: CLOCK_REALTIME less CLOCK_MONOTONIC holds still while neither is set.
    @Test func theWallClockOffsetHoldsStillWhileNoClockIsSet() {
        let first = StopDetector.wallClockOffset()
        usleep(20_000)
        let second = StopDetector.wallClockOffset()
        #expect(abs(second - first) < 1_000_000, "\(second - first) ns")
    }
}
