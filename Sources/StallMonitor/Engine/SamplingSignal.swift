#if STALLMON_LINUX
import CStallCapture
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The signal a watchdog samples running threads with, chosen in one place for every kind of loop,
/// with stallmon's handler installed.
package enum SamplingSignal {
    /// The threads a watchdog samples, which decide the choice.
    package enum Threads {
        /// One loop's thread (a run loop, an async main): a signal it does not block is preferred,
        /// and, started on that thread, the monitor unblocks its signal there (the thread may have
        /// been made by one that blocks real-time signals, as libdispatch's workers do; a signal
        /// the main thread blocks is never chosen, so the program reads none of them).
        case loop(pid_t)
        /// An event-loop group's threads: each unblocks the signal itself, from a task it runs
        /// (``unblockOnCurrentThread(_:)``).
        case eventLoops
        /// Swift's cooperative pool: its threads are libdispatch's workers, which block SIGUSR1,
        /// SIGUSR2 and the real-time signals, so SIGPROF, while it has no handler of the program's
        /// (a profiler's); the configured signal does not apply.
        case cooperativePool
    }

    /// The configured signal, or the highest real-time signal that has no handler; SIGPROF for the
    /// pool. `nil` (with a warning) when none is free: reports then carry no stack of a thread on
    /// the CPU.
    /// - Throws: ``StallMonitorError`` when the configured signal is taken.
    package static func choose(
        _ configuration: StallMonitor.Configuration, for threads: Threads, logger: Logger
    ) throws(StallMonitorError) -> Int32? {
        // Perf events only: no handler is installed at all.
        if configuration.stackSource == .perf { return nil }
        switch threads {
        case .cooperativePool:
            let rc = stallmon_sampler_install(SIGPROF)
            guard rc == 0 else {
                let why =
                    rc == -EBUSY ? "SIGPROF has a handler of the program's (a profiler?)" : "SIGPROF: \(reason(rc))"
                logger.warning(
                    """
                    \(why): cooperative-pool stalls on the CPU carry no stack (threads blocked in a system call \
                    still do)
                    """)
                return nil
            }
            return SIGPROF
        case .eventLoops:
            return try install(configuration, preferringUnblockedBy: nil, logger: logger)
        case .loop(let threadID):
            let inspector = ThreadInspector(threadID: threadID)
            let onLoopThread = stallmon_gettid() == threadID
            guard
                let signal = try install(
                    configuration, preferringUnblockedBy: onLoopThread ? nil : inspector, logger: logger)
            else { return nil }
            if onLoopThread, inspector.blocks(signal) { unblockOnCurrentThread(signal) }
            if inspector.blocks(signal) {
                logger.warning(
                    "the monitored thread blocks the sampling signal; stall reports will carry no stack",
                    metadata: ["signal": "\(SignalName.name(of: signal))"]
                )
            }
            return signal
        }
    }

    /// Installs the configured signal, or the highest free real-time signal, preferring those that
    /// `thread` does not block. A signal the main thread blocks is the program's even with no
    /// handler (it reads it with `signalfd` or `sigwaitinfo`): it is never taken.
    private static func install(
        _ configuration: StallMonitor.Configuration, preferringUnblockedBy thread: ThreadInspector?, logger: Logger
    ) throws(StallMonitorError) -> Int32? {
        let programBlocks = programBlockedSignals()
        if let signal = configuration.signal {
            if programBlocks(signal) {
                throw StallMonitorError.signalUnavailable(
                    signal, reason: "the program blocks it on its main thread (it reads it with signalfd or sigwait)")
            }
            let rc = stallmon_sampler_install(signal)
            guard rc == 0 else {
                throw StallMonitorError.signalUnavailable(signal, reason: reason(rc))
            }
            return signal
        }
        let candidates = Array(stride(from: stallmon_sigrtmax() - 4, through: stallmon_sigrtmin() + 4, by: -1))
            .filter { !programBlocks($0) }
        let preferred = thread.map { thread in candidates.filter { !thread.blocks($0) } + candidates } ?? candidates
        var refusal: Int32 = 0
        guard
            let signal = preferred.first(where: {
                let rc = stallmon_sampler_install($0)
                if rc == -EACCES { refusal = rc }
                return rc == 0
            })
        else {
            if refusal != 0 {
                logger.warning("no sampling of running threads: \(reason(refusal)); stall reports will carry no stack")
            } else if candidates.isEmpty {
                logger.warning(
                    """
                    no sampling of running threads: the main thread blocks every real-time signal (a process \
                    spawned from a libdispatch worker inherits that mask); start the service with an empty \
                    signal mask, as systemd does, or set STALLMON_SIGNAL to one the program does not read
                    """)
            } else {
                logger.warning("no free real-time signal for sampling; stall reports will carry no stack")
            }
            return nil
        }
        return signal
    }

    /// Whether the program blocks a signal on its main thread: blocked in two readings of its mask
    /// a millisecond apart, when the first shows any blocked. (Foundation blocks every signal on a
    /// thread around each `pthread_create` it makes: a reading at that moment is no choice of the
    /// program's.)
    private static func programBlockedSignals() -> (Int32) -> Bool {
        let mainThread = ThreadInspector(threadID: getpid())
        guard let first = mainThread.blockedSignals(), first != 0 else { return { _ in false } }
        usleep(1000)
        let mask = first & (mainThread.blockedSignals() ?? first)
        return { signal in signal > 0 && signal <= 64 && mask & (1 << UInt64(signal - 1)) != 0 }
    }

    private static func reason(_ rc: Int32) -> String {
        switch rc {
        case -EBUSY: "another handler owns it"
        case -EACCES: "/proc/self/mem cannot be opened, and the handler copies the stack through it"
        default: "sigaction failed (errno \(-rc))"
        }
    }

    /// Unblocks `signal` on the calling thread (a loop thread, from a task it runs). Only a signal
    /// ``choose(_:for:logger:)`` chose: one the main thread does not block.
    package static func unblockOnCurrentThread(_ signal: Int32) {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, signal)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }
}
#endif  // STALLMON_LINUX
