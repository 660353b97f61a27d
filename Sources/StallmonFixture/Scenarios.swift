import CStallCapture
@preconcurrency import CoreFoundation
import Dispatch
import Foundation
import StallMonitor
import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

/// One scenario per way a loop can stall (or must not be reported as stalled).
enum Scenarios {
    static let stallMilliseconds = 600

    static func run(_ name: String, monitor: StallMonitor, options: Options) throws {
        switch name {
        case "timer-cpu":
            try monitor.start()
            Fixture.after(0.3) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            finish(after: 1.5)

        case "stopped-stall":
            // A CPU stall of 2 s during which a shell stops the process three times for 200 ms
            // (SIGSTOP, SIGCONT); the "pause" line is how long the stalled thread was stopped.
            try monitor.start()
            Fixture.after(0.05) {
                let stop = "kill -STOP \(getpid()); sleep 0.2; kill -CONT \(getpid())"
                let stopper = Process()
                stopper.executableURL = URL(fileURLWithPath: "/bin/sh")
                stopper.arguments = ["-c", "sleep 0.45; \(stop); sleep 0.2; \(stop); sleep 0.2; \(stop)"]
                try? stopper.run()
            }
            Fixture.after(0.3) {
                var pause: UInt64 = 0
                Fixture.truth(name) { pause = Stalls.burnCPUNotingStops(milliseconds: 2000) }
                Fixture.print(["type": "pause", "duration_ns": pause])
            }
            finish(after: 3.0)

        case "main-queue-syscall":
            try monitor.start()
            DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
                Fixture.truth(name) { Stalls.sleepInSyscall(milliseconds: stallMilliseconds) }
            }
            finish(after: 1.5)

        case "lock-wait":
            try monitor.start()
            let lock = NSLock()
            Fixture.after(0.2) {
                let holding = DispatchSemaphore(value: 0)
                Thread.detachNewThread {
                    lock.lock()
                    holding.signal()
                    usleep(UInt32(stallMilliseconds) * 1000 + 200_000)
                    lock.unlock()
                }
                holding.wait()
                DispatchQueue.main.async { Fixture.truth(name) { Stalls.waitForLock(lock) } }
            }
            finish(after: 1.8)

        case "main-actor":
            try monitor.start()
            Fixture.after(0.3) {
                Task { @MainActor in
                    Fixture.truth(name) { MainActorWork.recompute(milliseconds: stallMilliseconds) }
                }
            }
            finish(after: 1.5)

        case "source0":
            try monitor.start()
            nonisolated(unsafe) let source = Source0.make()
            CFRunLoopAddSource(CFRunLoopGetMain(), source, kCFRunLoopCommonModes)
            Fixture.after(0.3) {
                CFRunLoopSourceSignal(source)
                CFRunLoopWakeUp(CFRunLoopGetMain())
            }
            finish(after: 1.5)

        case "observer":
            try monitor.start()
            Fixture.after(0.3) {
                // Someone else's observer that stalls once, before the loop next waits.
                let observer = CFRunLoopObserverCreateWithHandler(
                    kCFAllocatorDefault, CFRunLoopActivity.beforeWaiting.rawValue, false, 0
                ) { _, _ in
                    Fixture.truth("observer") { ObserverWork.flush(milliseconds: stallMilliseconds) }
                }
                CFRunLoopAddObserver(CFRunLoopGetMain(), observer, kCFRunLoopCommonModes)
            }
            finish(after: 1.5)

        case "observer-before-timers", "observer-entry":
            // Someone else's observer on an activity that comes before the sources (before-timers,
            // or the loop's entry) stalls once. Added from a main-queue block: RunLoop.run() leaves
            // the loop after it and enters again, so the observer runs at the top of a fresh run.
            try monitor.start()
            let activity: CFRunLoopActivity = name == "observer-entry" ? .entry : .beforeTimers
            DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
                let observer = CFRunLoopObserverCreateWithHandler(kCFAllocatorDefault, activity.rawValue, true, 0) {
                    _, _ in
                    EarlyObserverWork.prepare(name, milliseconds: 355)
                }
                CFRunLoopAddObserver(CFRunLoopGetMain(), observer, kCFRunLoopCommonModes)
            }
            finish(after: 1.5)

        case "perform-block":
            try monitor.start()
            Fixture.after(0.3) {
                RunLoop.main.perform(inModes: [.common]) {
                    Fixture.truth("perform-block") { PerformWork.render(milliseconds: stallMilliseconds) }
                }
                CFRunLoopWakeUp(CFRunLoopGetMain())
            }
            finish(after: 1.5)

        case "nested":
            // A timer callout runs the loop again (default mode); a timer inside the nested run
            // stalls. The nested run also idles for a while: idling there is no stall.
            try monitor.start()
            Fixture.after(0.2) {
                Fixture.after(0.5) { Fixture.truth("nested") { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
                NestedLoop.runFor(seconds: 1.5, mode: .default)
            }
            finish(after: 2.2)

        case "after-nested":
            // A timer callout runs the loop again (default mode); once the nested run has returned,
            // the callout itself stalls: a stall of the outer run's window, which resumed then.
            try monitor.start()
            Fixture.after(0.2) {
                NestedLoop.runFor(seconds: 0.4, mode: .default)
                Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) }
            }
            finish(after: 1.8)

        case "nested-private-mode":
            // A callout runs the loop in a mode the monitor does not observe and idles there.
            try monitor.start()
            Fixture.after(0.2) { NestedLoop.runFor(seconds: 1.0, mode: RunLoop.Mode("stallmon.private")) }
            finish(after: 1.6)

        case "exit-reenter":
            // The loop exits (and the thread does unmonitored work outside it), then re-enters and stalls.
            try monitor.start()
            for _ in 0..<3 {
                RunLoop.main.run(until: Date(timeIntervalSinceNow: 0.2))
                Stalls.sleepInSyscall(milliseconds: 300)
            }
            Fixture.after(0.1) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            finish(after: 1.2)

        case "restart":
            // Stop and start again between two stalls.
            try monitor.start()
            Fixture.after(0.2) { Fixture.truth("restart-1") { Stalls.burnCPU(milliseconds: 300) } }
            Fixture.after(1.0) {
                monitor.stop()
                do { try monitor.start() } catch { fatalError("\(error)") }
            }
            Fixture.after(1.5) { Fixture.truth("restart-2") { Stalls.sleepInSyscall(milliseconds: 300) } }
            finish(after: 2.5)

        case "allowed":
            try monitor.start()
            Fixture.after(0.2) {
                monitor.allowingStall { Stalls.sleepInSyscall(milliseconds: 500) }
            }
            Fixture.after(1.0) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: 400) } }
            finish(after: 2.0)

        case "grace":
            // A stall inside the startup grace period (1 s here) is not reported; one after it is.
            try monitor.start()
            Fixture.after(0.1) { Stalls.burnCPU(milliseconds: 400) }
            Fixture.after(1.3) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: 400) } }
            finish(after: 2.2)

        case "watchdog":
            // Under a service watchdog ($WATCHDOG_USEC, $NOTIFY_SOCKET): a stall longer than the
            // interval stops the pings and gets a final report; the pings resume after it.
            try monitor.start()
            monitor.notifyReady()
            Fixture.after(1.2) { Fixture.truth(name) { Stalls.sleepInSyscall(milliseconds: 1500) } }
            finish(after: options.seconds)

        case "service":
            // A long-running service for the systemd tests: brief stalls every two seconds
            // (--stall-ms), and with --block-after N, a loop blocked for good after N seconds.
            try monitor.start()
            monitor.notifyReady()
            let stall = options.stallMilliseconds
            Timer.scheduledRepeating(every: 2.0) { ServiceWork.handleRequest(milliseconds: stall) }
            if let blockAfter = options.blockAfter {
                Fixture.after(blockAfter) { ServiceWork.deadlock() }
            }

        case "repeat":
            // The same stall over and over: the rate limit (2 per second here) reports a burst,
            // then summarizes the rest.
            try monitor.start()
            Timer.scheduledRepeating(every: 0.3) { Stalls.sleepInSyscall(milliseconds: 150) }
            finish(after: 3.2)

        case "stream":
            // A stall of --stall-ms every --period-ms for --seconds, each with its ended report.
            try monitor.start()
            let stall = options.stallMilliseconds
            Timer.scheduledRepeating(every: Double(options.periodMilliseconds) / 1000) {
                Stalls.sleepInSyscall(milliseconds: stall)
            }
            finish(after: options.seconds)

        case "idle":
            try monitor.start()
            finish(after: options.seconds)

        case "busy":
            // Many short passes: a main-queue block that re-posts itself, each pass ~0.2 ms.
            try monitor.start()
            let deadline = Date(timeIntervalSinceNow: options.seconds)
            BusyLoop.pass(until: deadline)
            finish(after: options.seconds + 0.2)

        case "churn":
            // The sampler interrupts malloc, held locks and system calls for two seconds.
            try monitor.start()
            Fixture.after(0.2) { Fixture.truth(name) { Stalls.churnMallocLocksAndSyscalls(milliseconds: 2000) } }
            finish(after: 2.8)

        case "thread-loop", "thread-loop-blocked":
            // A thread of our own runs its own CFRunLoop and monitors it.
            let blocked = name == "thread-loop-blocked"
            Thread.detachNewThread {
                do { try monitor.start(.currentThread) } catch { fatalError("\(error)") }
                if blocked {
                    // After the monitor started: the thread blocks every signal, its sampler's too.
                    var all = sigset_t()
                    sigfillset(&all)
                    pthread_sigmask(SIG_BLOCK, &all, nil)
                }
                let timer = Timer(fire: Date(timeIntervalSinceNow: 0.3), interval: 0, repeats: false) { _ in
                    Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) }
                }
                RunLoop.current.add(timer, forMode: .default)
                RunLoop.current.run(until: Date(timeIntervalSinceNow: 1.5))
                monitor.stop()
                exit(0)
            }

        case "blocked-usleep", "blocked-poll", "blocked-epoll":
            // A main-queue block blocks in one system call that a signal handler would end with
            // EINTR; the call prints what it returned.
            try monitor.start()
            DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
                Fixture.truth(name) {
                    switch name {
                    case "blocked-usleep": SyscallStalls.sleepWithUsleep(milliseconds: stallMilliseconds)
                    case "blocked-poll": SyscallStalls.pollEmptyPipe(milliseconds: stallMilliseconds)
                    default: SyscallStalls.waitInEpoll(milliseconds: stallMilliseconds)
                    }
                }
            }
            finish(after: 1.5)

        case "short-sleeps":
            // A main-queue block sleeps in steps of --stall-ms microseconds for two seconds: the
            // thread enters a system call every few microseconds, and a sample seldom finds it
            // outside one for long.
            try monitor.start()
            DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
                Fixture.truth(name) {
                    SyscallStalls.sleepInShortSteps(seconds: 2, microseconds: options.stallMilliseconds)
                }
            }
            finish(after: 2.8)

        case "loader-locks":
            // Two loops stall for --seconds each inside the dynamic loader's lock, sampled every
            // --sample-interval-ms: the main run loop's callout walks the loaded images
            // (dl_iterate_phdr), a thread's own run loop, watched by a monitor of its own, loads and
            // unloads a library. Neither thread may wedge, and both monitors stop.
            try monitor.start()
            let milliseconds = Int(options.seconds * 1000)
            let threadMonitor = try StallMonitor(
                configuration: monitor.configuration, sinks: [JSONLinesSink(identifier: options.identifier)])
            let threadDone = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                do { try threadMonitor.start(.currentThread) } catch { fatalError("\(error)") }
                let timer = Timer(fire: Date(timeIntervalSinceNow: 0.2), interval: 0, repeats: false) { _ in
                    let loads = Stalls.loadAndUnloadLibrary(milliseconds: milliseconds)
                    Fixture.print(["type": "loads", "count": loads])
                }
                RunLoop.current.add(timer, forMode: .default)
                RunLoop.current.run(until: Date(timeIntervalSinceNow: 0.5))
                let start = Fixture.now()
                threadMonitor.stop()
                Fixture.print(["type": "stop", "loop": "thread", "duration_ns": Fixture.now() - start])
                threadDone.signal()
            }
            Fixture.after(0.2) {
                let walks = Stalls.walkLoadedImages(milliseconds: milliseconds)
                Fixture.print(["type": "walks", "count": walks])
            }
            Fixture.after(0.5) {
                threadDone.wait()
                let start = Fixture.now()
                monitor.stop()
                Fixture.print(["type": "stop", "loop": "main", "duration_ns": Fixture.now() - start])
                exit(0)
            }

        case "sigwait-term":
            // After start(), the program blocks SIGTERM and waits for it on a thread of its own, as
            // a service that shuts down cleanly on SIGTERM does; then SIGTERM comes to the process.
            try monitor.start()
            var terminate = sigset_t()
            sigemptyset(&terminate)
            sigaddset(&terminate, SIGTERM)
            pthread_sigmask(SIG_BLOCK, &terminate, nil)
            let waiting = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                var set = sigset_t()
                sigemptyset(&set)
                sigaddset(&set, SIGTERM)
                var received: Int32 = 0
                waiting.signal()
                sigwait(&set, &received)
                Fixture.print(["type": "sigwait", "signal": Int(received)])
                monitor.stop()
                Fixture.print(["type": "stop"])
                exit(0)
            }
            waiting.wait()
            Fixture.after(0.3) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            Fixture.after(1.2) { kill(getpid(), SIGTERM) }

        case "sigwaitinfo-rt":
            // Before start(), the program blocks SIGRTMAX-4 (the monitor's first choice) to read it
            // with sigtimedwait (as with a signalfd), leaving its disposition SIG_DFL. The monitor
            // must take another signal; after a stall on the CPU, the program sends the signal to
            // itself and reads it.
            let signal = __libc_current_sigrtmax() - 4
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            pthread_sigmask(SIG_BLOCK, &set, nil)
            try monitor.start()
            Fixture.after(0.3) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            Fixture.after(1.2) {
                kill(getpid(), signal)
                var set = sigset_t()
                sigemptyset(&set)
                sigaddset(&set, signal)
                var info = siginfo_t()
                var timeout = timespec(tv_sec: 0, tv_nsec: 200_000_000)
                let received = sigtimedwait(&set, &info, &timeout)
                Fixture.print(["type": "sigwaitinfo", "signal": Int(max(received, 0))])
            }
            finish(after: 1.5)

        case "perf-stall", "perf-stall-denied":
            // The program handles SIGPROF and every real-time signal but the monitor's first choice
            // itself, counting. The main run loop stalls 600 ms on the CPU; the perf event
            // descriptors are counted before, during and after the stall. perf-stall-denied installs
            // a seccomp filter that refuses perf_event_open first (EPERM, as Docker's default profile).
            if name == "perf-stall-denied" { DeniedCall.perfEventOpen.install() }
            ProgramSignals.install(sparing: SignalTakeover.samplingSignal)
            try monitor.start()
            let mainThread = getpid()  // the main thread's id is the process's
            Fixture.print(["type": "perf-fds", "when": "before", "count": PerfDescriptors.count()])
            Thread.detachNewThread {
                usleep(600_000)
                Fixture.print(["type": "perf-fds", "when": "during", "count": PerfDescriptors.count()])
            }
            Fixture.after(0.3) { Fixture.truth(name) { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            Fixture.after(1.3) {
                let pending = ProgramSignals.pending(thread: mainThread)
                Fixture.print(["type": "perf-fds", "when": "after", "count": PerfDescriptors.count()])
                Fixture.print([
                    "type": "signals", "program_handled": Int(ProgramSignals.handled),
                    "monitor_handled": Int(stallmon_sampler_handler_runs()),
                    "thread_pending": pending.thread, "process_pending": pending.process,
                ])
            }
            finish(after: 1.5)

        case "signal-default", "signal-ignore", "signal-handler":
            // After start(), the program takes the sampling signal for itself (resets it, ignores
            // it, or handles it); then its loop stalls on the CPU, and later blocked in poll.
            try monitor.start()
            SignalTakeover.take(String(name.dropFirst("signal-".count)))
            Fixture.after(0.3) { Fixture.truth("\(name)-cpu") { Stalls.burnCPU(milliseconds: stallMilliseconds) } }
            Fixture.after(1.3) {
                Fixture.truth("\(name)-blocked") { SyscallStalls.pollEmptyPipe(milliseconds: stallMilliseconds) }
            }
            Fixture.after(2.4) { Fixture.print(["type": "handler", "calls": Int(SignalTakeover.handled)]) }
            finish(after: 2.5)

        default:
            FileHandle.standardError.write(Data("unknown scenario: \(name)\n".utf8))
            exit(64)
        }
    }
}

enum ServiceWork {
    @inline(never)
    static func handleRequest(milliseconds: Int) {
        Stalls.sleepInSyscall(milliseconds: milliseconds)
    }

    /// Never returns: the loop is blocked for good.
    @inline(never)
    static func deadlock() {
        while true { Stalls.sleepInSyscall(milliseconds: 1000) }
    }
}

extension Timer {
    static func scheduledRepeating(every seconds: Double, _ body: @escaping @Sendable () -> Void) {
        let timer = Timer(fire: Date(timeIntervalSinceNow: seconds), interval: seconds, repeats: true) { _ in body() }
        RunLoop.main.add(timer, forMode: .common)
    }
}

enum MainActorWork {
    @MainActor @inline(never)
    static func recompute(milliseconds: Int) {
        Stalls.burnCPU(milliseconds: milliseconds)
    }
}

enum ObserverWork {
    nonisolated(unsafe) static var done = false

    @inline(never)
    static func flush(milliseconds: Int) {
        guard !done else { return }
        done = true
        Stalls.sleepInSyscall(milliseconds: milliseconds)
    }
}

enum EarlyObserverWork {
    nonisolated(unsafe) static var done = false

    /// Blocks the first time only: the observer runs on every pass.
    @inline(never)
    static func prepare(_ name: String, milliseconds: Int) {
        guard !done else { return }
        done = true
        Fixture.truth(name) { Stalls.sleepInSyscall(milliseconds: milliseconds) }
    }
}

enum PerformWork {
    @inline(never)
    static func render(milliseconds: Int) {
        Stalls.burnCPU(milliseconds: milliseconds)
    }
}

enum Source0 {
    static func make() -> CFRunLoopSource {
        var context = CFRunLoopSourceContext()
        context.version = 0
        context.perform = { _ in
            Fixture.truth("source0") { Source0.handle(milliseconds: Scenarios.stallMilliseconds) }
        }
        return CFRunLoopSourceCreate(kCFAllocatorDefault, 0, &context)
    }

    @inline(never)
    static func handle(milliseconds: Int) {
        Stalls.sleepInSyscall(milliseconds: milliseconds)
    }
}

enum NestedLoop {
    @inline(never)
    static func runFor(seconds: Double, mode: RunLoop.Mode) {
        let end = Date(timeIntervalSinceNow: seconds)
        // A mode without sources returns at once: give it a timer to wait for.
        let timer = Timer(fire: end, interval: 0, repeats: false) { _ in }
        RunLoop.current.add(timer, forMode: mode)
        while Date() < end {
            _ = RunLoop.current.run(mode: mode, before: end)
        }
    }
}

enum BusyLoop {
    static func pass(until deadline: Date) {
        guard Date() < deadline else { return }
        Burn.cpu(milliseconds: 0)
        usleep(200)
        DispatchQueue.main.async { pass(until: deadline) }
    }
}
