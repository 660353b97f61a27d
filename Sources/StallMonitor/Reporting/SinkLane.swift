#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Logging
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One sink beside the journal, of one reporter: a bounded queue of its own, delivered in order
/// by a thread of its own while the queue holds events. The reporting thread only appends, so a
/// sink that blocks holds up its own queue, never the journal, another sink, or the final report
/// before a watchdog kill.
///
/// Past its capacity the queue drops its oldest event: the newest (a final report before a
/// watchdog kill, the `stopped` summary) are the ones worth having once the sink catches up. A drop
/// counts in the reporter's dropped reports and in `stallmon_dropped_reports_total{sink}`, and the
/// first one is said once in the log.
///
/// The thread starts when an event comes to an empty lane and ends once the lane is empty again:
/// an idle lane has no thread, so it makes no wakeups. The thread blocks every asynchronous signal
/// from its first instruction on (`stallmon_thread_spawn`): no handler of
/// the program runs inside a user's sink, and no process-directed signal waits for it.
final class SinkLane: Sendable {
    /// The threads' name, in the kernel (at most 15 bytes).
    static let threadName = "stallmon-sink"

    /// The sink's type name: the `sink` dimension of its metrics, and what the log calls it.
    let name: String
    private let sink: any ReportSink
    private let capacity: Int
    private let loop: String
    private let counters: Counters
    private let state: Mutex<State>

    /// Where a lane counts what it could not deliver: the reporter's counts and metrics.
    struct Counters: Sendable {
        var dropped: AtomicCounter
        var lost: AtomicCounter
        var metrics: StallMetrics?
        var logger: Logger?
    }

    private struct State {
        /// A ring of `capacity` slots: `count` events from `head` on, the oldest first.
        var ring: [StallMonitorEvent?]
        var head = 0
        var count = 0
        /// Whether a thread delivers the lane's events (it ends once the ring is empty).
        var delivering = false
        /// Events appended, and events done with (delivered, failed or dropped): the lane is
        /// idle when they are equal.
        var appended = 0
        var done = 0
        var waiters: [(upTo: Int, semaphore: DispatchSemaphore)] = []
        var dropped = 0

        mutating func push(_ event: StallMonitorEvent) -> Bool {
            let capacity = ring.count
            var droppedOne = false
            if count == capacity {
                ring[head] = nil
                head = (head + 1) % capacity
                count -= 1
                done += 1
                dropped += 1
                droppedOne = true
            }
            ring[(head + count) % capacity] = event
            count += 1
            appended += 1
            return droppedOne
        }

        mutating func pop() -> StallMonitorEvent? {
            guard count > 0 else { return nil }
            let event = ring[head]
            ring[head] = nil
            head = (head + 1) % ring.count
            count -= 1
            return event
        }

        /// The semaphores of the waiters whose events are all done.
        mutating func takeSatisfiedWaiters() -> [DispatchSemaphore] {
            let satisfied = waiters.filter { $0.upTo <= done }.map(\.semaphore)
            waiters.removeAll { $0.upTo <= done }
            return satisfied
        }
    }

    init(sink: any ReportSink, capacity: Int, loop: String, counters: Counters) {
        self.sink = sink
        self.name = Self.name(of: sink)
        self.capacity = max(1, capacity)
        self.loop = loop
        self.counters = counters
        self.state = Mutex(State(ring: Array(repeating: nil, count: max(1, capacity))))
    }

    /// `LoggerSink`, `PagerSink`: the sink's type, without its module.
    static func name(of sink: any ReportSink) -> String {
        String(describing: type(of: sink))
    }

    /// Queues `event` for the sink and returns at once, dropping the oldest queued event when the
    /// lane is full; starts the lane's thread when none delivers.
    func append(_ event: StallMonitorEvent) {
        let (droppedOne, firstDrop, start, satisfied) = state.withLock { state in
            let droppedOne = state.push(event)
            let start = !state.delivering
            state.delivering = true
            return (droppedOne, droppedOne && state.dropped == 1, start, state.takeSatisfiedWaiters())
        }
        for semaphore in satisfied { semaphore.signal() }
        if droppedOne { countDrop(first: firstDrop) }
        if start, !startThread() {
            // No thread (the process is out of them): what is queued cannot go out now; it is
            // dropped, and the next event tries again.
            let (drops, satisfied) = state.withLock { state in
                var drops = 0
                while state.pop() != nil {
                    drops += 1
                    state.done += 1
                    state.dropped += 1
                }
                state.delivering = false
                return (drops, state.takeSatisfiedWaiters())
            }
            for semaphore in satisfied { semaphore.signal() }
            for _ in 0..<drops { countDrop(first: false) }
        }
    }

    /// Waits until every event appended so far is delivered (or dropped), or the monotonic clock
    /// reaches `deadline`; returns whether they are.
    func waitUntilDelivered(by deadline: UInt64) -> Bool {
        let semaphore = DispatchSemaphore(value: 0)
        let idle = state.withLock { state in
            guard state.done < state.appended else { return true }
            state.waiters.append((state.appended, semaphore))
            return false
        }
        if idle { return true }
        let now = MonotonicClock.now()
        let left = deadline > now ? deadline - now : 0
        if semaphore.wait(timeout: .now() + .nanoseconds(Int(clamping: left))) == .success { return true }
        // Still waiting: withdraw, unless the lane signalled meanwhile.
        let withdrawn = state.withLock { state in
            let before = state.waiters.count
            state.waiters.removeAll { $0.semaphore === semaphore }
            return state.waiters.count < before
        }
        if !withdrawn { semaphore.wait() }
        return !withdrawn
    }

    /// Events this lane dropped.
    var droppedEvents: Int { state.withLock { $0.dropped } }

    private func countDrop(first: Bool) {
        counters.dropped.add(1)
        counters.metrics?.recordDropped(sink: name)
        guard first else { return }
        counters.logger?.warning(
            "stallmon drops reports for a sink that does not keep up: its queue is full; later drops are only counted",
            metadata: [
                "stallmon.sink": "\(name)", "stallmon.loop": "\(loop)", "stallmon.queue_capacity": "\(capacity)",
            ])
    }

    /// The thread's loop: delivers the oldest event until the lane is empty, then ends.
    fileprivate func deliver() {
        while true {
            let event = state.withLock { state -> StallMonitorEvent? in
                guard let event = state.pop() else {
                    state.delivering = false
                    return nil
                }
                return event
            }
            guard let event else { return }
            do {
                try sink.emit(event)
            } catch {
                counters.lost.add(1)
                counters.metrics?.recordLost()
            }
            let satisfied = state.withLock { state in
                state.done += 1
                return state.takeSatisfiedWaiters()
            }
            for semaphore in satisfied { semaphore.signal() }
        }
    }

    /// Starts a detached thread that runs ``deliver()`` with every asynchronous signal blocked
    /// (``spawnMonitorThread(named:stackSize:_:)``); returns false when none could be made.
    private func startThread() -> Bool {
        spawnMonitorThread(named: SinkLane.threadName, stackSize: 1024 * 1024) { [self] in deliver() }
    }
}
#endif  // STALLMON_LINUX
