import CStallCapture
import Foundation
import InMemoryLogging
import Logging
import MetricsTestKit
import StallJournal
import StallMonitorTestKit
import StallmonTestSupport
import Synchronization
import Testing

@testable import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// Every sink but the journal's has a queue and a thread of its own: one that blocks delays
    /// no other sink and no `stop()` past its timeout, and what it drops is counted and said once.
    @Suite
    struct SinkLaneTests {
        private static let description = MonitorDescription(
            loop: "lane-test", threadID: 1, configuration: StallMonitor.Configuration(), signal: nil)

        @Test func aSinkThatBlocksHoldsUpNeitherAnotherSinkNorStopAndItsDropsAreCountedAndSaidOnce() throws {
            var configuration = StallMonitor.Configuration()
            configuration.reportQueueCapacity = 4
            let blocking = BlockingSink()
            let fast = CollectingSink()
            let metrics = TestMetrics()
            var handler = InMemoryLogHandler()
            handler.logLevel = .trace
            let logger = Logger(label: "test") { [handler] _ in handler }
            let reporter = Reporter(
                configuration: configuration, loopName: "lane-test", threadID: 1, sinks: [blocking, fast],
                metrics: StallMetrics(loop: "lane-test", factory: metrics), logger: logger)

            reporter.emit(.started(Self.description))
            #expect(waitUntil(timeout: 5) { blocking.received.count == 1 }, "the blocking sink never got `started`")
            // Ten reports, 20 ms apart (a report takes milliseconds to build): the fast sink has
            // each at once, while the blocking one still holds `started`.
            var delays: [Double] = []
            for count in 2...11 {
                let sent = MonotonicClock.now()
                reporter.emit(.stallEnded(Reports.report()))
                #expect(waitUntil(timeout: 1) { fast.events.count == count }, "fast sink got \(fast.events.count)")
                delays.append(Double(MonotonicClock.now() - sent) / 1e6)
                usleep(20_000)
            }
            #expect(delays.allSatisfy { $0 < 200 }, "the fast sink waited \(delays) ms")
            // Four queue behind `started`; the six oldest were dropped, each counted once.
            #expect(reporter.droppedReports.load() == 6)
            let dimensions = [("loop", "lane-test"), ("sink", "BlockingSink")]
            #expect(try metrics.expectCounter("stallmon_dropped_reports_total", dimensions).totalValue == 6)
            let said = handler.entries.filter { $0.message.description.contains("does not keep up") }
            #expect(said.count == 1, "\(handler.entries)")
            #expect(said.first?.level == .warning)
            #expect(said.first?.metadata["stallmon.sink"]?.description == "BlockingSink")

            // stop() waits for the blocking sink until its timeout at most; the fast sink has `stopped`.
            let stopping = ContinuousClock.now
            reporter.finish(
                Self.description, .init(stalls: 10, suppressedReports: 0, droppedReports: 0), logger: logger)
            let stopTook = ContinuousClock.now - stopping
            #expect(stopTook >= StallMonitor.stopTimeout && stopTook < StallMonitor.stopTimeout + .seconds(1))
            let stopped = try #require(fast.events.last)
            #expect(stopped.kind == .stopped)
            #expect(stopped.statistics?.droppedReports == 6)
            let queued = handler.entries.filter {
                $0.message.description == "stallmon stopped with reports still queued"
            }
            #expect(queued.first?.metadata["stallmon.sinks"]?.description == "BlockingSink")

            // Released, it gets the newest four: `stopped` pushed out one more.
            blocking.release()
            #expect(reporter.drain(timeout: .seconds(5)).isEmpty)
            #expect(
                blocking.received.map(\.description) == [
                    "started", "stallEnded", "stallEnded", "stallEnded", "stopped",
                ])
            #expect(reporter.droppedReports.load() == 7)
            #expect(handler.entries.filter { $0.message.description.contains("does not keep up") }.count == 1)
        }

        /// The sink's thread blocks every asynchronous signal, and ends once its queue is empty: an
        /// idle sink has no thread to wake.
        @Test func aSinksThreadBlocksAsynchronousSignalsAndEndsOnceItsQueueIsEmpty() throws {
            let probe = ThreadProbeSink()
            let reporter = Reporter(
                configuration: StallMonitor.Configuration(), loopName: "lane-test", threadID: 1, sinks: [probe])
            reporter.emit(.started(Self.description))
            #expect(reporter.drain(timeout: .seconds(5)).isEmpty)
            let seen = try #require(probe.seen.withLock { $0 })
            #expect(seen.name == SinkLane.threadName)
            #expect(seen.threadID != stallmon_gettid())
            for signal in [
                SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGPROF, SIGCHLD, SIGPIPE, __libc_current_sigrtmin(),
                __libc_current_sigrtmax() - 4,
            ] {
                #expect(seen.blocked.contains(signal), "signal \(signal) not blocked")
            }
            for signal in [SIGSEGV, SIGBUS, SIGILL, SIGFPE] {
                #expect(!seen.blocked.contains(signal), "synchronous signal \(signal) blocked")
            }
            #expect(
                waitUntil(timeout: 2) { !Self.threadNames().contains(SinkLane.threadName) },
                "a sink thread outlived its queue")
        }

        private static func threadNames() -> [String] {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
            return tasks.compactMap { task in
                (try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8))?
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
        }
    }
}

/// Blocks in every event until released, and keeps the kinds it got.
private final class BlockingSink: ReportSink, Sendable {
    private let released = Atomic<Bool>(false)
    private let gate = DispatchSemaphore(value: 0)
    private let kinds = Mutex<[StallMonitorEvent.Kind]>([])

    func emit(_ event: StallMonitorEvent) {
        kinds.withLock { $0.append(event.kind) }
        if !released.load(ordering: .acquiring) {
            gate.wait()
            gate.signal()
        }
    }

    var received: [StallMonitorEvent.Kind] { kinds.withLock { $0 } }

    func release() {
        released.store(true, ordering: .releasing)
        gate.signal()
    }
}

/// Notes the thread that delivers to it: its name, kernel id and blocked signals.
private final class ThreadProbeSink: ReportSink, Sendable {
    struct Seen: Sendable {
        var name: String
        var threadID: Int32
        var blocked: Set<Int32>
    }

    let seen = Mutex<Seen?>(nil)

    func emit(_ event: StallMonitorEvent) {
        var mask = sigset_t()
        pthread_sigmask(SIG_SETMASK, nil, &mask)
        let blocked = Set((1...__libc_current_sigrtmax()).filter { sigismember(&mask, $0) == 1 })
        let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
        let thread = Seen(
            name: name.trimmingCharacters(in: .newlines), threadID: stallmon_gettid(), blocked: blocked)
        seen.withLock { $0 = thread }
    }
}
