import CoreFoundation
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The demo's service: three pieces of main-thread work that stall its loop in three ways.
enum DemoService {
    /// Busy on the CPU inside a timer callout.
    @inline(never)
    static func refreshCache(milliseconds: Int) {
        let end = Date(timeIntervalSinceNow: Double(milliseconds) / 1000)
        var digest: UInt64 = 0xcbf2_9ce4_8422_2325
        var bytes = [UInt8](repeating: 0, count: 4096)
        while Date() < end {
            for index in bytes.indices {
                digest = (digest ^ UInt64(bytes[index])) &* 0x100_0000_01b3
                bytes[index] = UInt8(truncatingIfNeeded: digest)
            }
        }
        if digest == 42 { print(digest) }
    }

    /// Blocked in a system call inside a main-queue block.
    @inline(never)
    static func readConfiguration(milliseconds: Int) {
        var request = timespec(tv_sec: milliseconds / 1000, tv_nsec: (milliseconds % 1000) * 1_000_000)
        var remaining = timespec()
        while nanosleep(&request, &remaining) != 0, errno == EINTR { request = remaining }
    }

    /// Waiting for a lock another thread holds.
    @inline(never)
    static func updateSharedState(_ lock: NSLock) {
        lock.lock()
        lock.unlock()
    }
}
