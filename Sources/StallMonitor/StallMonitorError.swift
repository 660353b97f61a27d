/// Why a monitor could not start, a `StallMonitor` or an `NIOStallMonitor` alike.
///
/// Match on ``code``; ``description`` says what happened in words, for people:
///
/// ```swift
/// do {
///     try monitor.start()
/// } catch where error.code == .alreadyRunning {
///     // started elsewhere already
/// }
/// ```
///
/// Two errors are equal when their codes are.
public struct StallMonitorError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure it is. Later versions may add codes: compare with `==` and keep a
    /// fallback for the others.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable {
            case alreadyRunning
            case signalUnavailable
            case tooManyMonitors
            case outOfMemory
            case asyncMainOffMainThread
            case asyncMainHookUnavailable
            case eventLoopDidNotAnswer
            case eventLoopCountsNoTicks
            case cooperativePoolHookUnavailable
            case runLoopTargetInAsyncMain
        }

        private let value: Value

        private init(_ value: Value) {
            self.value = value
        }

        /// The monitor runs already: stop it before starting it again.
        public static let alreadyRunning = Self(.alreadyRunning)
        /// The configured sampling signal has a handler of someone else's, or `sigaction` failed.
        public static let signalUnavailable = Self(.signalUnavailable)
        /// As many monitors run in this process as it allows (32).
        public static let tooManyMonitors = Self(.tooManyMonitors)
        /// A small allocation (the loop state, a file descriptor) failed.
        public static let outOfMemory = Self(.outOfMemory)
        /// `start(.asyncMain)` or `start(.asyncMainRunLoop)` ran off the main thread: after `main()`
        /// first suspended, or on another thread.
        public static let asyncMainOffMainThread = Self(.asyncMainOffMainThread)
        /// The main thread cannot drain the main queue: the runtime has no hook for it, another
        /// library set it, or an earlier start chose the other drain.
        public static let asyncMainHookUnavailable = Self(.asyncMainHookUnavailable)
        /// An event loop of the group did not run a task within a second.
        public static let eventLoopDidNotAnswer = Self(.eventLoopDidNotAnswer)
        /// No longer raised: a group without the monitor's metrics delegate is watched with
        /// heartbeats. Kept so that code that matches it still compiles.
        public static let eventLoopCountsNoTicks = Self(.eventLoopCountsNoTicks)
        /// The cooperative pool cannot be watched (`cooperative_pool`): the runtime has no
        /// `swift_task_enqueueGlobal_hook`, another library set it, or another monitor of the
        /// process watches the pool already.
        public static let cooperativePoolHookUnavailable = Self(.cooperativePoolHookUnavailable)
        /// `start()` (the main run loop) was called in an async `main()`, which never runs the main
        /// run loop on Linux: start the monitor with `.asyncMain`, or `startService()` for a server.
        public static let runLoopTargetInAsyncMain = Self(.runLoopTargetInAsyncMain)

        /// The code's name, e.g. `alreadyRunning`.
        public var description: String { value.rawValue }
    }

    /// What kind of failure it is.
    public let code: Code
    /// Where the error was raised.
    public let file: String
    public let line: Int
    private let message: String

    private init(_ code: Code, _ message: String, file: String, line: Int) {
        self.code = code
        self.message = message
        self.file = file
        self.line = line
    }

    /// What happened, e.g. `sampling signal SIGRTMIN+4 is unavailable: another handler owns it`.
    public var description: String { message }

    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.code == rhs.code }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(code)
    }

    package static func alreadyRunning(file: String = #fileID, line: Int = #line) -> Self {
        Self(.alreadyRunning, "the monitor is already running", file: file, line: line)
    }

    package static func signalUnavailable(
        _ signal: Int32, reason: String, file: String = #fileID, line: Int = #line
    ) -> Self {
        Self(
            .signalUnavailable, "sampling signal \(SignalName.name(of: signal)) is unavailable: \(reason)",
            file: file, line: line)
    }

    package static func tooManyMonitors(file: String = #fileID, line: Int = #line) -> Self {
        Self(.tooManyMonitors, "too many monitors in this process (at most 32 run at once)", file: file, line: line)
    }

    package static func outOfMemory(file: String = #fileID, line: Int = #line) -> Self {
        Self(.outOfMemory, "out of memory", file: file, line: line)
    }

    package static func asyncMainOffMainThread(file: String = #fileID, line: Int = #line) -> Self {
        Self(
            .asyncMainOffMainThread,
            "start(.asyncMain) must run on the main thread, in main() before its first await (the main thread "
                + "has left for dispatch_main() once main() suspends)",
            file: file, line: line)
    }

    package static func asyncMainHookUnavailable(reason: String, file: String = #fileID, line: Int = #line) -> Self {
        Self(
            .asyncMainHookUnavailable, "cannot drain the main queue on the main thread of an async main: \(reason)",
            file: file, line: line)
    }

    package static func eventLoopDidNotAnswer(file: String = #fileID, line: Int = #line) -> Self {
        Self(
            .eventLoopDidNotAnswer, "an event loop of the group did not run a task within a second", file: file,
            line: line)
    }

    package static func runLoopTargetInAsyncMain(file: String = #fileID, line: Int = #line) -> Self {
        Self(
            .runLoopTargetInAsyncMain,
            "start() watches the main run loop, which an async main() never runs on Linux: call "
                + "start(.asyncMain) in main() before its first await, or startService() (StallMonitorNIO) for a "
                + "server on SwiftNIO, which also watches its event loops",
            file: file, line: line)
    }

    package static func cooperativePoolHookUnavailable(
        reason: String, file: String = #fileID, line: Int = #line
    ) -> Self {
        Self(
            .cooperativePoolHookUnavailable, "cannot watch the cooperative pool (cooperative_pool): \(reason)",
            file: file, line: line)
    }
}
