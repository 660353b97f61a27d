// A seccomp filter that makes one system call fail with ENOSYS, as a filter a service installs
// would: the fixtures deny membarrier(2) and io_uring_setup(2) with it.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

package enum SyscallDenial {
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

    /// How the filter is installed.
    package enum Scope {
        /// seccomp(2) with SECCOMP_FILTER_FLAG_TSYNC: every thread of the process.
        case allThreads
        /// prctl(PR_SET_SECCOMP): the calling thread and the threads it starts afterwards (for
        /// valgrind, which has no seccomp(2)).
        case thisThreadAndItsChildren
    }

    #if arch(x86_64)
    static let seccomp = 317
    #elseif arch(arm64)
    static let seccomp = 277
    #endif

    /// From now on `number` fails with `error` (ENOSYS unless said); every other call is allowed.
    /// Returns why the filter could not be installed, or `nil`.
    package static func install(denying number: UInt32, _ scope: Scope, error: Int32 = ENOSYS) -> String? {
        let program: [Instruction] = [
            Instruction(code: 0x20, jumpIfTrue: 0, jumpIfFalse: 0, value: 0),  // ld [nr]
            Instruction(code: 0x15, jumpIfTrue: 0, jumpIfFalse: 1, value: number),  // jeq number
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x0005_0000 | UInt32(error)),  // ret errno
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x7fff_0000),  // ret allow
        ]
        // prctl and syscall are variadic, which Swift cannot call: through plain C pointers.
        typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32
        typealias Syscall = @convention(c) (Int, Int, Int, UnsafeRawPointer?) -> Int
        guard let prctl = dlsym(nil, "prctl").map({ unsafeBitCast($0, to: Prctl.self) }),
            let syscall = dlsym(nil, "syscall").map({ unsafeBitCast($0, to: Syscall.self) })
        else { return "no prctl or syscall" }
        guard prctl(38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0) == 0 else { return "PR_SET_NO_NEW_PRIVS: errno \(errno)" }
        let result = program.withUnsafeBufferPointer { instructions in
            var filter = Program(count: UInt16(instructions.count), instructions: instructions.baseAddress!)
            return withUnsafePointer(to: &filter) { filter in
                switch scope {
                case .allThreads:
                    // SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC.
                    return syscall(seccomp, 1, 1, filter)
                case .thisThreadAndItsChildren:
                    return Int(
                        prctl(22 /* PR_SET_SECCOMP */, 2 /* SECCOMP_MODE_FILTER */, UInt(bitPattern: filter), 0, 0))
                }
            }
        }
        guard result == 0 else {
            return scope == .allThreads ? "seccomp: \(result), errno \(errno)" : "PR_SET_SECCOMP: errno \(errno)"
        }
        return nil
    }
}
