/// A stall report as it is stored in the journal: the one definition of the field schema, used by
/// the writer (the monitor's journald sink) and by every reader (CLI, collector).
public struct StallRecord: Sendable, Hashable {
    /// Which report of a stall the entry is (`STALL_EVENT`).
    ///
    /// Later versions may add cases: a `switch` over it keeps a `default`.
    public enum Event: String, Sendable, Hashable {
        /// Written when the stall reaches the threshold, with the first stack.
        case detected
        /// Written when the loop moves on, with the true duration and the heaviest stack.
        case ended
        /// Written when a stall outlasts the service's `WatchdogSec=`, just before systemd kills it.
        case watchdog
    }

    /// Who saw the stall (`STALL_SOURCE`).
    ///
    /// Later versions may add cases: a `switch` over it keeps a `default`.
    public enum Source: String, Sendable, Hashable {
        /// The monitor inside the stalled process, which linked stallmon. Its entries have no
        /// `STALL_SOURCE`: this value is never written, and read where the field is absent.
        case monitor
        /// stallmond, watching the process's event loops from outside through eBPF
        /// (`STALL_SOURCE=external`). Its entry names the process in `OBJECT_PID`, and journald
        /// adds that process's `OBJECT_` fields to it when stallmond writes as root.
        case external
    }

    public var event: Event
    /// The one-line summary a human reads first.
    public var message: String
    /// Same on the detected and the ended entry of one stall.
    public var stallID: String
    public var durationMicroseconds: UInt64
    public var thresholdMicroseconds: UInt64
    /// `before-sources` or `after-waiting`.
    public var activity: String
    public var runLoopMode: String
    /// `timer`, `source0`, `source1`, `main-queue`, `main-actor`, `observer`, `perform-block` or `unknown`.
    public var callout: String
    /// Name of the monitored loop: `main`, or the thread's name.
    public var loop: String
    public var threadID: Int
    /// The kernel's dominant state of the thread across samples (`R`, `S`, `D`, …).
    public var threadState: String
    /// The system call the thread sat in at the latest sample, empty when running in user space.
    public var threadSyscall: String
    /// The kernel function the thread waited in, empty when unknown.
    public var threadWaitChannel: String
    public var cpuMicroseconds: UInt64
    /// Samples taken, and how many of them the thread did not answer.
    public var samples: Int
    public var samplesUnanswered: Int
    /// How many samples the reported stack was seen in.
    public var stackSamples: Int
    /// Stable hash of the top symbolicated frames.
    public var fingerprint: String
    /// The frame a reader looks at first, e.g. `Service.refresh() (Service.swift:42)`.
    public var frame: String
    /// One frame a line (`#0 …`), at most 4 KiB: writers cut it at a line boundary.
    public var backtrace: String
    public var priority: Int
    public var syslogIdentifier: String
    /// The service's watchdog interval (`WatchdogSec=`) for ``Event/watchdog`` entries, 0 otherwise.
    public var watchdogMicroseconds: UInt64 = 0
    /// Every distinct stack sampled, with its sample count (`STALL_STACKS`); empty when the writer
    /// wrote none. Its frame numbers refer to the lines of ``backtrace`` as written (clamped).
    public var sampledStacks = SampledStacks()

    /// How the backtrace was taken: `perf` (a perf event on the running thread: the kernel copied its
    /// registers and stack top, no signal was sent), `signal` (the sampling signal's handler copied the running
    /// thread's registers and stack top, and the watchdog unwound the copy), `kernel` (blocked in a system call, unwound in place from the registers the kernel
    /// shows), `previous` (samples that got no stack of their own, counted unanswered: the latest
    /// stack taken earlier in the stall); empty when there is no stack.
    public var stackSource: String = ""

    /// Who saw the stall: ``Source/monitor`` for a linked monitor's entry (no `STALL_SOURCE`),
    /// ``Source/external`` for one stallmond wrote from outside.
    public var source: Source = .monitor

    /// The request the stalled work served, where a span of swift-distributed-tracing was known
    /// for it (`STALL_REQUEST_*`, `STALL_TRACE_ID`, `STALL_SPAN_ID`); `nil` for a stall outside any request.
    public var request: Request?

    /// What a writer puts in `STALL_BACKTRACE` at most (see ``FieldLimits/backtraceWriteBytes``).
    package static let maximumBacktraceBytes = FieldLimits.backtraceWriteBytes

    package init(
        event: Event, message: String, stallID: String, durationMicroseconds: UInt64,
        thresholdMicroseconds: UInt64, activity: String, runLoopMode: String, callout: String,
        loop: String, threadID: Int, threadState: String, threadSyscall: String, threadWaitChannel: String,
        cpuMicroseconds: UInt64, samples: Int, samplesUnanswered: Int, stackSamples: Int,
        fingerprint: String, frame: String, backtrace: String, priority: Int, syslogIdentifier: String
    ) {
        self.event = event
        self.message = message
        self.stallID = stallID
        self.durationMicroseconds = durationMicroseconds
        self.thresholdMicroseconds = thresholdMicroseconds
        self.activity = activity
        self.runLoopMode = runLoopMode
        self.callout = callout
        self.loop = loop
        self.threadID = threadID
        self.threadState = threadState
        self.threadSyscall = threadSyscall
        self.threadWaitChannel = threadWaitChannel
        self.cpuMicroseconds = cpuMicroseconds
        self.samples = samples
        self.samplesUnanswered = samplesUnanswered
        self.stackSamples = stackSamples
        self.fingerprint = fingerprint
        self.frame = frame
        self.backtrace = backtrace
        self.priority = priority
        self.syslogIdentifier = syslogIdentifier
    }

    /// The entry's `MESSAGE_ID`, one of ``MessageID/stallReports``.
    package var messageID: String {
        switch event {
        case .detected: MessageID.stallDetected
        case .ended: MessageID.stallEnded
        case .watchdog: MessageID.watchdogStall
        }
    }

    /// The entry's fields, in the order they are written: every value clamped to its bound in
    /// ``FieldLimits``, so that every reader accepts what the monitor writes.
    package var fields: [JournalField] {
        [
            JournalField("MESSAGE_ID", messageID),
            JournalField("MESSAGE", FieldLimits.clamp(message, toBytes: FieldLimits.messageBytes)),
            JournalField("PRIORITY", String(min(max(priority, 0), 7))),
            JournalField("SYSLOG_IDENTIFIER", FieldLimits.identifier(syslogIdentifier)),
            JournalField(Field.id, stallID),
            JournalField(Field.event, event.rawValue),
            JournalField(Field.durationMicroseconds, String(FieldLimits.microseconds(durationMicroseconds))),
            JournalField(Field.thresholdMicroseconds, String(FieldLimits.microseconds(thresholdMicroseconds))),
            JournalField(Field.activity, FieldLimits.clamp(activity, toBytes: FieldLimits.keywordBytes)),
            JournalField(Field.runLoopMode, FieldLimits.clamp(runLoopMode, toBytes: FieldLimits.nameBytes)),
            JournalField(Field.callout, FieldLimits.clamp(callout, toBytes: FieldLimits.keywordBytes)),
            JournalField(Field.loop, FieldLimits.clamp(loop, toBytes: FieldLimits.nameBytes)),
            JournalField(Field.threadID, String(threadID)),
            JournalField(Field.threadState, FieldLimits.clamp(threadState, toBytes: FieldLimits.keywordBytes)),
            JournalField(Field.threadSyscall, FieldLimits.clamp(threadSyscall, toBytes: FieldLimits.keywordBytes)),
            JournalField(
                Field.threadWaitChannel, FieldLimits.clamp(threadWaitChannel, toBytes: FieldLimits.waitChannelBytes)),
            JournalField(Field.cpuMicroseconds, String(FieldLimits.microseconds(cpuMicroseconds))),
            JournalField(Field.samples, String(FieldLimits.count(samples))),
            JournalField(Field.samplesUnanswered, String(FieldLimits.count(samplesUnanswered))),
            JournalField(Field.stackSamples, String(FieldLimits.count(stackSamples))),
            JournalField(Field.fingerprint, fingerprint),
            JournalField(Field.frame, FieldLimits.clamp(frame, toBytes: FieldLimits.frameBytes)),
            JournalField(Field.backtrace, Self.clampBacktrace(backtrace)),
        ]
            + (event == .watchdog
                ? [JournalField(Field.watchdogMicroseconds, String(FieldLimits.microseconds(watchdogMicroseconds)))]
                : [])
            + (sampledStacks.isEmpty ? [] : [JournalField(Field.stacks, sampledStacksValue)])
            + (stackSource.isEmpty ? [] : [JournalField(Field.stackSource, stackSource)])
            + (source == .monitor ? [] : [JournalField(Field.source, source.rawValue)])
            + (request?.fields ?? [])
    }

    /// Field names of stall entries.
    public enum Field {
        public static let id = "STALL_ID"
        public static let event = "STALL_EVENT"
        public static let durationMicroseconds = "STALL_DURATION_USEC"
        public static let thresholdMicroseconds = "STALL_THRESHOLD_USEC"
        public static let activity = "STALL_ACTIVITY"
        public static let runLoopMode = "STALL_RUNLOOP_MODE"
        public static let callout = "STALL_CALLOUT"
        public static let loop = "STALL_LOOP"
        public static let threadID = "STALL_THREAD_TID"
        public static let threadState = "STALL_THREAD_STATE"
        public static let threadSyscall = "STALL_THREAD_SYSCALL"
        public static let threadWaitChannel = "STALL_THREAD_WCHAN"
        public static let cpuMicroseconds = "STALL_CPU_USEC"
        public static let samples = "STALL_SAMPLES"
        public static let samplesUnanswered = "STALL_SAMPLES_UNANSWERED"
        public static let stackSamples = "STALL_STACK_SAMPLES"
        public static let fingerprint = "STALL_FINGERPRINT"
        public static let frame = "STALL_FRAME"
        public static let backtrace = "STALL_BACKTRACE"
        public static let stackSource = "STALL_STACK_SOURCE"
        /// Who saw the stall (``StallRecord/source``): `external` for stallmond watching from
        /// outside; absent on a linked monitor's entries.
        public static let source = "STALL_SOURCE"
        public static let watchdogMicroseconds = "STALL_WATCHDOG_USEC"
        public static let stacks = "STALL_STACKS"
        public static let requestOperation = "STALL_REQUEST_OPERATION"
        public static let requestMethod = "STALL_REQUEST_METHOD"
        public static let requestRoute = "STALL_REQUEST_ROUTE"
        public static let requestPath = "STALL_REQUEST_PATH"
        public static let requestRPCMethod = "STALL_REQUEST_RPC_METHOD"
        public static let traceID = "STALL_TRACE_ID"
        public static let spanID = "STALL_SPAN_ID"
    }

    /// `STALL_STACKS` as written: the encoding is bounded when it is built from stacks, and a value
    /// set by hand that is longer is left out whole rather than cut into a different meaning.
    var sampledStacksValue: String {
        let value = sampledStacks.encoded
        return value.utf8.count <= FieldLimits.stacksWriteBytes
            ? value : "* \(FieldLimits.count(sampledStacks.totalSamples))"
    }

    /// The stacks with their frames as text, innermost first, heaviest stack first: backtrace lines
    /// without their `#N `, and the frames ``sampledStacks`` defines; samples whose stacks were left
    /// out are one stack, `(stacks not recorded)`. An entry without `STALL_STACKS` gives its
    /// backtrace as the one stack.
    public var resolvedStacks: [(frames: [String], count: Int)] {
        guard sampledStacks.isEmpty else { return sampledStacks.resolved(backtrace: Self.clampBacktrace(backtrace)) }
        return [(SampledStacks.backtraceFrames(Self.clampBacktrace(backtrace)), max(1, stackSamples))]
    }

    /// Cuts a backtrace at a line boundary so that it fits ``maximumBacktraceBytes``.
    package static func clampBacktrace(_ backtrace: String) -> String {
        guard backtrace.utf8.count > maximumBacktraceBytes else { return backtrace }
        let marker = "…"
        let budget = maximumBacktraceBytes - marker.utf8.count
        var result = ""
        var used = 0
        for line in backtrace.split(separator: "\n", omittingEmptySubsequences: false) {
            let cost = line.utf8.count + 1
            if used + cost > budget { break }
            result += line
            result += "\n"
            used += cost
        }
        if result.isEmpty {  // a single line longer than the budget
            var bytes = Array(backtrace.utf8.prefix(budget))
            while !bytes.isEmpty, String(validating: bytes, as: UTF8.self) == nil { bytes.removeLast() }
            result = String(decoding: bytes, as: UTF8.self)
        }
        return result + marker
    }
}

extension StallRecord {
    /// Decodes an entry read from the journal (``JournalEntry/fields``, or a line of `journalctl -o json`),
    /// holding every field to the bound that writers clamp it to: any local user can write entries
    /// with stallmon's MESSAGE_IDs.
    /// - Throws: ``JournalDecodingError`` naming the field that is missing, malformed or out of bounds.
    public init(journalFields fields: [String: String]) throws(JournalDecodingError) {
        let reader = FieldReader(fields: fields)
        let messageID = try reader.string("MESSAGE_ID", maximumBytes: 32)
        switch messageID {
        case MessageID.stallDetected: event = .detected
        case MessageID.stallEnded: event = .ended
        case MessageID.watchdogStall: event = .watchdog
        default: throw JournalDecodingError(field: "MESSAGE_ID", value: messageID, reason: "not a stall report")
        }
        if let written = try reader.optionalString(Field.event, maximumBytes: FieldLimits.keywordBytes),
            written != event.rawValue
        {
            throw JournalDecodingError(
                field: Field.event, value: written, reason: "does not match MESSAGE_ID (\(event.rawValue))")
        }
        message = try reader.string("MESSAGE", maximumBytes: FieldLimits.messageBytes)
        priority = try reader.priority()
        syslogIdentifier = reader.identifier("SYSLOG_IDENTIFIER") ?? ""
        stallID = try reader.hex(Field.id, digits: FieldLimits.stallIDDigits)
        durationMicroseconds = try reader.microseconds(Field.durationMicroseconds)
        thresholdMicroseconds = try reader.microseconds(Field.thresholdMicroseconds)
        activity = try reader.string(Field.activity, maximumBytes: FieldLimits.keywordBytes)
        runLoopMode = try reader.string(Field.runLoopMode, maximumBytes: FieldLimits.nameBytes)
        callout = try reader.string(Field.callout, maximumBytes: FieldLimits.keywordBytes)
        loop = try reader.optionalString(Field.loop, maximumBytes: FieldLimits.nameBytes) ?? "main"
        threadID = try reader.threadID(Field.threadID)
        threadState = try reader.string(Field.threadState, maximumBytes: FieldLimits.keywordBytes)
        threadSyscall = try reader.optionalString(Field.threadSyscall, maximumBytes: FieldLimits.keywordBytes) ?? ""
        threadWaitChannel =
            try reader.optionalString(Field.threadWaitChannel, maximumBytes: FieldLimits.waitChannelBytes) ?? ""
        cpuMicroseconds = try reader.microseconds(Field.cpuMicroseconds)
        samples = try reader.count(Field.samples)
        samplesUnanswered = try reader.optionalCount(Field.samplesUnanswered) ?? 0
        stackSamples = try reader.optionalCount(Field.stackSamples) ?? 0
        fingerprint = try reader.hex(Field.fingerprint, digits: FieldLimits.fingerprintDigits)
        frame = try reader.optionalString(Field.frame, maximumBytes: FieldLimits.frameBytes) ?? ""
        backtrace = try reader.optionalString(Field.backtrace, maximumBytes: FieldLimits.backtraceBytes) ?? ""
        stackSource = try reader.optionalString(Field.stackSource, maximumBytes: FieldLimits.keywordBytes) ?? ""
        source = try Self.source(reader)
        // Held to its bounds wherever it appears, but part of watchdog records only: the writer
        // writes it on those alone, so that every record reads back as written.
        let watchdog = try reader.optionalMicroseconds(Field.watchdogMicroseconds) ?? 0
        watchdogMicroseconds = event == .watchdog ? watchdog : 0
        if let stacks = try reader.optionalString(Field.stacks, maximumBytes: FieldLimits.stacksBytes) {
            let lines = backtrace.split(separator: "\n", omittingEmptySubsequences: false).count
            sampledStacks = try SampledStacks(decoding: stacks, backtraceLineCount: lines)
        }
        request = try Request(reader)
    }
}

extension StallRecord {
    /// `STALL_SOURCE` of an entry: absent is the linked monitor's. A value no writer writes is
    /// refused rather than read as the monitor's, so that a reader never shows a stall as seen
    /// from inside that its writer said was seen otherwise; `monitor`, never written, reads as absent.
    static func source(_ reader: FieldReader) throws(JournalDecodingError) -> Source {
        guard let written = try reader.optionalString(Field.source, maximumBytes: FieldLimits.keywordBytes) else {
            return .monitor
        }
        guard let source = Source(rawValue: written) else {
            throw JournalDecodingError(
                field: Field.source, value: written,
                reason: "not a known source (external; absent for the monitor in the process)")
        }
        return source
    }
}

/// A journal entry whose fields do not match the schema.
public struct JournalDecodingError: Error, Sendable, Hashable, CustomStringConvertible {
    public var field: String
    public var value: String?
    public var reason: String

    package init(field: String, value: String?, reason: String) {
        self.field = field
        self.value = value
        self.reason = reason
    }

    /// One line for a terminal: the value cut to 80 characters, control characters escaped.
    public var description: String {
        if let value {
            let shown = value.unicodeScalars.count > 80 ? String(value.unicodeScalars.prefix(80)) + "…" : value
            return "field \(field)=\"\(DisplayText.escaped(shown))\": \(reason)"
        }
        return "field \(field): \(reason)"
    }
}
