import StallJournal

extension StallReport {
    /// The request a stall served (see ``StallReport/request``): the journal's `STALL_REQUEST_*`,
    /// `STALL_TRACE_ID` and `STALL_SPAN_ID`.
    public typealias Request = StallRecord.Request
}

/// What the monitor tells a span about a stall inside it, so that the span can carry the stall
/// to the trace when it ends.
package struct StallNote: Sendable {
    package var stallID: String
    /// CLOCK_MONOTONIC nanoseconds when the stall began.
    package var startNanoseconds: UInt64
    /// The stall's duration: final once ``ended``, the time so far before.
    package var duration: Duration
    package var ended: Bool
    package var threadID: Int
    /// The culprit frame, e.g. `Service.refresh() (Service.swift:42)`; empty without a stack.
    package var frame: String
    /// The loop that stalled, as `STALL_LOOP` names it: `cooperative-pool`, `main`, an event loop's thread.
    package var loop: String

    package init(
        stallID: String, startNanoseconds: UInt64, duration: Duration, ended: Bool, threadID: Int, frame: String,
        loop: String
    ) {
        self.stallID = stallID
        self.startNanoseconds = startNanoseconds
        self.duration = duration
        self.ended = ended
        self.threadID = threadID
        self.frame = frame
        self.loop = loop
    }
}

/// A span as the monitor sees it: what it reports of the request, and where it keeps the notes of
/// stalls inside it. Implemented by the spans of `StallmonTracer` (StallMonitorTracing); read on
/// the reporting thread while the span may still run on its own, so both must be thread-safe.
package protocol StallRequestRecord: AnyObject, Sendable {
    /// The request's parts as they stand now.
    var stallRequest: StallReport.Request { get }
    /// Keeps `note` (the latest note of a stall replaces an earlier one of the same stall).
    func noteStall(_ note: StallNote)
}

#if STALLMON_LINUX
import CStallCapture

/// A record found for a stalled thread, retained until the stall's reports are out.
final class StallRequestHandle: Sendable {
    let record: any StallRequestRecord

    private init(record: any StallRequestRecord) {
        self.record = record
    }

    /// The record serving thread `threadID`: its current task as a sample saw it, the pool job it
    /// runs, or the thread itself (a span started outside any task); `nil` when none is registered.
    static func find(threadID: pid_t, currentTask: UInt) -> StallRequestHandle? {
        guard stallmon_request_used() != 0 else { return nil }
        let keys: [UInt64] = [
            UInt64(currentTask), UInt64(stallmon_pool_job_of_thread(threadID)), stallmon_request_thread_key(threadID),
        ]
        guard let pointer = keys.withUnsafeBufferPointer({ stallmon_request_acquire($0.baseAddress, Int32($0.count)) })
        else { return nil }
        let object = Unmanaged<AnyObject>.fromOpaque(pointer).takeRetainedValue()
        guard let record = object as? any StallRequestRecord else { return nil }
        return StallRequestHandle(record: record)
    }
}
#endif

extension StallRecord.Request {
    /// What the report's message says of the request: `, serving GET /users/:id, trace 4bf9…`.
    var phrase: String {
        var text = ""
        if !endpoint.isEmpty { text += ", serving \(endpoint)" }
        if !traceID.isEmpty { text += ", trace \(traceID)" }
        return text
    }
}
