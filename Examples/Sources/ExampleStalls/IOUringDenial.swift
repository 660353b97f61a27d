// io_uring denied, for a service run under valgrind: valgrind holds its lock while a thread waits in
// io_uring_enter(2), so a process whose watchdog waits there hangs. With io_uring_setup(2) failing,
// stallmon's event-loop watchdog looks at idle loops once per threshold instead.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum IOUringDenial {
    /// `io_uring_setup(2)`: 425 on x86_64 and arm64 alike.
    static let ioUringSetup: UInt32 = 425

    /// One BPF instruction (`struct sock_filter`).
    struct Instruction {
        var code: UInt16
        var jumpIfTrue: UInt8
        var jumpIfFalse: UInt8
        var value: UInt32
    }

    /// `struct sock_fprog`.
    struct Program {
        var count: UInt16
        var instructions: UnsafePointer<Instruction>
    }

    /// From now on `io_uring_setup` fails with ENOSYS in the calling thread and the threads it
    /// starts afterwards (prctl's filter: valgrind has no seccomp(2)). Call it first thing in
    /// `main()`, before any other thread starts. Returns why the filter could not be installed, or `nil`.
    public static func install() -> String? {
        let program: [Instruction] = [
            Instruction(code: 0x20, jumpIfTrue: 0, jumpIfFalse: 0, value: 0),  // ld [nr]
            Instruction(code: 0x15, jumpIfTrue: 0, jumpIfFalse: 1, value: ioUringSetup),  // jeq io_uring_setup
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x0005_0000 | UInt32(ENOSYS)),  // ret errno
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x7fff_0000),  // ret allow
        ]
        // prctl is variadic, which Swift cannot call: through a plain C pointer.
        typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32
        guard let prctl = dlsym(nil, "prctl").map({ unsafeBitCast($0, to: Prctl.self) }) else { return "no prctl" }
        guard prctl(38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0) == 0 else { return "PR_SET_NO_NEW_PRIVS: errno \(errno)" }
        let result = program.withUnsafeBufferPointer { instructions in
            var filter = Program(count: UInt16(instructions.count), instructions: instructions.baseAddress!)
            return withUnsafePointer(to: &filter) { filter in
                prctl(22 /* PR_SET_SECCOMP */, 2 /* SECCOMP_MODE_FILTER */, UInt(bitPattern: filter), 0, 0)
            }
        }
        return result == 0 ? nil : "PR_SET_SECCOMP: errno \(errno)"
    }
}
