import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// A SwiftNIO HTTP server (Sources/StallmonNIOServer) monitored by StallMonitorNIO, driven by curl
    /// over loopback; its reports read back from a real journald.
    @Suite
    struct NIOEventLoopTests {
        /// Within this of the time the handler measured itself.
        static let tolerance = 15.0

        /// With heartbeats (any group, as frameworks make them) and with the tick delegate.
        @Test(arguments: [false, true])
        func eachStallingHandlerIsReportedOnceWithItsDurationFrameAndKind(tickDelegate: Bool) throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer(tickDelegate: tickDelegate)
            defer { server.stop() }
            let answers = try ["/cpu?ms=300", "/sleep?ms=300", "/lock?ms=300"].map { try server.stall($0) }
            let ended = try server.entries(MessageID.stallEnded, atLeast: 3)
            let detected = try server.entries(MessageID.stallDetected, atLeast: 3)
            #expect(try server.stats()["interruptions"] == 0, "a handler's nanosleep returned EINTR")
            server.stop()
            let endedAfterStop = try server.entries(MessageID.stallEnded, atLeast: 4, timeout: 1)
            #expect(endedAfterStop.count == 3, "each stall is reported once")
            try #require(ended.count == 3)
            #expect(detected.count == 3)

            let expectations: [(function: String, state: String, syscalls: [String])] = [
                ("stallOnCPU(milliseconds:)", "R", []),
                ("stallInSleep(milliseconds:)", "S", ["clock_nanosleep", "nanosleep"]),
                ("stallOnLock(milliseconds:)", "S", ["futex"]),
            ]
            for ((answer, entry), expected) in zip(zip(answers, ended), expectations) {
                let duration = Double(entry["STALL_DURATION_USEC"] ?? "") ?? 0
                #expect(
                    abs(duration / 1000 - answer.truthMilliseconds) <= Self.tolerance,
                    "\(answer.handler): reported \(duration / 1000) ms, the handler measured \(answer.truthMilliseconds) ms"
                )
                #expect(entry["STALL_LOOP"] == answer.loop)
                #expect(entry["STALL_LOOP"]?.hasPrefix("NIO-ELT-") == true)
                #expect(entry["STALL_ACTIVITY"] == "event-loop-cycle")
                #expect(entry["STALL_CALLOUT"] == "channel-read", "\(answer.handler)")
                #expect(entry["STALL_THREAD_STATE"] == expected.state, "\(answer.handler)")
                let frame = entry["STALL_FRAME"] ?? ""
                #expect(
                    frame.contains(expected.function) && frame.contains("main.swift:"), "\(answer.handler): \(frame)")
                #expect(entry["MESSAGE"]?.hasPrefix("event loop \(answer.loop) stalled") == true)
                let cpu = Double(entry["STALL_CPU_USEC"] ?? "") ?? 0
                if expected.syscalls.isEmpty {
                    #expect((entry["STALL_THREAD_SYSCALL"] ?? "").isEmpty)
                } else {
                    #expect(expected.syscalls.contains(entry["STALL_THREAD_SYSCALL"] ?? "?"), "\(answer.handler)")
                    #expect(cpu < duration / 10, "\(answer.handler) blocked, yet used \(cpu) µs of CPU")
                }
                let record = try StallRecord(journalFields: entry)
                #expect(record.event == .ended)
            }
        }

        @Test func eachKindOfLoopWorkIsNamedInItsReport() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer()
            defer { server.stop() }
            let kinds = [("/task", "execute-task"), ("/scheduled", "scheduled-task"), ("/future", "future-callback")]
            let answers = try kinds.map { path, _ in try server.stall("\(path)?ms=300") }
            let ended = try server.entries(MessageID.stallEnded, atLeast: kinds.count)
            try #require(ended.count == kinds.count)
            for ((answer, entry), (_, callout)) in zip(zip(answers, ended), kinds) {
                #expect(entry["STALL_CALLOUT"] == callout, "\(answer.handler)")
                #expect(entry["STALL_FRAME"]?.contains("stallOnCPU(milliseconds:)") == true, "\(answer.handler)")
                let duration = (Double(entry["STALL_DURATION_USEC"] ?? "") ?? 0) / 1000
                #expect(
                    abs(duration - answer.truthMilliseconds) <= Self.tolerance,
                    "\(answer.handler): reported \(duration) ms, the handler measured \(answer.truthMilliseconds) ms")
            }
        }

        @Test func anIdleServerIsNotReportedAndItsWatchdogNeverWakes() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer()
            defer { server.stop() }
            _ = try server.get("/hello")
            usleep(500_000)
            let watchdog = try #require(NamedThread(named: "stallmon-nio", in: server.processID))
            let wakeups = try #require(watchdog.wakeups(over: 10_000_000))
            #expect(wakeups == 0, "the watchdog woke \(wakeups) times in 10 s of idle")
            #expect(try server.entries(MessageID.stallDetected, atLeast: 1, timeout: 0.5).isEmpty)
        }

        @Test func shortRequestsUnderLoadAreNotReported() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer()
            defer { server.stop() }
            let before = try server.stats()
            let started = Date()
            // Four clients of 150 requests each, each on its own keep-alive connection.
            let urls = Array(repeating: "http://127.0.0.1:\(server.port)/hello", count: 150)
            let clients = try (0..<4).map { _ in
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
                process.arguments = ["-s", "--max-time", "60"] + urls
                process.standardOutput = FileHandle.nullDevice
                try process.run()
                return process
            }
            for client in clients { client.waitUntilExit() }
            let elapsed = Date().timeIntervalSince(started)
            let after = try server.stats()
            #expect(clients.allSatisfy { $0.terminationStatus == 0 })
            #expect(after["stalls"] == before["stalls"])
            #expect(try server.entries(MessageID.stallDetected, atLeast: 1, timeout: 0.5).isEmpty)
            let wakeups = Double((after["wakeups"] ?? 0) - (before["wakeups"] ?? 0)) / elapsed
            // Heartbeats: a look per heartbeat period (an eighth of the threshold) for the group,
            // and at most one wakeup per period by each loop's poll as it wakes from idle.
            #expect(wakeups <= (1 + 2) * 8 / 0.1, "\(wakeups) watchdog wakeups per second under load")
        }

        /// A process stopped (SIGSTOP, a debugger) in the middle of a short request is no stall:
        /// the time nothing ran is not the loop's.
        @Test func aServerStoppedInTheMiddleOfAShortRequestIsNotReportedStalled() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer(threads: 1)
            defer { server.stop() }
            let before = try server.stats()
            var stoppedInside = 0
            for _ in 0..<3 {
                // An 80 ms handler (the threshold is 100 ms), the process stopped 40 ms in for 400 ms.
                let answer = Answers()
                let done = DispatchSemaphore(value: 0)
                DispatchQueue.global().async {
                    answer.append(Result { try server.stall("/cpu?ms=80") })
                    done.signal()
                }
                usleep(40_000)
                kill(server.processID, SIGSTOP)
                usleep(400_000)
                kill(server.processID, SIGCONT)
                done.wait()
                let stall = try #require(answer.all.first).get()
                // The handler spins on the wall clock: it took the stop in only if it ran that long.
                if stall.truthMilliseconds >= 400 { stoppedInside += 1 }
            }
            try #require(stoppedInside > 0, "no stop landed inside a handler")
            #expect(try server.stats()["stalls"] == before["stalls"])
            #expect(try server.entries(MessageID.stallDetected, atLeast: 1, timeout: 1).isEmpty)
            #expect(try server.entries(MessageID.stallEnded, atLeast: 1, timeout: 0.5).isEmpty)
        }

        @Test func aStalledLoopDoesNotHideAStallOnAnotherLoop() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let server = try NIOServer()
            defer { server.stop() }
            // Connections go to the group's loops in turn: the two requests land on different loops,
            // and the CPU stall runs inside the other loop's blocked one.
            let group = DispatchGroup()
            let answers = Answers()
            for (delay, path) in [(0, "/sleep?ms=700"), (100_000, "/cpu?ms=300")] {
                DispatchQueue.global().async(group: group) {
                    usleep(UInt32(delay))
                    answers.append(Result { try server.stall(path) })
                }
            }
            group.wait()
            let stalls = try answers.all.map { try $0.get() }
            try #require(stalls.count == 2)
            try #require(Set(stalls.map(\.loop)).count == 2, "both requests ran on one loop: \(stalls)")
            let ended = try server.entries(MessageID.stallEnded, atLeast: 2)
            #expect(ended.count == 2)
            for stall in stalls {
                let entry = try #require(ended.first { $0["STALL_LOOP"] == stall.loop }, "no report for \(stall.loop)")
                let duration = (Double(entry["STALL_DURATION_USEC"] ?? "") ?? 0) / 1000
                #expect(abs(duration - stall.truthMilliseconds) <= Self.tolerance, "\(stall.handler): \(duration) ms")
            }
        }

        final class Answers: @unchecked Sendable {
            private let lock = NSLock()
            private var results: [Result<NIOServer.Answer, any Error>] = []
            func append(_ result: Result<NIOServer.Answer, any Error>) { lock.withLock { results.append(result) } }
            var all: [Result<NIOServer.Answer, any Error>] { lock.withLock { results } }
        }
    }
}
