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
