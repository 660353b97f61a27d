import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

/// A system call the fixture makes fail in every thread of the process from now on, as a seccomp
/// filter a service (or its container runtime) installs would.
enum DeniedCall {
    /// `membarrier(2)`, with ENOSYS: the monitor must then fall back to fences (filter installed
    /// before it starts) or to polling (installed after).
    case membarrier
    /// `perf_event_open(2)`, with EPERM, as Docker's default profile refuses it: the monitor must
    /// then sample with the signal.
    case perfEventOpen

    private var number: UInt32 {
        #if arch(x86_64)
        switch self {
        case .membarrier: 324
        case .perfEventOpen: 298
        }
        #elseif arch(arm64)
        switch self {
        case .membarrier: 283
        case .perfEventOpen: 241
        }
        #endif
    }

    private var error: Int32 {
        switch self {
        case .membarrier: ENOSYS
        case .perfEventOpen: EPERM
        }
    }

    func install() {
        if let failure = SyscallDenial.install(denying: number, .allThreads, error: error) { fatalError(failure) }
    }
}
