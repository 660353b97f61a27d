import CStallCapture
import CoreMetrics
import Dispatch
import Foundation
import Logging
import StallJournal
import StallMonitorTestKit
import StallmonTestSupport
import Synchronization
import Testing

@testable import StallMonitor

/// The engine's watch loop over a backend of the tests' own: a loop of one thread that runs a work
/// item on command. What a real backend adds (observers, ticks, the pool hook) is not here; what
/// the engine does for every kind is: parked while idle, a stall detected at the threshold, sampled,
/// reported once when detected and once when it ends, with its whole duration.
extension Serial {
    @Suite
    struct StallEngineTests {
        @Test func theEngineDrivesABackendThatStallsOnCommand() throws {
            let loop = CommandedLoop()
            defer { loop.finish() }
            let sink = CollectingSink()
            var configuration = StallMonitor.Configuration()
            configuration.threshold = .milliseconds(100)
            let (session, backend) = try WatchdogSession.make(
                loops: [.init(name: "commanded", threadID: Int(loop.threadID), callouts: { _ in .unknown })],
                configuration: configuration,
                signal: nil, sinks: [sink], metricsFactory: NOOPMetricsHandler.instance,
                logger: Logger(label: "stallmon.test")
            ) { engine, _, reporters throws(StallMonitorError) in
                (CommandedBackend(engine: engine, loop: loop, reporter: reporters[0]), [])
            }
            session.start()

            // Idle: the watchdog waits without a timeout, and so never wakes.
            let idleWakeups = backend.engine.wakeups
            Thread.sleep(forTimeInterval: 0.3)
            #expect(backend.engine.wakeups - idleWakeups <= 1)

            // Short work items: no stall.
            for _ in 0..<5 { loop.run(for: .milliseconds(20)) }
            // One over the threshold.
            loop.run(for: .milliseconds(300))
            Thread.sleep(forTimeInterval: 0.2)
            session.stop()

            let reports = sink.events.compactMap { event in event.report.map { (event.kind, $0) } }
            #expect(reports.map(\.0) == [.stallDetected, .stallEnded], "\(reports.map(\.0))")
            let ended = try #require(reports.last?.1)
            #expect(ended.loop == "commanded")
            #expect(ended.activity == .poolJob)
            let milliseconds = ended.duration / .milliseconds(1)
            #expect(abs(milliseconds - 300) <= 15, "a 300 ms stall reported as \(milliseconds) ms")
            #expect(ended.samples >= 5, "\(ended.samples) samples of a 300 ms stall at 20 ms")
            #expect(session.statistics.stalls == 1)
        }
    }
}

/// A thread that runs one work item at a time on command, spinning for its duration, and tells a
/// watchdog when each begins and ends.
private final class CommandedLoop: @unchecked Sendable, SampledThread {
    /// The current item's start (0: idle) and number; its end, once it ended.
    private let state = Mutex<(start: UInt64, sequence: UInt64, end: UInt64)>((0, 0, 0))
    private let commands = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private let started = DispatchSemaphore(value: 0)
    private let next = Mutex<Duration?>(nil)
    private let tid = Atomic<Int32>(0)
    /// Signalled at each begin and end, as a loop's observer wakes its watchdog.
    let wake = DispatchSemaphore(value: 0)

    init() {
        Thread.detachNewThread { [self] in
            tid.store(stallmon_gettid(), ordering: .releasing)
            started.signal()
            while true {
                commands.wait()
                guard let duration = next.withLock({ $0 }) else { return }
                let start = MonotonicClock.now()
                state.withLock { $0 = (start, $0.sequence + 1, 0) }
                wake.signal()
                let until = start + UInt64(duration / .nanoseconds(1))
                while MonotonicClock.now() < until {}
                state.withLock { $0 = (0, $0.sequence, MonotonicClock.now()) }
                wake.signal()
                done.signal()
            }
        }
        started.wait()
    }

    var threadID: pid_t { tid.load(ordering: .acquiring) }
    func idleTest() -> IdleTest { .never }
    var current: (start: UInt64, sequence: UInt64, end: UInt64) { state.withLock { $0 } }

    /// Runs one work item of `duration`, and returns once it has ended.
    func run(for duration: Duration) {
        next.withLock { $0 = duration }
        commands.signal()
        done.wait()
    }

    func finish() {
        next.withLock { $0 = nil }
        commands.signal()
    }
}

/// The backend of a ``CommandedLoop``: all it knows is the current item's start and number.
private final class CommandedBackend: WatchdogBackend {
    let engine: StallEngine
    let loop: CommandedLoop
    let reporter: Reporter
    let inspector: ThreadInspector
    var phase = WatchPhase.idle
    var threadName: String { "stallmon-test" }

    init(engine: StallEngine, loop: CommandedLoop, reporter: Reporter) {
        self.engine = engine
        self.loop = loop
        self.reporter = reporter
        self.inspector = ThreadInspector(threadID: loop.threadID)
    }

    func visit(now: UInt64) -> UInt64? {
        let item = loop.current
        if let stall = phase.stall {
            guard item.sequence == stall.sequence, item.start != 0 else {
                finish(stall, end: item.sequence == stall.sequence ? item.end : now)
                return visit(now: now)
            }
            engine.sampleIfDue(stall, of: loop, inspector: inspector, now: now)
            return engine.nextLook(at: stall)
        }
        guard item.start != 0 else {
            phase = .idle
            return nil
        }
        let start = engine.countedStart(item.start)
        phase = .timing(start: start, sequence: item.sequence)
        guard now >= start + engine.threshold else { return start + engine.threshold }
        let stall = engine.beginStall(start: start, sequence: item.sequence, now: now, activity: .poolJob)
        phase = .stalled(stall)
        engine.sample(stall, of: loop, inspector: inspector)
        engine.reportDetected(stall, to: reporter) { $0 }
        return engine.nextLook(at: stall)
    }

    func wait(until deadline: UInt64?) {
        guard let deadline else { return loop.wake.wait() }
        let now = MonotonicClock.now()
        if deadline > now { _ = loop.wake.wait(timeout: .now() + .nanoseconds(Int(deadline - now))) }
    }

    func finishStalls(end: UInt64) {
        if let stall = phase.stall { finish(stall, end: end) }
    }

    private func finish(_ stall: StallInProgress, end: UInt64) {
        phase = .idle
        engine.finishStall(stall, end: end, to: reporter) { $0 }
    }

    func wakeForStop() { loop.wake.signal() }
    func didStop() {}
}
