import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

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

/// Makes `perf_event_open(2)` fail with EPERM in every thread of the process, as Docker's default
/// seccomp profile does: the monitor must then sample with the signal.
enum PerfDenial {
    #if arch(x86_64)
    static let perfEventOpen: UInt32 = 298
    #elseif arch(arm64)
    static let perfEventOpen: UInt32 = 241
    #endif

    static func install() {
        if let failure = SyscallDenial.install(denying: perfEventOpen, .allThreads, error: EPERM) {
            fatalError(failure)
        }
    }
}
