import Foundation
import StallmonFixtureKit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One thread per CPU that spins for `busy` seconds out of every `period`, at a real-time priority
/// when the process may set one (root), so that every other thread on the machine waits for a CPU
/// meanwhile.
final class CPUHogs: Sendable {
    private let running = Atomic<Bool>(true)
    private let finished = DispatchGroup()

    init(busy: Double, period: Double) {
        for _ in 0..<ProcessInfo.processInfo.activeProcessorCount {
            finished.enter()
            let thread = Thread { [self] in
                var parameters = sched_param(sched_priority: 10)
                _ = pthread_setschedparam(pthread_self(), SCHED_FIFO, &parameters)
                while running.load(ordering: .relaxed) {
                    Burn.cpu(milliseconds: busy * 1000)
                    usleep(UInt32((period - busy) * 1e6))
                }
                finished.leave()
            }
            thread.name = "cpu-hog"
            thread.start()
        }
    }

    func stop() {
        running.store(false, ordering: .relaxed)
        finished.wait()
    }
}
