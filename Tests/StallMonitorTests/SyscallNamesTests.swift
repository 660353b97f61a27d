import Testing

@testable import StallMonitor

/// The system call tables of both architectures, whichever this test runs on: a report names the
/// call a stalled thread sits in, on x86_64 servers and on arm64 ones (Graviton, Ampere) alike.
struct SyscallNamesTests {
    @Test(arguments: [
        (0, "read"), (7, "poll"), (35, "nanosleep"), (202, "futex"), (230, "clock_nanosleep"), (232, "epoll_wait"),
        (270, "pselect6"), (271, "ppoll"), (281, "epoll_pwait"), (426, "io_uring_enter"), (441, "epoll_pwait2"),
    ])
    func x86_64NamesTheCallsStalledThreadsSitIn(number: Int, name: String) {
        #expect(SyscallNames.name(number, in: SyscallNames.x86_64) == name)
    }

    @Test(arguments: [
        (22, "epoll_pwait"), (56, "openat"), (63, "read"), (72, "pselect6"), (73, "ppoll"), (79, "newfstatat"),
        (98, "futex"), (101, "nanosleep"), (115, "clock_nanosleep"), (203, "connect"), (207, "recvfrom"),
        (426, "io_uring_enter"), (441, "epoll_pwait2"),
    ])
    func aarch64NamesTheCallsStalledThreadsSitIn(number: Int, name: String) {
        #expect(SyscallNames.name(number, in: SyscallNames.aarch64) == name)
    }

    @Test func unknownNumbersAreNamedByNumber() {
        for table in [SyscallNames.x86_64, SyscallNames.aarch64] {
            #expect(SyscallNames.name(-1, in: table) == "syscall -1")
            #expect(SyscallNames.name(100_000, in: table) == "syscall 100000")
        }
        #expect(SyscallNames.name(410, in: SyscallNames.aarch64) == "syscall 410", "a 32-bit-only number")
        #if arch(x86_64)
        #expect(SyscallNames.name(232) == "epoll_wait")
        #elseif arch(arm64)
        #expect(SyscallNames.name(22) == "epoll_pwait")
        #endif
    }
}
