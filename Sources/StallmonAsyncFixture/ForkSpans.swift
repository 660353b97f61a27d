import CStallCapture
import Foundation
import StallMonitorTracing
import StallmonFixtureKit
import Synchronization
import Tracing

#if canImport(Glibc)
import Glibc
#endif

/// The `pool-forks` scenario: `fork()` in a loop, from a task on the cooperative pool, while spans
/// start and end on other threads and a stalled main actor is sampled. Each child starts spans
/// itself and checks the pool's slots, then `_exit`s; the parent waits for it at most a second.
/// One line (`type` "forks"): the children `forked`, those that `exited` 0, those that `failed`
/// (their exit status: 3, a pool slot that names a thread the child does not have), and those that
/// `hung` (killed after the second; the loop stops after three).
///
/// Spans in flight: `StallmonTracer` spans with attributes in two tasks (an attribute is kept under
/// the slot's lock), and on a thread of its own, spans of the C table under eight keys that end as
/// a stalled span ends (under the slot's lock, held a while, as a reader's copy holds it). The
/// children start spans under the same eight keys, and one of their own thread's.
enum ForkSpans {
    /// The thread-like keys (odd) of the C spans, which the children take up.
    static let keys = 8
    @inline(__always) static func key(_ index: Int) -> UInt64 { 0x5_1001 + UInt64(index) * 2 }

    static func run(seconds: Double) async {
        let end = Fixture.now() + UInt64(seconds * 1e9)
        let spans = Thread { cSpans(until: end) }
        spans.start()
        let tracer = StallmonTracer()
        for index in 0..<2 {
            Task.detached { await tracerSpans(tracer, index, until: end) }
        }
        let forks = Task.detached { await forkLoop(until: end) }
        // The main actor stalls on the CPU meanwhile: sampled every 10 ms.
        await MainActor.run {
            Fixture.truth("main-actor-cpu") { AsyncWork.recompute(milliseconds: Int(seconds * 1000)) }
        }
        let count = await forks.value
        Fixture.print([
            "type": "forks", "forked": count.forked, "exited": count.exited, "failed": count.failed.map(Int.init),
            "hung": count.hung, "hung_state": count.hungState,
        ])
    }

    struct Count: Sendable {
        var forked = 0
        var exited = 0
        var failed: [Int32] = []
        var hung = 0
        var hungState: [String] = []
    }

    /// What a hung child is doing: its state and its system call, as /proc shows them.
    static func state(of pid: pid_t) -> String {
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        let syscall = (try? String(contentsOfFile: "/proc/\(pid)/syscall", encoding: .utf8)) ?? ""
        return "\(stat.split(separator: " ").dropFirst(2).first ?? "?") \(syscall)"
    }

    /// Spans of the C table, each ended under its slot's lock, held about 50 µs.
    static func cSpans(until end: UInt64) {
        var round = 0
        while Fixture.now() < end {
            var sequence: UInt64 = 0
            var parts: UnsafeMutableRawPointer? = nil
            let slot = stallmon_request_register(key(round % keys), 0, &sequence, &parts)
            round += 1
            guard slot >= 0 else { continue }
            stallmon_request_publish(slot, sequence)
            stallmon_request_lock(slot)
            _ = stallmon_request_withdraw(slot, sequence)
            let held = Fixture.now() + 50_000
            while Fixture.now() < held {}
            stallmon_request_unlock(slot)
        }
    }

    /// Spans of `StallmonTracer`, with an attribute each, back to back.
    static func tracerSpans(_ tracer: StallmonTracer, _ index: Int, until end: UInt64) async {
        var round = 0
        while Fixture.now() < end {
            tracer.withSpan("GET /fork/\(index)", ofKind: .server) { span in
                span.attributes["http.route"] = "/fork/\(round)"
            }
            round += 1
            await Task.yield()
        }
    }

    static func forkLoop(until end: UInt64) async -> Count {
        var count = Count()
        while Fixture.now() < end && count.hung < 3 {
            let pid = fork()
            if pid == 0 { _exit(child()) }
            guard pid > 0 else { break }
            count.forked += 1
            switch wait(for: pid, seconds: 1) {
            case nil:
                count.hung += 1
                count.hungState.append(state(of: pid))
                kill(pid, SIGKILL)
                _ = wait(for: pid, seconds: 5)
            case 0?: count.exited += 1
            case let status?: count.failed.append(status)
            }
            await Task.yield()
        }
        return count
    }

    /// The exit status of child `pid` (a signal's number + 128), or `nil` if it has not exited
    /// within `seconds`.
    static func wait(for pid: pid_t, seconds: Double) -> Int32? {
        let deadline = Fixture.now() + UInt64(seconds * 1e9)
        var status: Int32 = 0
        while Fixture.now() < deadline {
            if waitpid(pid, &status, WNOHANG) == pid {
                let signal = status & 0x7f
                return signal == 0 ? (status >> 8) & 0xff : 128 + signal
            }
            usleep(200)
        }
        return nil
    }

    /// In the child, on its one thread: C calls only, and no generic code (another thread may have
    /// held the Swift runtime's metadata locks at the fork: a `for` over a range, instantiated here
    /// first, waited on them). Returns the exit status.
    static func child() -> Int32 {
        // Spans under the keys the parent's thread was using, and one of this thread's own (its
        // task's: the fork was made in one).
        var index = 0
        while index < keys {
            defer { index += 1 }
            var sequence: UInt64 = 0
            var parts: UnsafeMutableRawPointer? = nil
            let slot = stallmon_request_register(key(index), 0, &sequence, &parts)
            if slot >= 0 {
                stallmon_request_publish(slot, sequence)
                _ = stallmon_request_withdraw(slot, sequence)
            }
        }
        var key: UInt64 = 0
        var around = stallmon_request_found()
        var sequence: UInt64 = 0
        var parts: UnsafeMutableRawPointer? = nil
        let slot = stallmon_request_register_current(&key, &around, &sequence, &parts)
        if slot >= 0 {
            stallmon_request_publish(slot, sequence)
            _ = stallmon_request_withdraw(slot, sequence)
        }
        // The pool's slots name no thread but this one, and no job runs but this one's.
        let me = stallmon_gettid()
        var slotIndex: Int32 = 0
        while slotIndex < stallmon_pool_slot_count() {
            defer { slotIndex += 1 }
            var job = stallmon_pool_job()
            while stallmon_pool_read(slotIndex, &job) == 0 {}
            if job.tid != 0 && job.tid != me { return 3 }
            if job.tid == 0 && job.start_ns != 0 { return 3 }
        }
        return 0
    }
}
