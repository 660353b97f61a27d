/// A stall report as it is stored in the journal: the one definition of the field schema, used by
/// the writer (the monitor's journald sink) and by every reader (CLI, collector).
public struct StallRecord: Sendable, Hashable {
    public enum Event: String, Sendable, Hashable {
        /// Written when the stall reaches the threshold, with the first stack.
        case detected
        /// Written when the loop moves on, with the true duration and the heaviest stack.
        case ended
        /// Written when a stall outlasts the service's `WatchdogSec=`, just before systemd kills it.
        case watchdog
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
    /// `timer`, `source0`, `source1`, `main-queue`, `observer`, `perform-block` or `unknown`.
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
    /// One frame a line, at most ``StallRecord/maximumBacktraceBytes``.
    public var backtrace: String
    public var priority: Int
    public var syslogIdentifier: String
    /// The service's watchdog interval (`WatchdogSec=`) for ``Event/watchdog`` entries, 0 otherwise.
    public var watchdogMicroseconds: UInt64 = 0
    /// How the backtrace was taken: `signal` (the thread unwound itself in the sampling signal's
    /// handler), `kernel` (blocked in a system call, unwound in place from the registers the kernel
    /// shows), `previous` (samples that got no stack of their own, counted unanswered: the latest
    /// stack taken earlier in the stall); empty when there is no stack.
    public var stackSource: String = ""

    /// `journalctl -o json` prints `null` for fields over 4096 bytes unless `--all` is given.
    public static let maximumBacktraceBytes = 4096

    public init(
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

    public var messageID: String {
        switch event {
        case .detected: MessageID.stallDetected
        case .ended: MessageID.stallEnded
        case .watchdog: MessageID.watchdogStall
        }
    }

    /// The entry's fields, in the order they are written.
    public var fields: [JournalField] {
        [
            JournalField("MESSAGE_ID", messageID),
            JournalField("MESSAGE", message),
            JournalField("PRIORITY", String(priority)),
            JournalField("SYSLOG_IDENTIFIER", syslogIdentifier),
            JournalField(Field.id, stallID),
            JournalField(Field.event, event.rawValue),
            JournalField(Field.durationMicroseconds, String(durationMicroseconds)),
            JournalField(Field.thresholdMicroseconds, String(thresholdMicroseconds)),
            JournalField(Field.activity, activity),
            JournalField(Field.runLoopMode, runLoopMode),
            JournalField(Field.callout, callout),
            JournalField(Field.loop, loop),
            JournalField(Field.threadID, String(threadID)),
            JournalField(Field.threadState, threadState),
            JournalField(Field.threadSyscall, threadSyscall),
            JournalField(Field.threadWaitChannel, threadWaitChannel),
            JournalField(Field.cpuMicroseconds, String(cpuMicroseconds)),
            JournalField(Field.samples, String(samples)),
            JournalField(Field.samplesUnanswered, String(samplesUnanswered)),
            JournalField(Field.stackSamples, String(stackSamples)),
            JournalField(Field.fingerprint, fingerprint),
            JournalField(Field.frame, frame),
            JournalField(Field.backtrace, Self.clampBacktrace(backtrace)),
        ] + (stackSource.isEmpty ? [] : [JournalField(Field.stackSource, stackSource)])
            + (event == .watchdog ? [JournalField(Field.watchdogMicroseconds, String(watchdogMicroseconds))] : [])
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
        public static let watchdogMicroseconds = "STALL_WATCHDOG_USEC"
    }

    /// Cuts a backtrace at a line boundary so that it fits ``maximumBacktraceBytes``.
    public static func clampBacktrace(_ backtrace: String) -> String {
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
    /// Decodes an entry read from the journal (for example a line of `journalctl -o json`).
    /// - Throws: ``JournalDecodingError`` naming the field that is missing or malformed.
    public init(journalFields fields: [String: String]) throws(JournalDecodingError) {
        let reader = FieldReader(fields: fields)
        let messageID = try reader.string("MESSAGE_ID")
        switch messageID {
        case MessageID.stallDetected: event = .detected
        case MessageID.stallEnded: event = .ended
        case MessageID.watchdogStall: event = .watchdog
        default: throw JournalDecodingError(field: "MESSAGE_ID", value: messageID, reason: "not a stall report")
        }
        message = try reader.string("MESSAGE")
        priority = try reader.integer("PRIORITY", as: Int.self)
        syslogIdentifier = reader.optionalString("SYSLOG_IDENTIFIER") ?? ""
        stallID = try reader.string(Field.id)
        durationMicroseconds = try reader.integer(Field.durationMicroseconds, as: UInt64.self)
        thresholdMicroseconds = try reader.integer(Field.thresholdMicroseconds, as: UInt64.self)
        activity = try reader.string(Field.activity)
        runLoopMode = try reader.string(Field.runLoopMode)
        callout = try reader.string(Field.callout)
        loop = reader.optionalString(Field.loop) ?? "main"
        threadID = try reader.integer(Field.threadID, as: Int.self)
        threadState = try reader.string(Field.threadState)
        threadSyscall = reader.optionalString(Field.threadSyscall) ?? ""
        threadWaitChannel = reader.optionalString(Field.threadWaitChannel) ?? ""
        cpuMicroseconds = try reader.integer(Field.cpuMicroseconds, as: UInt64.self)
        samples = try reader.integer(Field.samples, as: Int.self)
        samplesUnanswered = try reader.optionalInteger(Field.samplesUnanswered, as: Int.self) ?? 0
        stackSamples = try reader.optionalInteger(Field.stackSamples, as: Int.self) ?? 0
        fingerprint = try reader.string(Field.fingerprint)
        frame = reader.optionalString(Field.frame) ?? ""
        backtrace = reader.optionalString(Field.backtrace) ?? ""
        stackSource = reader.optionalString(Field.stackSource) ?? ""
        watchdogMicroseconds = try reader.optionalInteger(Field.watchdogMicroseconds, as: UInt64.self) ?? 0
    }
}

/// A journal entry whose fields do not match the schema.
public struct JournalDecodingError: Error, Sendable, Hashable, CustomStringConvertible {
    public var field: String
    public var value: String?
    public var reason: String

    public init(field: String, value: String?, reason: String) {
        self.field = field
        self.value = value
        self.reason = reason
    }

    public var description: String {
        if let value {
            let shown = value.count > 80 ? String(value.prefix(80)) + "…" : value
            return "field \(field)=\"\(shown)\": \(reason)"
        }
        return "field \(field): \(reason)"
    }
}

struct FieldReader {
    let fields: [String: String]

    func optionalString(_ name: String) -> String? { fields[name] }

    func string(_ name: String) throws(JournalDecodingError) -> String {
        guard let value = fields[name] else {
            throw JournalDecodingError(field: name, value: nil, reason: "missing")
        }
        return value
    }

    func integer<T: FixedWidthInteger>(_ name: String, as type: T.Type) throws(JournalDecodingError) -> T {
        let text = try string(name)
        guard let value = T(text) else {
            throw JournalDecodingError(field: name, value: text, reason: "not an integer in range")
        }
        return value
    }

    func optionalInteger<T: FixedWidthInteger>(_ name: String, as type: T.Type) throws(JournalDecodingError) -> T? {
        guard fields[name] != nil else { return nil }
        return try integer(name, as: type)
    }
}
