#if STALLMON_LINUX
import CStallCapture
import Dispatch
import Foundation
import Logging
import StallJournal
import Synchronization

/// Turns captured stalls into reports off the monitored thread: symbolicates them, applies the
/// rate limit and hands them to the sinks, in order, on the process's reporting thread. Submitting
/// never blocks: past the queue's capacity, reports are dropped and counted.
///
/// Journal sinks write on the reporting thread itself (one send waits at most their send timeout);
/// every other sink has a lane of its own (``SinkLane``): the reporting thread only queues events
/// there, so a sink that blocks delays neither the journal nor another sink, nor the final report
/// before a watchdog kill, which returns once the journal has it.
final class Reporter: @unchecked Sendable {
    private let queue = ReportingThread.shared
    /// The sinks written on the reporting thread: ``JournalSink``s.
    private let journalSinks: [any ReportSink]
    /// Every other sink, each with its own queue and thread.
    private let lanes: [SinkLane]
    private let configuration: StallMonitor.Configuration
    private let loopName: String
    /// How the loop's backend names the callout a stalled stack was in.
    private let callouts: CalloutNaming
    private let threadID: Int
    private let pending = AtomicCounter()
    let droppedReports = AtomicCounter()
    /// Deliveries a sink failed (it threw).
    let lostReports = AtomicCounter()
    let suppressedReports = AtomicCounter()
    /// The same counts, and every stall, in the application's metrics backend.
    private let metrics: StallMetrics?

    // Confined to the reporting thread.
    private var limiter: RateLimiter
    private var decisions: [String: Decision] = [:]
    private var flushScheduled = false
    /// The health summary behind `STATUS=`; read from any thread without waiting for the queue.
    let status: StatusBoard

    private enum Decision {
        case admitted
        case suppressed(fingerprint: String)
    }

    /// - Parameter seenTurning: Whether the loop is known to run already (an event loop of a
    ///   running group); otherwise the status says it was not seen running until the watchdog
    ///   sees its first transition.
    init(
        configuration: StallMonitor.Configuration, loopName: String, threadID: Int, sinks: [any ReportSink],
        seenTurning: Bool = false, callouts: @escaping CalloutNaming = { _ in .unknown }, metrics: StallMetrics? = nil,
        logger: Logger? = nil
    ) {
        self.configuration = configuration
        self.callouts = callouts
        self.metrics = metrics
        self.loopName = loopName
        self.threadID = threadID
        self.journalSinks = sinks.filter { $0 is JournalSink }
        let counters = SinkLane.Counters(
            dropped: droppedReports, lost: lostReports, metrics: metrics, logger: logger)
        self.lanes = sinks.filter { !($0 is JournalSink) }.map {
            SinkLane(sink: $0, capacity: configuration.reportQueueCapacity, loop: loopName, counters: counters)
        }
        self.status = StatusBoard(loopName: loopName, seenTurning: seenTurning)
        self.limiter = RateLimiter(
            burst: configuration.rateLimit.burst, interval: UInt64(configuration.rateLimit.interval.nanoseconds)
        )
    }

    /// Looks `function` up on the reporting thread, where symbols are loaded, and hands its address
    /// range to `found` (`nil` when it is not among the symbols), in the background.
    func lookUp(
        function: String, besides neighbour: String, found: @escaping @Sendable (Range<UInt>?) -> Void
    ) {
        queue.async {
            found(SharedSymbolicator.shared.withSymbolicator { $0.functionRange(named: function, besides: neighbour) })
        }
    }

    func submit(_ stall: CapturedStall) {
        // An ended report is never dropped: its detected report may be out, and the status and
        // the rate limiter pair the two.
        guard pending.add(1) <= configuration.reportQueueCapacity || stall.event == .ended else {
            pending.add(-1)
            droppedReports.add(1)
            metrics?.recordDropped()
            return
        }
        queue.async {
            defer { self.pending.add(-1) }
            self.process(stall)
        }
    }

    /// Reports a stall that outlasted the service watchdog and returns once the journal has it and
    /// the other sinks' lanes have it queued (systemd kills the service moments later), or at
    /// `deadline` while the reporting thread is still busy with earlier work; the report goes out
    /// when its turn comes. No sink but the journal's can hold it up.
    func submitNow(_ stall: CapturedStall, waitingUntil deadline: UInt64) {
        queue.sync(waitingUntil: deadline) {
            let report = SharedSymbolicator.shared.withSymbolicator { self.makeReport(stall, symbolicator: $0) }
            self.send(.watchdogStall(report))
        }
    }

    func emit(_ event: StallMonitorEvent) {
        queue.async { self.send(event) }
    }

    /// Emits the `stopped` event and waits for every report, at most ``StallMonitor/stopTimeout``;
    /// `logger` hears when some are still queued then, and for which sinks. The journal has the
    /// event as soon as the reporting thread comes to it, whatever the other sinks do. The event
    /// counts this reporter's suppressed, dropped and lost reports as they stand once the reports
    /// queued before it are out to the journal: one still queued for another sink then may yet be
    /// lost or dropped.
    func finish(_ description: MonitorDescription, _ statistics: StallMonitor.Statistics, logger: Logger) {
        queue.async {
            var statistics = statistics
            statistics.suppressedReports = self.suppressedReports.load()
            statistics.droppedReports = self.droppedReports.load()
            statistics.lostReports = self.lostReports.load()
            self.send(.stopped(description, statistics))
        }
        let behind = drain(timeout: StallMonitor.stopTimeout)
        if !behind.isEmpty {
            logger.warning(
                "stallmon stopped with reports still queued",
                metadata: [
                    "stallmon.timeout": "\(StallMonitor.stopTimeout)",
                    "stallmon.sinks": "\(behind.joined(separator: ", "))",
                ])
        }
    }

    /// Emits pending suppression summaries, then waits until everything submitted so far is out
    /// (in the journal, and delivered by every other sink) or `timeout` passes; returns what is
    /// still behind: `reporting thread`, or the names of the sinks still delivering.
    @discardableResult
    func drain(timeout: Duration) -> [String] {
        let deadline = MonotonicClock.now() + UInt64(clamping: timeout.nanoseconds)
        guard queue.sync(waitingUntil: deadline, { self.flushSuppressions(all: true) }) else {
            return [ReportingThread.threadName]
        }
        // Each waits until the deadline at most: once one has, the others only say where they are.
        return lanes.filter { !$0.waitUntilDelivered(by: deadline) }.map(\.name)
    }

    /// Writes `event` to the journal, then queues it for every other sink.
    private func send(_ event: StallMonitorEvent) {
        for sink in journalSinks {
            do {
                try sink.emit(event)
            } catch {
                lostReports.add(1)
                metrics?.recordLost()
            }
        }
        for lane in lanes { lane.append(event) }
    }

    private func process(_ stall: CapturedStall) {
        status.record(stall)
        if configuration.notifyStatus {
            status.noteSent()
            ServiceNotifier.notify("STATUS=\(status.line())")
        }
        let report = SharedSymbolicator.shared.withSymbolicator { makeReport(stall, symbolicator: $0) }
        // Every stall ends once (an ended report is never dropped), whether it is reported or suppressed.
        if stall.event == .ended { metrics?.recordStall(callout: report.callout, duration: report.duration) }
        switch stall.event {
        case .detected:
            if limiter.admit(report.fingerprint, frame: report.culprit?.summary ?? "?", now: MonotonicClock.now()) {
                decisions[stall.stallID] = .admitted
                send(.stallDetected(report))
            } else {
                decisions[stall.stallID] = .suppressed(fingerprint: report.fingerprint)
                suppressedReports.add(1)
                metrics?.recordSuppressed()
                scheduleFlush()
            }
        case .watchdog:
            send(.watchdogStall(report))
        case .ended:
            switch decisions.removeValue(forKey: stall.stallID) {
            case .suppressed(let fingerprint):
                limiter.recordSuppressed(fingerprint, duration: stall.duration)
                scheduleFlush()
            case .admitted:
                send(.stallEnded(report))
            case nil:
                // Its detected report was dropped or it was never detected by this reporter.
                if limiter.admit(report.fingerprint, frame: report.culprit?.summary ?? "?", now: MonotonicClock.now()) {
                    send(.stallEnded(report))
                } else {
                    suppressedReports.add(1)
                    metrics?.recordSuppressed()
                    limiter.recordSuppressed(report.fingerprint, duration: stall.duration)
                    scheduleFlush()
                }
            }
        }
    }

    private func scheduleFlush() {
        guard !flushScheduled, let next = limiter.nextExpiry else { return }
        flushScheduled = true
        let delay = next > MonotonicClock.now() ? next - MonotonicClock.now() : 0
        queue.after(nanoseconds: delay + 1_000_000) {
            self.flushScheduled = false
            self.flushSuppressions(all: false)
            self.scheduleFlush()
        }
    }

    private func flushSuppressions(all: Bool) {
        for summary in limiter.takeSummaries(now: MonotonicClock.now(), all: all) {
            send(
                .suppressed(
                    SuppressionReport(
                        loop: loopName, threadID: threadID, fingerprint: summary.fingerprint, frame: summary.frame,
                        count: summary.suppressed, totalDuration: .nanoseconds(summary.totalDuration),
                        worstDuration: .nanoseconds(summary.worstDuration), burst: configuration.rateLimit.burst,
                        interval: configuration.rateLimit.interval
                    )
                )
            )
        }
    }

    private func makeReport(_ stall: CapturedStall, symbolicator: Symbolicator) -> StallReport {
        let (frames, stackSamples, index) = SampledStack.heaviest(stall.stacks, symbolicator: symbolicator)
        var report = StallReport(
            event: stall.event,
            stallID: stall.stallID,
            loop: loopName,
            threadID: stall.threadID ?? threadID,
            duration: .nanoseconds(stall.duration),
            threshold: configuration.threshold,
            activity: stall.activity,
            runLoopMode: stall.runLoopMode,
            callout: callouts(frames),
            threadState: String(stall.threadState),
            syscall: stall.kernelView.syscall,
            waitChannel: stall.kernelView.waitChannel,
            cpuTime: .nanoseconds(stall.cpu),
            samples: stall.samples,
            unansweredSamples: stall.unansweredSamples,
            stackSamples: stackSamples,
            stack: frames,
            fingerprint: StallReport.fingerprint(of: frames),
            noStackReason: stall.noStackReason,
            startNanoseconds: stall.startNanoseconds,
            pausedTime: .nanoseconds(stall.paused),
            watchdogInterval: stall.watchdogInterval.map { .nanoseconds($0) },
            stackSource: index.flatMap { stall.stackSources.indices.contains($0) ? stall.stackSources[$0] : nil }
        )
        report.sampledStacks = SampledStack.symbolicate(stall.stacks, symbolicator: symbolicator)
        if let handle = stall.request {
            let request = handle.request
            report.request = request.isEmpty ? nil : request
            handle.noteStall(
                StallNote(
                    stallID: stall.stallID, startNanoseconds: stall.startNanoseconds,
                    duration: .nanoseconds(stall.duration), ended: stall.event != .detected,
                    threadID: report.threadID, frame: report.culprit?.summary ?? "", loop: report.loop))
        }
        return report
    }
}
#endif  // STALLMON_LINUX
