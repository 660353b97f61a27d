import StallCollector
import StallConfiguration
import StallJournal
import StallMonitor

/// A stall seen from outside, as its journal entry: the same entry as a linked monitor's
/// (``StallRecord``), its source ``StallRecord/Source/external`` (`STALL_SOURCE=external`), with
/// `OBJECT_PID=` the service's PID, so that journald adds the service's trusted
/// `OBJECT_SYSTEMD_UNIT` (stallmond writes as root) and `journalctl -u the.service` shows it.
struct ExternalStall {
    /// What stallmond saw of the thread when the stall was detected: an `ended` entry says how the
    /// thread was stalled, not how it waits now.
    struct ThreadView: Sendable {
        var processName: String
        var threadName: String
        var state: String
        var syscall: String
        var waitChannel: String
        /// The thread's CPU time (`schedstat`) when it was seen.
        var cpuTime: UInt64?
        /// Its stack: unwound in place while it was blocked in a system call, or from a perf
        /// event's copy while it ran; empty when neither gave one.
        var stack: [StallFrame] = []
        /// `kernel` or `perf` (``StallRecord/stackSource``).
        var stackSource = ""
        /// The looks taken at the thread while it stalled, those that gave no stack, and those
        /// whose stack is ``stack`` (the heaviest); every distinct stack with its count.
        var samples = 0
        var unansweredSamples = 0
        var stackSamples = 0
        var sampledStacks: [SampledStack] = []
        /// Why ``stack`` is empty: a stack is taken when the stall is detected, and one that ended
        /// between two scans (a scan late by the whole threshold) was not.
        var noStackReason = "the stall ended before stallmond looked at the thread"

        init(pid: Int32, tid: Int32) {
            processName = ProcessDirectory.threadName(pid: pid, tid: pid) ?? "pid \(pid)"
            threadName = ProcessDirectory.threadName(pid: pid, tid: tid) ?? "thread \(tid)"
            state = ProcessDirectory.threadState(pid: pid, tid: tid) ?? "?"
            syscall = ProcessDirectory.threadSyscall(pid: pid, tid: tid).map(SyscallNames.name) ?? ""
            waitChannel = ProcessDirectory.threadWaitChannel(pid: pid, tid: tid) ?? ""
            cpuTime = ProcessDirectory.threadCPUTime(pid: pid, tid: tid)
        }
    }

    var event: ExternalStallTracker.Event
    var view: ThreadView
    var threshold: Duration

    /// The CPU time the stall took: the kernel's count at the end of the tick; at its detection,
    /// the thread's CPU time then less its CPU time when the tick began.
    var cpuTime: UInt64 {
        switch event.kind {
        case .ended: event.cpu
        case .detected: view.cpuTime.map { $0 >= event.cpu ? $0 - event.cpu : 0 } ?? 0
        }
    }

    var record: StallRecord {
        let duration = Duration.nanoseconds(Int64(clamping: event.duration))
        let cpuShare = event.duration > 0 ? min(1, Double(cpuTime) / Double(event.duration)) : 0
        let length = "\(duration.milliseconds) ms"
        let loop = "event loop \(view.threadName) of \(view.processName) (PID \(event.pid))"
        var message =
            event.kind == .detected
            ? "\(loop) stalled for \(length) (threshold \(threshold.milliseconds) ms), seen from outside"
            : "\(loop) stalled \(length), seen from outside"
        let culprit = StallReport.culpritIndex(in: view.stack).map { view.stack[$0] }
        if let culprit { message += " at \(culprit.summary)" }
        if event.threadExited { message += "; ended by the thread's exit" }
        if cpuShare >= 0.5 {
            message += "; \(Int((cpuShare * 100).rounded()))% on CPU"
        } else if !view.syscall.isEmpty {
            message += "; blocked in \(view.syscall)"
        }
        let stacked = !view.stack.isEmpty
        var record = StallRecord(
            event: event.kind == .detected ? .detected : .ended, message: message, stallID: event.stallID,
            durationMicroseconds: event.duration / 1000, thresholdMicroseconds: UInt64(threshold.microseconds),
            activity: "event-loop-cycle", runLoopMode: "", callout: "unknown", loop: view.threadName,
            threadID: Int(event.tid), threadState: view.state, threadSyscall: view.syscall,
            threadWaitChannel: view.waitChannel, cpuMicroseconds: cpuTime / 1000, samples: view.samples,
            samplesUnanswered: view.unansweredSamples, stackSamples: stacked ? view.stackSamples : 0,
            fingerprint: StallReport.fingerprint(of: view.stack),
            frame: culprit?.summary ?? "(no stack: \(view.noStackReason))",
            backtrace: !stacked
                ? "(no stack: \(view.noStackReason))"
                : view.stack.enumerated().map { "#\($0) \($1.backtraceLine)" }.joined(separator: "\n"),
            priority: duration >= threshold * 8 ? 3 : 4, syslogIdentifier: view.processName)
        record.stackSource = stacked ? view.stackSource : ""
        if !view.sampledStacks.isEmpty {
            // Frame numbers refer to the backtrace as written: cut to its 4 KiB.
            record.sampledStacks = SampledStacks(
                view.sampledStacks, backtrace: StallRecord.clampBacktrace(record.backtrace))
        }
        record.source = .external
        return record
    }

    /// The entry's fields: the record's (`STALL_SOURCE` among them), then `OBJECT_PID`.
    var fields: [JournalField] {
        record.fields + [JournalField("OBJECT_PID", String(event.pid))]
    }
}
