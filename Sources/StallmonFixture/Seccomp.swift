import StallmonFixtureKit

/// Makes `membarrier(2)` fail with ENOSYS in every thread of the process from now on, as a seccomp
/// filter a service installs would: the monitor must then fall back to fences (filter installed
/// before it starts) or to polling (installed after).
enum MembarrierDenial {
    #if arch(x86_64)
    static let membarrier: UInt32 = 324
    #elseif arch(arm64)
    static let membarrier: UInt32 = 283
    #endif

    static func install() {
        if let failure = SyscallDenial.install(denying: membarrier, .allThreads) { fatalError(failure) }
    }
}
