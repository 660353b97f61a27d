#if canImport(Glibc)
import Glibc
#endif

/// Makes `membarrier(2)` fail with ENOSYS in every thread of the process from now on, as a seccomp
/// filter a service installs would: the monitor must then fall back to fences (filter installed
/// before it starts) or to polling (installed after).
enum MembarrierDenial {
    #if arch(x86_64)
    static let membarrier: UInt32 = 324
    static let seccomp = 317
    #elseif arch(arm64)
    static let membarrier: UInt32 = 283
    static let seccomp = 277
    #endif

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

    static func install() {
        let program: [Instruction] = [
            Instruction(code: 0x20, jumpIfTrue: 0, jumpIfFalse: 0, value: 0),  // ld [nr]
            Instruction(code: 0x15, jumpIfTrue: 0, jumpIfFalse: 1, value: membarrier),  // jeq membarrier
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x0005_0000 | UInt32(ENOSYS)),  // ret errno
            Instruction(code: 0x06, jumpIfTrue: 0, jumpIfFalse: 0, value: 0x7fff_0000),  // ret allow
        ]
        // prctl and syscall are variadic, which Swift cannot call: through plain C pointers.
        typealias Prctl = @convention(c) (Int32, UInt, UInt, UInt, UInt) -> Int32
        typealias Syscall = @convention(c) (Int, Int, Int, UnsafeRawPointer?) -> Int
        guard let prctl = dlsym(nil, "prctl").map({ unsafeBitCast($0, to: Prctl.self) }),
            let syscall = dlsym(nil, "syscall").map({ unsafeBitCast($0, to: Syscall.self) })
        else { fatalError("no prctl or syscall") }
        guard prctl(38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0) == 0 else { fatalError("PR_SET_NO_NEW_PRIVS: \(errno)") }
        let result = program.withUnsafeBufferPointer { instructions in
            var filter = Program(count: UInt16(instructions.count), instructions: instructions.baseAddress!)
            // SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread, not only this one.
            return withUnsafePointer(to: &filter) { syscall(seccomp, 1, 1, $0) }
        }
        guard result == 0 else { fatalError("seccomp: \(result), errno \(errno)") }
    }
}
