import Foundation

#if canImport(Glibc)
import Glibc
#endif

extension Process {
    /// Starts the process with no signal blocked, as systemd and shells start services. A child
    /// spawned from one of libdispatch's workers (where tests run) would otherwise inherit their
    /// mask, every real-time signal blocked, and its monitor would find none free to sample with.
    package func runWithEmptySignalMask() throws {
        var empty = sigset_t()
        sigemptyset(&empty)
        var saved = sigset_t()
        pthread_sigmask(SIG_SETMASK, &empty, &saved)
        defer { pthread_sigmask(SIG_SETMASK, &saved, nil) }
        try run()
    }
}
