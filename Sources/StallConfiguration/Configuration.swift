#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension StallMonitoring {
    /// How a `StallMonitor` detects, samples and reports stalls; its users call it
    /// `StallMonitor.Configuration`. Every knob has a default; `config/stallmon.json` documents each
    /// one and holds the same defaults.
    public struct Configuration: Sendable, Hashable {
        /// How long the loop may stay inside one before-sources or after-waiting window before
        /// the window is a stall. At least 10 ms.
        public var threshold: Duration = .milliseconds(250)
        /// How often a stalled thread is sampled while the stall lasts. At most the threshold.
        public var sampleInterval: Duration = .milliseconds(20)
        /// How long the watchdog waits for the stalled thread to answer a sample request.
        public var sampleTimeout: Duration = .milliseconds(50)
        /// Deepest stack captured per sample (1…128).
        public var maximumFrames: Int = 64
        /// Distinct stacks kept per stall for ranking; samples beyond it still count.
        public var maximumStacks: Int = 64
        /// No stall is reported until this long after `StallMonitor.start(_:)`.
        public var startupGracePeriod: Duration = .zero
        /// How long after the startup grace period the monitored loop may go without turning once
        /// before the monitor warns (on its logger) that it cannot see the loop: an async `@main`
        /// that never runs the main run loop, a thread that never runs its loop. Until the loop
        /// first turns, the service watchdog gets no `WATCHDOG=1`.
        public var loopStartTimeout: Duration = .seconds(10)
        /// Whether stalls are reported while a debugger or tracer is attached (`TracerPid`).
        public var reportWhileDebuggerAttached: Bool = false
        /// The signal used to sample the stalled thread. `nil` picks a real-time signal that has
        /// no handler and that the thread does not block.
        public var signal: Int32? = nil
        /// Whether a thread blocked in a system call is signalled for its stack like a running one.
        /// Off by default: it is unwound in place from the kernel's view instead, because a signal
        /// handler ends `nanosleep`, `poll`, `epoll_wait`, `select` and timed waits with `EINTR`
        /// whatever `SA_RESTART` says. On, the program sees those `EINTR`s at the first sample.
        public var interruptBlockedThreads: Bool = false
        /// How a running thread's stack is taken: by a perf event on it where the kernel allows
        /// (no signal reaches the program), by the sampling signal, or the first with the second as
        /// the fallback (the default). A thread blocked in a system call is unwound in place
        /// whatever this says.
        public var stackSource: StackSource = .auto
        /// At most ``RateLimit/burst`` reports per fingerprint in each ``RateLimit/interval``.
        public var rateLimit: RateLimit = RateLimit()
        /// Reports waiting for the reporting thread, and events waiting in each sink's own queue
        /// (every sink but the journal's has one); beyond it reports are dropped and counted.
        public var reportQueueCapacity: Int = 64
        /// `SYSLOG_IDENTIFIER` of the journal entries (and of the JSON lines on standard error);
        /// `nil` uses the program's name.
        public var syslogIdentifier: String? = nil
        /// Where the default sinks send reports: `nil` (`"auto"`) the journal while journald takes
        /// entries, else standard error, as JSON lines unless it is a terminal. See
        /// ``ReportDestination``.
        public var sink: ReportDestination? = nil
        /// Run-loop modes observed in addition to the common modes.
        public var additionalModes: [String] = []
        /// Whether each stall updates the service's `STATUS=` (shown by `systemctl status`), e.g.
        /// `main loop healthy; 3 stalls in 1h, worst 540 ms`. Needs `$NOTIFY_SOCKET`.
        public var notifyStatus: Bool = false
        /// Whether the loop's thread counts the duration of every window (or tick) into a latency
        /// histogram: ``StallMonitor/loopLatency`` and the `stallmon_loop_window_seconds` metrics.
        /// Off by default: it reads the clock at the end of every window, which the stall detection
        /// alone skips.
        public var loopLatency: Bool = false
        /// Whether Swift's cooperative pool (the global concurrent executor) is watched too: a job
        /// that holds a pool thread past ``cooperativePoolThreshold`` is reported like a loop stall
        /// (`STALL_LOOP=cooperative-pool`). `nil` (`"auto"`, the default) watches it for an async
        /// service (the async-main targets and `startService()`), where route handlers run on the
        /// pool, and not for a run-loop service; `true` and `false` decide for every target. Watched,
        /// the monitor sets the runtime's `swift_task_enqueueGlobal_hook`, which costs each pool job
        /// a few tens of nanoseconds.
        public var cooperativePool: Bool? = nil
        /// How long one job may hold a pool thread before it is a stall. 10 ms to 1 hour.
        public var cooperativePoolThreshold: Duration = .milliseconds(100)

        public init() {}

        /// How a running thread's stack is taken (``Configuration/stackSource``).
        public enum StackSource: String, Sendable, Hashable, CaseIterable {
            /// A perf event on the stalled thread while its stall lasts; where the kernel refuses one
            /// (`perf_event_paranoid`, a seccomp filter, the locked-memory limit), the signal, for
            /// the life of the process, said once on the monitor's logger.
            case auto
            /// A perf event only: where the kernel refuses, a running thread gets no stack, and no
            /// sampling signal is installed at all.
            case perf
            /// The sampling signal only, as before perf events.
            case signal
        }

        /// Reports per fingerprint allowed in a window of time; the rest are counted and summarized.
        public struct RateLimit: Sendable, Hashable {
            public var burst: Int = 5
            public var interval: Duration = .seconds(60)

            public init(burst: Int = 5, interval: Duration = .seconds(60)) {
                self.burst = burst
                self.interval = interval
            }
        }

        /// Checks every value.
        /// - Throws: ``ConfigurationError`` naming the first invalid value and why it is invalid.
        public func validate() throws(ConfigurationError) {
            try Self.check(threshold >= .milliseconds(10), .threshold, threshold, "must be at least 10 ms")
            try Self.check(threshold <= .seconds(3600), .threshold, threshold, "must be at most 1 hour")
            try Self.check(
                cooperativePoolThreshold >= .milliseconds(10), .cooperativePoolThreshold, cooperativePoolThreshold,
                "must be at least 10 ms")
            try Self.check(
                cooperativePoolThreshold <= .seconds(3600), .cooperativePoolThreshold, cooperativePoolThreshold,
                "must be at most 1 hour")
            try Self.check(sampleInterval >= .milliseconds(1), .sampleInterval, sampleInterval, "must be at least 1 ms")
            try Self.check(
                sampleInterval <= threshold, .sampleInterval, sampleInterval,
                "must not exceed the threshold (\(threshold.milliseconds) ms)"
            )
            try Self.check(sampleTimeout >= .milliseconds(1), .sampleTimeout, sampleTimeout, "must be at least 1 ms")
            try Self.check(sampleTimeout <= .seconds(10), .sampleTimeout, sampleTimeout, "must be at most 10 s")
            try Self.check(
                (1...128).contains(maximumFrames), .maximumFrames, "\(maximumFrames)", "must be between 1 and 128"
            )
            try Self.check(
                (1...4096).contains(maximumStacks), .maximumStacks, "\(maximumStacks)", "must be between 1 and 4096"
            )
            try Self.check(startupGracePeriod >= .zero, .startupGracePeriod, startupGracePeriod, "must not be negative")
            try Self.check(
                startupGracePeriod <= .seconds(86400), .startupGracePeriod, startupGracePeriod, "must be at most 1 day")
            try Self.check(
                loopStartTimeout >= .milliseconds(100), .loopStartTimeout, loopStartTimeout, "must be at least 100 ms")
            try Self.check(
                loopStartTimeout <= .seconds(3600), .loopStartTimeout, loopStartTimeout, "must be at most 1 hour")
            if let signal {
                let low = SignalName.realTimeMinimum, high = SignalName.realTimeMaximum
                let allowed = [SIGUSR1, SIGUSR2, SIGPROF] + Array(low...high)
                try Self.check(
                    allowed.contains(signal), .signal, "\(signal)",
                    "must be SIGUSR1, SIGUSR2, SIGPROF or a real-time signal (\(low)…\(high))"
                )
            }
            try Self.check(
                (1...1000).contains(rateLimit.burst), .rateLimitBurst, "\(rateLimit.burst)",
                "must be between 1 and 1000")
            try Self.check(
                rateLimit.interval >= .seconds(1), .rateLimitInterval, rateLimit.interval, "must be at least 1 s"
            )
            try Self.check(
                rateLimit.interval <= .seconds(86400), .rateLimitInterval, rateLimit.interval, "must be at most 1 day")
            try Self.check(
                (1...10_000).contains(reportQueueCapacity), .reportQueueCapacity, "\(reportQueueCapacity)",
                "must be between 1 and 10000"
            )
            if let syslogIdentifier {
                try Self.check(
                    Self.isValidSyslogIdentifier(syslogIdentifier), .syslogIdentifier,
                    ConfigurationValue.shownQuoted(syslogIdentifier),
                    "must be 1 to \(Self.maximumSyslogIdentifierLength) printable ASCII characters, "
                        + "without spaces, '=', '[' or ':'"
                )
            }
            try Self.check(
                additionalModes.count <= 16, .additionalModes, "\(additionalModes.count) modes",
                "must list at most 16 modes")
            for mode in additionalModes {
                try Self.check(
                    (1...255).contains(mode.utf8.count)
                        && !mode.unicodeScalars.contains { $0.properties.generalCategory == .control },
                    .additionalModes, ConfigurationValue.shownQuoted(mode),
                    "mode names must be 1 to 255 bytes, without control characters")
            }
        }

        /// The longest `syslog_identifier`: RFC 5424's bound on APP-NAME, which a syslog relay fed
        /// by journald (`ForwardToSyslog=`) passes on.
        package static let maximumSyslogIdentifierLength = 48

        /// Printable ASCII without spaces, `=`, `[` or `:` (journald reads the syslog form
        /// `IDENTIFIER[PID]: MESSAGE` up to the first of them), 1 to 48 characters.
        static func isValidSyslogIdentifier(_ identifier: String) -> Bool {
            (1...maximumSyslogIdentifierLength).contains(identifier.utf8.count)
                && identifier.utf8.allSatisfy { (0x21...0x7E).contains($0) && !"=[:".utf8.contains($0) }
        }

        private static func check(
            _ condition: Bool, _ key: ConfigurationKey, _ value: Duration, _ reason: String
        ) throws(ConfigurationError) {
            try check(condition, key, value.formattedMilliseconds, reason)
        }

        private static func check(
            _ condition: Bool, _ key: ConfigurationKey, _ value: String, _ reason: String
        ) throws(ConfigurationError) {
            guard condition else {
                throw ConfigurationError(key: key.rawValue, value: ConfigurationValue.shown(value), reason: reason)
            }
        }
    }
}

/// The names of configuration values, as they appear in `config/stallmon.json`.
enum ConfigurationKey: String, CaseIterable {
    case threshold = "threshold_ms"
    case sampleInterval = "sample_interval_ms"
    case sampleTimeout = "sample_timeout_ms"
    case maximumFrames = "max_frames"
    case maximumStacks = "max_stacks"
    case startupGracePeriod = "startup_grace_period_ms"
    case loopStartTimeout = "loop_start_timeout_ms"
    case reportWhileDebuggerAttached = "report_while_debugger_attached"
    case signal = "signal"
    case interruptBlockedThreads = "interrupt_blocked_threads"
    case stackSource = "stack_source"
    case rateLimitBurst = "rate_limit_burst"
    case rateLimitInterval = "rate_limit_interval_s"
    case reportQueueCapacity = "report_queue_capacity"
    case syslogIdentifier = "syslog_identifier"
    case sink = "sink"
    case additionalModes = "additional_modes"
    case notifyStatus = "notify_status"
    case loopLatency = "loop_latency"
    case cooperativePool = "cooperative_pool"
    case cooperativePoolThreshold = "cooperative_pool_threshold_ms"

    /// The environment variable that overrides the key, e.g. `STALLMON_THRESHOLD_MS`.
    var environmentVariable: String { "STALLMON_" + rawValue.uppercased() }
}
