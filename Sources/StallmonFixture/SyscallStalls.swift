import Foundation
import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

/// Stalls inside one system call that a signal handler would end with EINTR (signal(7): these
/// never restart, whatever SA_RESTART says). Each makes exactly one call and prints what it
/// returned, so that a test sees whether the monitor changed the program's behaviour.
enum SyscallStalls {
    /// `usleep`, which glibc implements with `clock_nanosleep`.
    @inline(never)
    static func sleepWithUsleep(milliseconds: Int) {
        let start = Stalls.monotonicMilliseconds()
        let result = usleep(UInt32(milliseconds) * 1000)
        record("usleep", result: result, errno: errno, start: start)
    }

    /// `poll` on the read end of a pipe nobody writes to.
    @inline(never)
    static func pollEmptyPipe(milliseconds: Int) {
        var descriptors: [Int32] = [0, 0]
        guard pipe(&descriptors) == 0 else { fatalError("pipe: \(errno)") }
        defer {
            close(descriptors[0])
            close(descriptors[1])
        }
        var entry = pollfd(fd: descriptors[0], events: Int16(POLLIN), revents: 0)
        let start = Stalls.monotonicMilliseconds()
        let result = poll(&entry, 1, Int32(milliseconds))
        record("poll", result: result, errno: errno, start: start)
    }

    /// `epoll_wait` on an epoll instance watching an empty pipe, as an event loop waits. Glibc's
    /// module map leaves out `sys/epoll.h`: the calls go through `dlsym`, and `struct epoll_event`
    /// (packed on x86_64: 4 bytes of events, 8 of data) is spelled out as bytes.
    @inline(never)
    static func waitInEpoll(milliseconds: Int) {
        typealias Create = @convention(c) (Int32) -> Int32
        typealias Control = @convention(c) (Int32, Int32, Int32, UnsafeMutableRawPointer?) -> Int32
        typealias Wait = @convention(c) (Int32, UnsafeMutableRawPointer?, Int32, Int32) -> Int32
        guard let create = dlsym(nil, "epoll_create1").map({ unsafeBitCast($0, to: Create.self) }),
            let control = dlsym(nil, "epoll_ctl").map({ unsafeBitCast($0, to: Control.self) }),
            let wait = dlsym(nil, "epoll_wait").map({ unsafeBitCast($0, to: Wait.self) })
        else { fatalError("no epoll in the C library") }
        var descriptors: [Int32] = [0, 0]
        guard pipe(&descriptors) == 0 else { fatalError("pipe: \(errno)") }
        let epoll = create(0o2_000_000)  // EPOLL_CLOEXEC
        guard epoll >= 0 else { fatalError("epoll_create1: \(errno)") }
        defer {
            close(epoll)
            close(descriptors[0])
            close(descriptors[1])
        }
        var interest = [UInt8](repeating: 0, count: 16)
        interest[0] = 1  // EPOLLIN
        guard control(epoll, 1 /* EPOLL_CTL_ADD */, descriptors[0], &interest) == 0 else {
            fatalError("epoll_ctl: \(errno)")
        }
        var ready = [UInt8](repeating: 0, count: 16)
        let start = Stalls.monotonicMilliseconds()
        let result = wait(epoll, &ready, 1, Int32(milliseconds))
        record("epoll_wait", result: result, errno: errno, start: start)
    }

    /// `usleep(microseconds)` over and over for `seconds`; prints how many calls ended with EINTR.
    @inline(never)
    static func sleepInShortSteps(seconds: Double, microseconds: Int) {
        let end = Stalls.monotonicMilliseconds() + seconds * 1000
        var calls = 0
        var interrupted = 0
        while Stalls.monotonicMilliseconds() < end {
            calls += 1
            if usleep(UInt32(microseconds)) != 0, errno == EINTR { interrupted += 1 }
        }
        Fixture.print(["type": "short-sleeps", "calls": calls, "eintr": interrupted])
    }

    private static func record(_ call: String, result: Int32, errno error: Int32, start: Double) {
        let elapsed = Stalls.monotonicMilliseconds() - start
        Fixture.print([
            "type": "syscall", "call": call, "result": Int(result), "errno": result < 0 ? Int(error) : 0,
            "elapsed_ms": elapsed,
        ])
    }
}

/// A program that takes the monitor's sampling signal for itself after the monitor started.
enum SignalTakeover {
    nonisolated(unsafe) static var handled: Int32 = 0

    /// The signal the monitor picks by default (SIGRTMAX-4: nothing else in the fixture owns one).
    static var samplingSignal: Int32 { __libc_current_sigrtmax() - 4 }

    /// `default`, `ignore` or `handler`.
    static func take(_ how: String) {
        var action = sigaction()
        sigemptyset(&action.sa_mask)
        switch how {
        case "default": action.__sigaction_handler.sa_handler = SIG_DFL
        case "ignore": action.__sigaction_handler.sa_handler = SIG_IGN
        default: action.__sigaction_handler.sa_handler = { _ in SignalTakeover.handled &+= 1 }
        }
        guard sigaction(samplingSignal, &action, nil) == 0 else { fatalError("sigaction: \(errno)") }
    }
}

/// Handlers of the program's own on SIGPROF and the real-time signals, counting what they take:
/// a stall sampled by perf events must send none of them.
enum ProgramSignals {
    nonisolated(unsafe) static var handled: Int32 = 0

    /// Handles SIGPROF and every real-time signal but `spared` (left to the monitor).
    static func install(sparing spared: Int32) {
        var action = sigaction()
        sigemptyset(&action.sa_mask)
        action.__sigaction_handler.sa_handler = { _ in ProgramSignals.handled &+= 1 }
        for signal in [SIGPROF] + Array(__libc_current_sigrtmin()...__libc_current_sigrtmax()) where signal != spared {
            guard sigaction(signal, &action, nil) == 0 else { fatalError("sigaction \(signal): \(errno)") }
        }
    }

    /// The signals pending for thread `tid` and for the process, from its status file.
    static func pending(thread tid: pid_t) -> (thread: String, process: String) {
        let status = (try? String(contentsOfFile: "/proc/self/task/\(tid)/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> String {
            status.split(separator: "\n").first { $0.hasPrefix(name) }.map {
                $0.dropFirst(name.count).trimmingCharacters(in: .whitespaces)
            } ?? "?"
        }
        return (field("SigPnd:"), field("ShdPnd:"))
    }
}

/// The perf event descriptors the process has open (`anon_inode:[perf_event]` in /proc/self/fd).
enum PerfDescriptors {
    static func count() -> Int {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return names.filter { name in
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"))
                == "anon_inode:[perf_event]"
        }.count
    }
}
