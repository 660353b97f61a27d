import StallJournal
import Synchronization

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

/// Where the monitor reads what a registered span says of its request, and notes a stall inside
/// it: the span table of `StallmonTracer` (StallMonitorTracing), installed by the first tracer made.
/// Called on the reporting thread while the span may still run on its own: thread-safe.
package protocol StallRequestReader: Sendable {
    /// The request that registration `sequence` of `slot` says now; `nil` once the slot holds
    /// another (the span has ended).
    func request(slot: Int32, sequence: UInt64) -> StallReport.Request?
    /// Keeps `note` for the span of that registration while it runs (the latest note of a stall
    /// replaces an earlier one of the same stall).
    func noteStall(_ note: StallNote, slot: Int32, sequence: UInt64)
}

/// The installed ``StallRequestReader``.
package enum StallRequests {
    private static let installed = Mutex<(any StallRequestReader)?>(nil)

    /// Installs `reader`, once: later calls keep the first.
    package static func install(_ reader: @autoclosure () -> any StallRequestReader) {
        installed.withLock { current in
            if current == nil { current = reader() }
        }
    }

    static var reader: (any StallRequestReader)? { installed.withLock { $0 } }
}

#if STALLMON_LINUX
import CStallCapture

/// The span found for a stalled thread, and what it said last: a span often ends before its
/// stall's last report, which still names the request.
final class StallRequestHandle: Sendable {
    private let slot: Int32
    private let sequence: UInt64
    private let reader: any StallRequestReader
    private let last: Mutex<StallReport.Request>

    private init(slot: Int32, sequence: UInt64, reader: any StallRequestReader, request: StallReport.Request) {
        self.slot = slot
        self.sequence = sequence
        self.reader = reader
        self.last = Mutex(request)
    }

    /// The span serving thread `threadID`: its current task as a sample saw it (with the ID the
    /// sample read while the task ran, so that a span of an earlier task at the same address is
    /// not taken), the pool job it runs, or the thread itself (a span started outside any task);
    /// `nil` when none is registered.
    static func find(threadID: pid_t, currentTask: UInt, currentTaskID: UInt32 = 0) -> StallRequestHandle? {
        guard stallmon_request_used() != 0, let reader = StallRequests.reader else { return nil }
        var found = stallmon_request_found()
        let byTask =
            currentTask != 0 && currentTaskID != 0
            && stallmon_request_find_task(
                UInt64(currentTask), currentTaskID, &found) != 0
        let keys: [UInt64] = [
            // A task whose ID is known and has no span of its own is not looked up by address.
            currentTaskID != 0 ? 0 : UInt64(currentTask), UInt64(stallmon_pool_job_of_thread(threadID)),
            stallmon_request_thread_key(threadID),
        ]
        guard
            byTask
                || keys.withUnsafeBufferPointer({ stallmon_request_find($0.baseAddress, Int32($0.count), &found) })
                    != 0,
            let request = reader.request(slot: found.slot, sequence: found.sequence)
        else { return nil }
        return StallRequestHandle(slot: found.slot, sequence: found.sequence, reader: reader, request: request)
    }

    /// The request as the span says it now, or as it said it last once it has ended.
    var request: StallReport.Request {
        if let now = reader.request(slot: slot, sequence: sequence) {
            last.withLock { $0 = now }
            return now
        }
        return last.withLock { $0 }
    }

    /// Keeps `note` for the span, if it still runs.
    func noteStall(_ note: StallNote) {
        reader.noteStall(note, slot: slot, sequence: sequence)
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
