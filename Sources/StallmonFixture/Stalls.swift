import CoreFoundation
import Foundation
import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

/// The ways the fixture blocks its loop. Each is its own non-inlined function, so that tests can
/// look for it by name (and file:line) in the reported stack.
enum Stalls {
    /// Burns CPU (FNV hashing) for `milliseconds`.
    @inline(never)
    static func burnCPU(milliseconds: Int) {
        let end = monotonicMilliseconds() + Double(milliseconds)
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while monotonicMilliseconds() < end {
            for byte in 0..<UInt64(4096) {
                hash = (hash ^ byte) &* 0x100_0000_01b3
            }
        }
        blackHole(hash)
    }

    /// Sleeps in a system call (`poll` with no descriptors) for `milliseconds`.
    @inline(never)
    static func sleepInSyscall(milliseconds: Int) {
        let end = monotonicMilliseconds() + Double(milliseconds)
        while true {
            let left = end - monotonicMilliseconds()
            if left <= 0 { break }
            _ = poll(nil, 0, Int32(left.rounded(.up)))
        }
    }

    /// Waits for `lock`, which another thread holds.
    @inline(never)
    static func waitForLock(_ lock: NSLock) {
        lock.lock()
        lock.unlock()
    }

    /// Allocates, frees, locks and writes for `milliseconds`: the sampler must interrupt it inside
    /// malloc, with a lock held, and inside system calls, and never deadlock.
    @inline(never)
    static func churnMallocLocksAndSyscalls(milliseconds: Int) {
        let end = monotonicMilliseconds() + Double(milliseconds)
        let lock = NSLock()
        let devNull = open("/dev/null", O_WRONLY)
        defer { close(devNull) }
        var total = 0
        while monotonicMilliseconds() < end {
            lock.lock()
            for size in stride(from: 16, to: 4096, by: 64) {
                let pointer = malloc(size)!
                memset(pointer, 1, size)
                total &+= Int(pointer.load(as: UInt8.self))
                free(pointer)
            }
            lock.unlock()
            var byte: UInt8 = 0
            _ = write(devNull, &byte, 1)
        }
        blackHole(UInt64(total))
    }

    /// Burns CPU like ``burnCPU(milliseconds:)`` and returns how long, in nanoseconds, the thread
    /// was stopped meanwhile: the wall time it was neither on a CPU nor waiting for one (its
    /// schedstat, read while it runs, so that both readings are up to date).
    @inline(never)
    static func burnCPUNotingStops(milliseconds: Int) -> UInt64 {
        let startWall = monotonicMilliseconds()
        let startRunnable = runnableMilliseconds()
        burnCPU(milliseconds: milliseconds)
        let runnable = runnableMilliseconds() - startRunnable
        let wall = monotonicMilliseconds() - startWall
        return UInt64(max(0, wall - runnable) * 1_000_000)
    }

    /// Walks the loaded images over and over for `milliseconds`: glibc's dl_iterate_phdr takes and
    /// releases the dynamic loader's lock each time, so a sample often lands inside that lock's own
    /// lock or unlock. Returns how many walks it made.
    @inline(never)
    static func walkLoadedImages(milliseconds: Int) -> Int {
        // dl_iterate_phdr(3), which the Glibc module does not declare.
        typealias Visit = @convention(c) (UnsafeMutableRawPointer?, Int, UnsafeMutableRawPointer?) -> Int32
        typealias Iterate = @convention(c) (Visit, UnsafeMutableRawPointer?) -> Int32
        let iterate = unsafeBitCast(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "dl_iterate_phdr"), to: Iterate.self)
        let end = monotonicMilliseconds() + Double(milliseconds)
        var walks = 0
        while monotonicMilliseconds() < end {
            for _ in 0..<64 { _ = iterate({ _, _, _ in 0 }, nil) }
            walks += 64
        }
        return walks
    }

    /// Loads and unloads a library over and over for `milliseconds` (dlopen and dlclose map and
    /// unmap it under the dynamic loader's lock). Returns how many times it loaded it.
    @inline(never)
    static func loadAndUnloadLibrary(milliseconds: Int) -> Int {
        let end = monotonicMilliseconds() + Double(milliseconds)
        var loads = 0
        while monotonicMilliseconds() < end {
            guard let library = dlopen("libutil.so.1", RTLD_NOW | RTLD_LOCAL) else { break }
            dlclose(library)
            loads += 1
        }
        return loads
    }

    /// On a CPU plus waiting for one, from /proc/thread-self/schedstat.
    static func runnableMilliseconds() -> Double {
        let text = (try? String(contentsOfFile: "/proc/thread-self/schedstat", encoding: .utf8)) ?? ""
        let fields = text.split(separator: " ").prefix(2).compactMap { Double($0) }
        return fields.reduce(0, +) / 1_000_000
    }

    @inline(never)
    static func blackHole(_ value: UInt64) {
        if value == 42 { print("") }
    }

    static func monotonicMilliseconds() -> Double { Fixture.milliseconds() }
}
