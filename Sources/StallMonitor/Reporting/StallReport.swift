import StallJournal

/// What a stall looked like: when it was detected (at the threshold, with the first stack) or when
/// it ended (with the true duration and the heaviest stack).
public struct StallReport: Sendable, Hashable {
    /// Which report of a stall this is.
    ///
    /// Later versions may add cases: a `switch` over it keeps a `default`.
    public enum Event: String, Sendable, Hashable {
        case detected
        case ended
        /// The stall outlasted the service's `WatchdogSec=`: the last report before systemd kills it.
        case watchdog
    }

    /// The window, cycle or job the stall happened in.
    ///
    /// Later versions may add cases: a `switch` over it keeps a `default`.
    public enum Activity: String, Sendable, Hashable {
        /// After kCFRunLoopBeforeSources: sources, blocks and (on Linux) the main queue run here.
        case beforeSources = "before-sources"
        /// After kCFRunLoopAfterWaiting: timers, ports and the main queue after a wakeup.
        case afterWaiting = "after-waiting"
        /// An event loop's cycle (SwiftNIO): its I/O handlers and its tasks, from leaving
        /// `epoll_wait` to the end of its tick.
        case eventLoopCycle = "event-loop-cycle"
        /// A job of Swift's cooperative pool (the global concurrent executor), from its start on a
        /// pool thread to its end.
        case poolJob = "pool-job"
    }

    /// What the run loop was calling out to, recognized from the frames.
    ///
    /// Later versions may add cases: a `switch` over it keeps a `default`.
    public enum Callout: String, Sendable, Hashable, CaseIterable {
        case timer
        case source0
        case source1
        case mainQueue = "main-queue"
        /// A Swift job on the main actor (`@MainActor` code, `MainActor.run`), run from the main queue.
        case mainActor = "main-actor"
        case observer
        case performBlock = "perform-block"
        case unknown
        /// An event loop (SwiftNIO) reading from a channel: `channelRead` and its pipeline.
        case channelRead = "channel-read"
        /// An event loop writing or flushing through a channel's pipeline.
        case channelWrite = "channel-write"
        /// A task of `EventLoop.scheduleTask`.
        case scheduledTask = "scheduled-task"
        /// A task of `EventLoop.execute` or `submit`.
        case executeTask = "execute-task"
        /// A callback of an `EventLoopFuture`.
        case futureCallback = "future-callback"
        /// A job of Swift's cooperative pool (an `async` function, a `Task`'s body), run by the
        /// monitor's trampoline on a pool thread.
        case poolJob = "pool-job"

        /// `timer callout`, `main-queue block`, …
        public var phrase: String {
            switch self {
            case .timer: "timer callout"
            case .source0: "source0 callout"
            case .source1: "source1 (port) callout"
            case .mainQueue: "main-queue block"
            case .mainActor: "main-actor job"
            case .observer: "observer callout"
            case .performBlock: "perform-block callout"
            case .unknown: "unknown callout"
            case .channelRead: "channel read"
            case .channelWrite: "channel write"
            case .scheduledTask: "scheduled task"
            case .executeTask: "execute task"
            case .futureCallback: "future callback"
            case .poolJob: "pool job"
            }
        }
    }

    /// How the reported stack was taken.
    public struct StackSource: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The sampling signal's handler copied the running thread's registers and the top of its
        /// stack; the watchdog unwound the copy.
        public static let signal = Self(rawValue: "signal")
        /// A perf event on the running thread: the kernel copied its registers and the top of its
        /// stack, and no signal was sent; the watchdog unwound the copy.
        public static let perf = Self(rawValue: "perf")
        /// The thread blocked in a system call and was not signalled: its stack was unwound in
        /// place from the stack pointer and program counter the kernel shows for it.
        public static let kernel = Self(rawValue: "kernel")
        /// Most samples got no stack of their own (the thread blocked where it could not be
        /// unwound, or kept entering short system calls and was not signalled): the latest stack
        /// taken earlier in the stall stands in for them.
        public static let previous = Self(rawValue: "previous")

        /// Ties between sources go to the more direct one.
        var rank: Int { self == .signal || self == .perf ? 0 : self == .kernel ? 1 : 2 }
    }

    public var event: Event
    /// Same for the detected and the ended report of one stall.
    public var stallID: String
    /// `main`, or the monitored thread's name.
    public var loop: String
    public var threadID: Int
    /// Time the loop spent in the window, less any time the process was stopped. For a detected
    /// report, the time until detection.
    public var duration: Duration
    public var threshold: Duration
    public var activity: Activity
    public var runLoopMode: String
    public var callout: Callout
    /// The kernel's dominant state of the thread over the samples: `R`, `S`, `D`, …
    public var threadState: String
    /// The system call the thread was in at the latest sample.
    public var syscall: String?
    /// The kernel function it waited in at the latest sample.
    public var waitChannel: String?
    /// CPU time the thread used during the stall.
    public var cpuTime: Duration
    /// Samples requested, and how many the thread did not answer.
    public var samples: Int
    public var unansweredSamples: Int
    /// Samples in which ``stack`` was seen.
    public var stackSamples: Int
    /// The first stack (detected) or the heaviest stack (ended), innermost first.
    public var stack: [StallFrame]
    /// How ``stack`` was taken; `nil` when there is no stack.
    public var stackSource: StackSource?
    /// Stable hash of the top frames (from ``culprit`` on): equal for the same stall across runs and hosts.
    public var fingerprint: String
    /// Why there is no stack, when there is none.
    public var noStackReason: String?
    /// CLOCK_MONOTONIC nanoseconds when the window began.
    public var startNanoseconds: UInt64
    /// Time the process was stopped (SIGSTOP, debugger) during the stall; not part of ``duration``.
    public var pausedTime: Duration
    /// The service's watchdog interval, for ``Event/watchdog`` reports.
    public var watchdogInterval: Duration?
    /// Every distinct stack sampled so far, with how many samples showed it, heaviest first.
    public var sampledStacks: [SampledStack] = []
    /// The request the stalled work served: what the swift-distributed-tracing span around it said
    /// when the stall was reported; `nil` outside any span the monitor knows (see `StallmonTracer`).
    public var request: Request?

    package init(
        event: Event, stallID: String, loop: String, threadID: Int, duration: Duration, threshold: Duration,
        activity: Activity, runLoopMode: String, callout: Callout, threadState: String, syscall: String?,
        waitChannel: String?, cpuTime: Duration, samples: Int, unansweredSamples: Int, stackSamples: Int,
        stack: [StallFrame], fingerprint: String, noStackReason: String?, startNanoseconds: UInt64,
        pausedTime: Duration, watchdogInterval: Duration? = nil, stackSource: StackSource? = nil
    ) {
        self.event = event
        self.stallID = stallID
        self.loop = loop
        self.threadID = threadID
        self.duration = duration
        self.threshold = threshold
        self.activity = activity
        self.runLoopMode = runLoopMode
        self.callout = callout
        self.threadState = threadState
        self.syscall = syscall
        self.waitChannel = waitChannel
        self.cpuTime = cpuTime
        self.samples = samples
        self.unansweredSamples = unansweredSamples
        self.stackSamples = stackSamples
        self.stack = stack
        self.fingerprint = fingerprint
        self.noStackReason = noStackReason
        self.startNanoseconds = startNanoseconds
        self.pausedTime = pausedTime
        self.watchdogInterval = watchdogInterval
        self.stackSource = stack.isEmpty ? nil : stackSource ?? .signal
    }

    /// The frame a reader looks at first: the innermost frame of the program's own code (with
    /// file:line when there is debug information), skipping the C library, runtime and frameworks.
    public var culprit: StallFrame? {
        StallReport.culpritIndex(in: stack).map { stack[$0] }
    }

    /// Share of the stall the thread spent on a CPU (0…1).
    public var cpuShare: Double {
        let total = Double(duration.nanoseconds)
        guard total > 0 else { return 0 }
        return min(1, Double(cpuTime.nanoseconds) / total)
    }

    /// Whether the stall burned CPU rather than waited.
    public var isOnCPU: Bool { cpuShare >= 0.5 }

    /// The one line a human reads first, e.g.
    /// `main run loop stalled 312 ms in timer callout at Service.refresh() (Service.swift:42); 97% on CPU`.
    public var message: String {
        let loopName =
            activity == .poolJob
            ? "cooperative-pool thread \(threadID)"
            : activity == .eventLoopCycle
                ? "event loop \(loop)" : loop == "main" ? "main run loop" : "run loop of thread \(loop)"
        let length = "\(duration.milliseconds) ms"
        var text: String
        switch event {
        case .detected: text = "\(loopName) stalled for \(length) (threshold \(threshold.milliseconds) ms)"
        case .ended: text = "\(loopName) stalled \(length)"
        case .watchdog:
            let interval = watchdogInterval.map { "\($0.milliseconds) ms" } ?? "?"
            text =
                "\(loopName) stalled for \(length), past the service watchdog (\(interval)): systemd will kill the service;"
        }
        text += " in \(callout.phrase)"
        if let culprit {
            text += " at \(culprit.summary)"
        } else if let noStackReason {
            text += " (no stack: \(noStackReason))"
        }
        if let request, !request.isEmpty {
            text += request.phrase
        }
        if isOnCPU {
            text += "; \(Int((cpuShare * 100).rounded()))% on CPU"
        } else if let syscall {
            text += "; blocked in \(syscall)"
        } else {
            text += "; waiting (\(Int((cpuShare * 100).rounded()))% on CPU)"
        }
        return text
    }

    /// One frame a line.
    public var backtrace: String {
        stack.enumerated().map { index, frame in "#\(index) \(frame.backtraceLine)" }.joined(separator: "\n")
    }

    package static func culpritIndex(in stack: [StallFrame]) -> Int? {
        if let index = stack.firstIndex(where: { !$0.isSystemFrame && $0.location != nil }) { return index }
        if let index = stack.firstIndex(where: { !$0.isSystemFrame && $0.symbol != nil }) { return index }
        return stack.isEmpty ? nil : 0
    }

    /// FNV-1a over the names of up to eight frames from the culprit on. Names, not addresses, so
    /// that address-space layout does not change it; frames without a symbol use their image's name.
    package static func fingerprint(of stack: [StallFrame]) -> String {
        guard let start = culpritIndex(in: stack) else { return "0000000000000000" }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for frame in stack[start...].prefix(8) {
            let name = frame.symbol ?? "?\(frame.image?.lastPathComponent ?? "?")"
            for byte in name.utf8 {
                hash ^= UInt64(byte)
                hash &*= 0x100_0000_01b3
            }
            hash ^= 0x0a
            hash &*= 0x100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

/// Stalls that were not reported because their fingerprint was over the rate limit.
public struct SuppressionReport: Sendable, Hashable {
    public var loop: String
    public var threadID: Int
    public var fingerprint: String
    /// The culprit frame of the suppressed stalls.
    public var frame: String
    public var count: Int
    public var totalDuration: Duration
    public var worstDuration: Duration
    /// The rate limit that applied.
    public var burst: Int
    public var interval: Duration

    public var message: String {
        "suppressed \(count) report\(count == 1 ? "" : "s") of stall \(fingerprint) at \(frame) "
            + "(worst \(worstDuration.milliseconds) ms, total \(totalDuration.milliseconds) ms; "
            + "limit \(burst) per \(interval.milliseconds / 1000) s)"
    }
}
