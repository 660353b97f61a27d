import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// The example services of Examples/ (Hummingbird, Vapor and gRPC on their defaults, adopting
    /// stallmon with `startService()` as the README shows) as child processes, built by `swift build
    /// --package-path Examples` (CI does, before the tests; without the binaries these tests skip,
    /// unless `REQUIRE_TEST_TOOLS=1`). Each handler stalls 400 ms under a 200 ms threshold (100 ms for
    /// pool jobs); curl drives them over loopback and the reports are read back from a real journald.
    @Suite
    struct FrameworkServiceTests {
        static let stallMilliseconds = 400
        /// A reported duration within this below and above what the handler measured itself: the
        /// job or the tick around the handler adds a little (routing, the response), the heartbeat
        /// of an event loop at most a fraction of the threshold.
        static let below = 20.0
        static let above = 60.0

        /// What a stall is reported on.
        enum Loop: Sendable, CustomStringConvertible {
            /// A job of Swift's cooperative pool: `STALL_LOOP=cooperative-pool`.
            case pool
            /// The main actor, drained on the main thread: `STALL_LOOP=main`.
            case mainActor
            /// An event loop of `MultiThreadedEventLoopGroup.singleton`: `STALL_LOOP` is its thread's name.
            case eventLoop

            var description: String {
                switch self {
                case .pool: "cooperative-pool"
                case .mainActor: "main"
                case .eventLoop: "event loop"
                }
            }
        }

        struct Stall: Sendable, CustomStringConvertible {
            /// The route (HTTP) or method (gRPC).
            var request: String
            var function: String
            var loop: Loop
            /// The system call a blocked handler waits in; `nil` for one on the CPU.
            var syscalls: [String]? = nil

            var description: String { "\(request) (\(function))" }
        }

        static let cpu = Stall(request: "/cpu", function: "spinInHandler(milliseconds:)", loop: .pool)
        static let sleep = Stall(
            request: "/sleep", function: "sleepInHandler(milliseconds:)", loop: .pool,
            syscalls: ["clock_nanosleep", "nanosleep"])
        static let lock = Stall(
            request: "/lock", function: "waitForLockInHandler(milliseconds:)", loop: .pool, syscalls: ["futex"])
        static let mainActor = Stall(
            request: "/main-actor", function: "spinOnMainActor(milliseconds:)", loop: .mainActor)
        static let syncHandler = Stall(
            request: "/sync-cpu", function: "spinOnEventLoop(milliseconds:)", loop: .eventLoop)

        /// The monitor's configuration for every service: lower thresholds. The pool is watched
        /// as `startService()` watches it by default (`cooperative_pool` "auto").
        static let environment = [
            "STALLMON_THRESHOLD_MS": "200",
            "STALLMON_COOPERATIVE_POOL_THRESHOLD_MS": "100",
        ]

        @Test(.requires(.example(.hummingbird)))
        func hummingbirdHandlerStallsAreEachReportedOnceAndIdleWakesNoWatchdogOfItsOwn() throws {
            try checkStalls(of: .hummingbird, [Self.cpu, Self.sleep, Self.lock, Self.mainActor])
        }

        @Test(.requires(.example(.vapor))) func vaporHandlerStallsAreEachReportedOnceAndIdleWakesNoWatchdogOfItsOwn()
            throws
        {
            try checkStalls(of: .vapor, [Self.cpu, Self.sleep, Self.lock, Self.mainActor, Self.syncHandler])
        }

        @Test(.requires(.example(.grpc))) func grpcHandlerStallsAreEachReportedOnceAndIdleWakesNoWatchdogOfItsOwn()
            throws
        {
            let grpc = [
                Stall(request: "Cpu", function: Self.cpu.function, loop: .pool),
                Stall(request: "Sleep", function: Self.sleep.function, loop: .pool, syscalls: Self.sleep.syscalls),
                Stall(request: "Lock", function: Self.lock.function, loop: .pool, syscalls: Self.lock.syscalls),
            ]
            try checkStalls(of: .grpc, grpc)
        }

        /// NIO's singleton event loops installed as Swift Concurrency's global executor (Vapor's
        /// template did so in 2024), before or after `startService()` in `main()`'s synchronous
        /// part. The service keeps them either way: the async handler runs inside a tick of a
        /// singleton loop, and its stall is that loop's, reported once (the pool, whose hook NIO's
        /// replaces, goes unwatched).
        @Test(.requires(.example(.vaporFixture)), arguments: ["before", "after"])
        func vaporWithNIOAsTheGlobalExecutorReportsAnAsyncHandlerStallOnItsEventLoopOnce(takeover: String) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let binary = try FrameworkService.requiredBinary(.vaporFixture)
            let service = try FrameworkService(
                .vaporFixture, binary: binary,
                environment: Self.environment.merging(["EXAMPLE_NIO_TAKEOVER": takeover]) { $1 }
            )
            defer { service.stop() }
            let line = try #require(service.lines.first { $0["event"] as? String == "nio-takeover" })
            let installed = try #require(line["installed"] as? Bool)
            #expect(installed, "NIO as the global executor, installed \(takeover) startService(), did not go in")
            let answer = try FrameworkService.Answer(service.get("/cpu?ms=\(Self.stallMilliseconds)"))
            // Where NIO's hook did not go in, the handler ran on the pool: its report is the pool's.
            let stall = Stall(request: "/cpu", function: Self.cpu.function, loop: installed ? .eventLoop : .pool)
            try checkReports(of: service, [(stall, answer)])
            // One warning at start, on the monitor's logger (Vapor's console logger, on standard
            // output): the pool goes unwatched, and what covers its jobs instead.
            let warnings = service.outputSoFar.split(separator: "\n").filter {
                $0.contains("stallmon does not watch the cooperative pool")
            }
            #expect(warnings.count == 1, "\(service.outputSoFar)")
            #expect(warnings.first?.contains("inside the ticks of MultiThreadedEventLoopGroup.singleton") == true)
        }

        /// Makes each stall once, in order, and checks its reports; then 10 s of idle.
        func checkStalls(of kind: FrameworkService.Kind, _ stalls: [Stall]) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let binary = try FrameworkService.requiredBinary(kind)
            let service = try FrameworkService(kind, binary: binary, environment: Self.environment)
            defer { service.stop() }
            let answers = try stalls.map { stall in
                let body =
                    kind == .grpc
                    ? try service.call(stall.request, milliseconds: Self.stallMilliseconds)
                    : try service.get("\(stall.request)?ms=\(Self.stallMilliseconds)")
                return try FrameworkService.Answer(body)
            }
            try checkReports(of: service, Array(zip(stalls, answers)))
            try checkIdle(service)
        }

        /// Each stall reported once (one `STALL_ID`: its detected and its ended entry), in order,
        /// on the loop it ran on, with its function among the frames and its true duration.
        func checkReports(of service: FrameworkService, _ stalls: [(Stall, FrameworkService.Answer)]) throws {
            let count = stalls.count
            _ = try service.entries(MessageID.stallEnded, atLeast: count)
            // Whatever else would come: a second report of one stall, or one of something else.
            let ended = try service.entries(MessageID.stallEnded, atLeast: count + 1, timeout: 1.5)
            let detected = try service.entries(MessageID.stallDetected, atLeast: count + 1, timeout: 0.5)
            let summary = ended.map {
                "\($0["STALL_LOOP"] ?? "?") \($0["STALL_DURATION_USEC"] ?? "?") µs: \($0["STALL_FRAME"] ?? "")"
            }
            #expect(ended.count == count, "\(service.kind): \(ended.count) reports of \(count) stalls: \(summary)")
            #expect(detected.count == count, "\(service.kind): \(detected.count) detected of \(count) stalls")
            #expect(Set(ended.compactMap { $0["STALL_ID"] }).count == ended.count)
            #expect(Set(detected.compactMap { $0["STALL_ID"] }) == Set(ended.compactMap { $0["STALL_ID"] }))
            guard ended.count == count else { return }
            for ((stall, answer), entry) in zip(stalls, ended) {
                #expect(answer.handler == stall.function)
                #expect(answer.truthMilliseconds >= Double(Self.stallMilliseconds), "\(answer)")
                let duration = (Double(entry["STALL_DURATION_USEC"] ?? "") ?? 0) / 1000
                #expect(
                    duration >= answer.truthMilliseconds - Self.below
                        && duration <= answer.truthMilliseconds + Self.above,
                    "\(service.kind) \(stall): reported \(duration) ms, the handler measured \(answer.truthMilliseconds) ms"
                )
                let backtrace = entry["STALL_BACKTRACE"] ?? ""
                #expect(backtrace.contains(stall.function), "\(service.kind) \(stall): \(backtrace)")
                #expect((entry["STALL_FRAME"] ?? "").contains(stall.function), "\(service.kind) \(stall)")
                #expect(entry["STALL_THREAD_TID"] == String(answer.tid), "\(service.kind) \(stall): ran on \(answer)")
                switch stall.loop {
                case .pool:
                    #expect(entry["STALL_LOOP"] == "cooperative-pool", "\(service.kind) \(stall)")
                    #expect(entry["STALL_ACTIVITY"] == "pool-job", "\(service.kind) \(stall)")
                case .mainActor:
                    #expect(answer.mainThread, "\(stall) ran off the main thread: \(answer)")
                    #expect(entry["STALL_LOOP"] == "main", "\(service.kind) \(stall)")
                    #expect(entry["STALL_CALLOUT"] == "main-actor", "\(service.kind) \(stall)")
                case .eventLoop:
                    #expect(answer.thread.hasPrefix("NIO-SGLTN-"), "\(stall) ran on \(answer.thread)")
                    #expect(entry["STALL_LOOP"] == answer.thread, "\(service.kind) \(stall)")
                    #expect(entry["STALL_ACTIVITY"] == "event-loop-cycle", "\(service.kind) \(stall)")
                }
                if let syscalls = stall.syscalls {
                    #expect(entry["STALL_THREAD_STATE"] == "S", "\(service.kind) \(stall)")
                    #expect(syscalls.contains(entry["STALL_THREAD_SYSCALL"] ?? "?"), "\(service.kind) \(stall)")
                } else {
                    #expect(entry["STALL_THREAD_STATE"] == "R", "\(service.kind) \(stall)")
                }
            }
        }

        /// After a request, 10 s in which nothing is asked of the service: no report, and stallmon's
        /// threads wake only when the threads they watch do. Its watchdogs cost an idle loop or pool
        /// no wakeup, and a loop that wakes costs them at most two per threshold; but Vapor and
        /// Hummingbird are not idle when nothing is asked of them: Vapor updates its date header
        /// every second with a repeated task on each loop that served a request (`RFC1123DateCache`),
        /// and Hummingbird with a 1 s timer sequence on the pool (`DateCache`). So: no wakeup at all
        /// while the service's own threads make none (gRPC), else at most two for each of theirs;
        /// and the reporting thread, with nothing to report, none.
        func checkIdle(_ service: FrameworkService) throws {
            let before = try service.entries(MessageID.stallDetected, atLeast: 1, timeout: 0)
            _ = service.kind == .grpc ? try service.call("Hello", milliseconds: 1) : try service.get("/hello")
            usleep(500_000)
            let first = service.contextSwitches
            #expect(first.keys.contains { $0.hasPrefix("stallmon-watch") }, "\(service.kind): \(first.keys.sorted())")
            usleep(10_000_000)
            let last = service.contextSwitches
            var wakeups: [String: Int] = [:]
            for (thread, count) in first {
                if let later = last[thread], later != count { wakeups[thread] = later - count }
            }
            let stallmon = wakeups.filter { $0.key.hasPrefix("stallmon-") }
            let own = wakeups.filter { !$0.key.hasPrefix("stallmon-") }
            let watchdogs = stallmon.filter { !$0.key.hasPrefix("stallmon-report") }.values.reduce(0, +)
            #expect(
                watchdogs <= 2 * own.values.reduce(0, +),
                "\(service.kind): stallmon's watchdogs woke \(stallmon) in 10 s of idle, the service's threads \(own)")
            #expect(!stallmon.keys.contains { $0.hasPrefix("stallmon-report") }, "\(service.kind): \(stallmon)")
            let after = try service.entries(MessageID.stallDetected, atLeast: before.count + 1, timeout: 0.5)
            #expect(
                after.count == before.count, "\(service.kind): reported while idle: \(after.dropFirst(before.count))")
        }
    }
}
