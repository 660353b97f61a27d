// The stalls the example services' handlers make on request, each in a function of its own, so
// that a report's frames name it. Each measures itself and answers with what it measured: the
// tests compare that with what stallmon reports.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What a stalling handler measured: how long it ran, when it began, and on which thread.
public struct StallAnswer: Codable, Sendable {
    /// The function that stalled.
    public var handler: String
    /// How long it ran, in microseconds (CLOCK_MONOTONIC).
    public var truthMicroseconds: Double
    /// When it began (CLOCK_MONOTONIC, nanoseconds).
    public var startNanoseconds: UInt64
    /// The kernel's name of the thread it ran on (`NIO-SGLTN-0-#1`, a pool thread's, `main`'s program name).
    public var thread: String
    /// The kernel thread id of that thread.
    public var tid: Int32
    public var mainThread: Bool

    enum CodingKeys: String, CodingKey {
        case handler
        case truthMicroseconds = "truth_us"
        case startNanoseconds = "start_ns"
        case thread, tid
        case mainThread = "main_thread"
    }

    /// One line of JSON.
    public var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }
}

/// Spins on the CPU for `milliseconds` inside an async route handler (a cooperative-pool thread).
@inline(never)
public func spinInHandler(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    var accumulator: UInt64 = 0
    while monotonicNanoseconds() - start < UInt64(milliseconds) * 1_000_000 {
        for index in 0..<10_000 { accumulator = accumulator &* 31 &+ UInt64(index) }
    }
    keep(accumulator)
    return StallAnswer(handler: "spinInHandler(milliseconds:)", start: start)
}

/// Spins on the CPU for `milliseconds` at the bottom of `depth` nested calls of itself, so that the
/// stalled stack is that deep.
@inline(never)
public func spinAtDepth(_ depth: Int, milliseconds: Int) -> StallAnswer {
    guard depth > 1 else { return spinInHandler(milliseconds: milliseconds) }
    let answer = spinAtDepth(depth - 1, milliseconds: milliseconds)
    keep(UInt64(depth))  // work after the call: no tail call
    return answer
}

/// Blocks in `usleep` (`clock_nanosleep`) for `milliseconds` inside an async route handler.
@inline(never)
public func sleepInHandler(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    usleep(UInt32(milliseconds) * 1000)
    return StallAnswer(handler: "sleepInHandler(milliseconds:)", start: start)
}

/// Waits for a mutex that another plain thread holds for `milliseconds`.
@inline(never)
public func waitForLockInHandler(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    let mutex = HeldMutex.held(for: milliseconds)
    pthread_mutex_lock(mutex.pointer)
    pthread_mutex_unlock(mutex.pointer)
    return StallAnswer(handler: "waitForLockInHandler(milliseconds:)", start: start)
}

/// Spins on the CPU for `milliseconds` on the main actor (a handler hops there).
@MainActor
@inline(never)
public func spinOnMainActor(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    var accumulator: UInt64 = 0
    while monotonicNanoseconds() - start < UInt64(milliseconds) * 1_000_000 {
        for index in 0..<10_000 { accumulator = accumulator &* 31 &+ UInt64(index) }
    }
    keep(accumulator)
    return StallAnswer(handler: "spinOnMainActor(milliseconds:)", start: start)
}

/// Spins on the CPU for `milliseconds` in a synchronous route handler, on the event loop itself.
@inline(never)
public func spinOnEventLoop(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    var accumulator: UInt64 = 0
    while monotonicNanoseconds() - start < UInt64(milliseconds) * 1_000_000 {
        for index in 0..<10_000 { accumulator = accumulator &* 31 &+ UInt64(index) }
    }
    keep(accumulator)
    return StallAnswer(handler: "spinOnEventLoop(milliseconds:)", start: start)
}

/// Blocks in `usleep` (`clock_nanosleep`) for `milliseconds` on the event loop itself (a synchronous
/// handler, or a task submitted to the loop): the loop thread sits in a system call, not its wait.
@inline(never)
public func sleepOnEventLoop(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    usleep(UInt32(milliseconds) * 1000)
    return StallAnswer(handler: "sleepOnEventLoop(milliseconds:)", start: start)
}

/// Waits on the event loop itself for a mutex that another plain thread holds for `milliseconds`:
/// the loop thread sits in `futex`.
@inline(never)
public func waitForLockOnEventLoop(milliseconds: Int) -> StallAnswer {
    let start = monotonicNanoseconds()
    let mutex = HeldMutex.held(for: milliseconds)
    pthread_mutex_lock(mutex.pointer)
    pthread_mutex_unlock(mutex.pointer)
    return StallAnswer(handler: "waitForLockOnEventLoop(milliseconds:)", start: start)
}

/// Keeps a spin loop's result alive, so that the optimizer leaves the loop in. Each stalling
/// function spins in its own body: a debug build inlines nothing, and a helper would be the
/// report's frame instead of the function.
@inline(never)
func keep(_ value: UInt64) {
    if value == 1 { FileHandle.standardError.write(Data()) }
}

/// A `pthread_mutex_t` at a stable address, shared by the handler and the thread that holds it.
final class HeldMutex: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<pthread_mutex_t>

    init() {
        pointer = .allocate(capacity: 1)
        pthread_mutex_init(pointer, nil)
    }

    deinit {
        pthread_mutex_destroy(pointer)
        pointer.deallocate()
    }

    func lock() { pthread_mutex_lock(pointer) }
    func unlock() { pthread_mutex_unlock(pointer) }

    /// A mutex that a plain thread (`lock-holder`) has locked by the time this returns, and unlocks
    /// `milliseconds` later. The caller locks it itself, so that its own frame is where it waits.
    static func held(for milliseconds: Int) -> HeldMutex {
        let mutex = HeldMutex()
        let held = DispatchSemaphore(value: 0)
        let holder = Thread {
            mutex.lock()
            held.signal()
            usleep(UInt32(milliseconds) * 1000)
            mutex.unlock()
        }
        holder.name = "lock-holder"
        holder.start()
        held.wait()
        return mutex
    }
}

extension StallAnswer {
    /// Measured now, from `start`, on the calling thread.
    public init(handler: String, start: UInt64) {
        let end = monotonicNanoseconds()
        self.init(
            handler: handler, truthMicroseconds: Double(end - start) / 1000, startNanoseconds: start,
            thread: currentThreadName(), tid: currentThreadID(), mainThread: Thread.isMainThread)
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock stallmon's reports use.
public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// The kernel's name of the calling thread (`/proc/thread-self/comm`).
func currentThreadName() -> String {
    let name = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
    return name?.trimmingCharacters(in: .newlines) ?? ""
}

/// The kernel's id of the calling thread: `/proc/thread-self` links to `<pid>/task/<tid>`. (Glibc's
/// `gettid` needs `_GNU_SOURCE`, which Swift's Glibc module does not define.)
func currentThreadID() -> Int32 {
    var target = [CChar](repeating: 0, count: 64)
    let length = readlink("/proc/thread-self", &target, target.count - 1)
    guard length > 0 else { return 0 }
    let path = String(decoding: target.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return path.split(separator: "/").last.flatMap { Int32($0) } ?? 0
}
