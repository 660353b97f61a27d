import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond watching the example services of Examples/ from outside: the real daemon and its
    /// BPF tick watcher, a real journald, and `HummingbirdWithoutStallmon` and `VaporWithoutStallmon`
    /// (built by `swift build --package-path Examples`): the routes of `HummingbirdFixture` and
    /// `VaporFixture` in services built without stallmon, no stallmon product among their
    /// dependencies, driven by curl over loopback. ``startWithoutStallmon(_:)`` checks that nothing
    /// of stallmon's is in the binary (``linksStallmon(_:)``) and that no thread or signal handler of
    /// a monitor is in the process; the fixtures themselves, monitored, show that a process running
    /// its own monitor is left to it.
    @Suite
    struct ExternalFrameworkWatchTests {
        /// A stall of an event loop itself, made by one of a fixture's routes.
        struct LoopStall: Sendable, CustomStringConvertible {
            var route: String
            /// The function that stalls (ExampleStalls), the frame a report must name.
            var function: String
            var milliseconds: Int
            /// The system calls the loop thread can be blocked in; `nil` for a stall on the CPU.
            var syscalls: [String]?

            var description: String { "\(route) (\(function))" }
        }

        /// The three kinds of stall, of 300, 250 and 200 ms under stallmond's threshold of 100 ms: on
        /// the CPU, blocked in a system call (a sleep), waiting for a lock held by another thread.
        /// Vapor runs a synchronous handler on the request's event loop (`/sync-*`); Hummingbird runs
        /// every handler on the cooperative pool, and its fixture's `/loop-*` routes submit the stall
        /// to one of the NIO singleton's loops, as a ChannelHandler or a future's callback would run.
        static func stalls(of kind: FrameworkService.Kind) -> [LoopStall] {
            let prefix = kind == .vaporFixture || kind == .vaporWithoutStallmon ? "/sync" : "/loop"
            return [
                LoopStall(route: prefix + "-cpu", function: "spinOnEventLoop(milliseconds:)", milliseconds: 300),
                LoopStall(
                    route: prefix + "-sleep", function: "sleepOnEventLoop(milliseconds:)", milliseconds: 250,
                    syscalls: ["clock_nanosleep", "nanosleep"]),
                LoopStall(
                    route: prefix + "-lock", function: "waitForLockOnEventLoop(milliseconds:)", milliseconds: 200,
                    syscalls: ["futex"]),
            ]
        }

        /// How far the reported duration may be from the handler's own measure: the kernel times the
        /// loop's whole tick, the handler its own part of it (the request's parsing and the
        /// response's writing are in the tick too).
        static let tolerance = 10.0

        /// The threads of a process named as a linked monitor's (stallmond leaves such a process to it).
        static func monitorThreads(of pid: Int32) -> [String] {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            return tasks.compactMap { tid in
                (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8))?
                    .trimmingCharacters(in: .newlines)
            }.filter { $0.hasPrefix("stallmon-") }
        }

        /// The real-time signals (SIGRTMIN, 34, and above) process `pid` has a handler for, from
        /// `SigCgt` in its status (`[-1]` when it cannot be read); stallmon's sampling signal is one of
        /// them where a monitor samples.
        static func caughtRealTimeSignals(of pid: Int32) -> [Int] {
            let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("SigCgt:") }
            guard let mask = line?.split(separator: "\t").last.flatMap({ UInt64($0, radix: 16) }) else { return [-1] }
            return (34...64).filter { mask & (1 << UInt64($0 - 1)) != 0 }
        }

        /// Whether an executable has stallmon in it: the mangled name of its module, which every
        /// symbol of `StallMonitor` carries (`$s12StallMonitor…`), is in its symbol table.
        static func linksStallmon(_ binary: URL) throws -> Bool {
            let contents = try Data(contentsOf: binary, options: .alwaysMapped)
            return contents.range(of: Data("12StallMonitor".utf8)) != nil
        }

        /// A fixture's routes built without stallmon, checked to hold nothing of stallmon's: not in
        /// its binary, and no monitor's thread or sampling signal in the process.
        static func startWithoutStallmon(_ kind: FrameworkService.Kind) throws -> FrameworkService {
            let binary = try FrameworkService.requiredBinary(kind)
            #expect(try !linksStallmon(binary), "\(kind) has stallmon in it")
            let service = try FrameworkService(kind, binary: binary, environment: [:])
            #expect(monitorThreads(of: service.processID).isEmpty, "\(kind) runs a monitor")
            #expect(caughtRealTimeSignals(of: service.processID).isEmpty, "\(kind) catches a real-time signal")
            return service
        }

        /// `count` quick `GET /hello`s over four keep-alive connections at once (curl reuses its
        /// connection across the URLs of a glob); returns how many were answered.
        static func quickRequests(_ service: FrameworkService, count: Int) throws -> Int {
            let clients = 4
            let processes = try (0..<clients).map { _ in
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
                process.arguments = [
                    "-s", "--max-time", "300", "http://127.0.0.1:\(service.port)/hello?n=[1-\(count / clients)]",
                ]
                // 2,500 answers of 5 bytes: less than a pipe holds, read once curl is done.
                let output = Pipe()
                process.standardOutput = output
                process.standardError = FileHandle.nullDevice
                try process.runWithEmptySignalMask()
                return (process, output)
            }
            return processes.map { process, output in
                process.waitUntilExit()
                let body = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                return body.components(separatedBy: "hello").count - 1
            }.reduce(0, +)
        }

        /// The entries stallmond wrote from outside about process `pid` since `start` (a process of
        /// an earlier run may have had that PID: this machine's journal keeps its entries), polled
        /// until `count` are there or `timeout` passes.
        static func externalEntries(of pid: Int32, since start: Date, atLeast count: Int = 1, timeout: Double = 0)
            throws -> [[String: String]]
        {
            let floor = UInt64(start.timeIntervalSince1970 * 1_000_000)
            let deadline = Date(timeIntervalSinceNow: timeout)
            while true {
                let entries = try Journald.host.read(["STALL_SOURCE=external", "OBJECT_PID=\(pid)"]).filter {
                    (UInt64($0["__REALTIME_TIMESTAMP"] ?? "") ?? 0) >= floor
                }
                if entries.count >= count || Date() >= deadline { return entries }
                usleep(100_000)
            }
        }

        /// The example's executable as an operator names it: through `Examples/.build/debug`, a
        /// symbolic link to the target triple's directory, which stallmond resolves, since
        /// `/proc/PID/exe` names the file itself.
        static func watchPath(_ kind: FrameworkService.Kind) throws -> String {
            let path = try FrameworkService.requiredBinary(kind).path
            #expect(path != URL(fileURLWithPath: path).resolvingSymlinksInPath().path, "watch names a link")
            return path
        }

        static func watched(_ pid: Int32, by daemon: Executable.Running, timeout: Double = 15) -> Bool {
            daemon.waitForOutput(timeout: timeout) { _, errors in errors.contains("pid=\(pid) ") }
        }

        @Test(.requires(.bpf, .example(.hummingbirdWithoutStallmon)))
        func eachEventLoopStallOfHummingbirdWithoutStallmonIsReportedOnceFromOutside() throws {
            try checkLoopStalls(of: .hummingbirdWithoutStallmon)
        }

        @Test(.requires(.bpf, .example(.vaporWithoutStallmon)))
        func eachEventLoopStallOfVaporWithoutStallmonIsReportedOnceFromOutside() throws {
            try checkLoopStalls(of: .vaporWithoutStallmon)
        }

        /// The service built without stallmon under stallmond watching its executable: 10,000 quick
        /// requests, no entry; then each kind of stall once, each reported once (a `detected` and an
        /// `ended` entry of one stall ID) on the loop thread it ran on, the kernel's duration within
        /// ``tolerance`` of the handler's, with the stalled function's frame.
        func checkLoopStalls(of kind: FrameworkService.Kind) throws {
            let directory = try ExternalWatchTests.prepareWatch()
            let start = Date()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let service = try Self.startWithoutStallmon(kind)
            defer { service.stop() }
            let daemon = try ExternalWatchTests.startStallmond(watching: Self.watchPath(kind), directory: directory)
            defer { _ = daemon.terminate() }
            #expect(Self.watched(service.processID, by: daemon), "\(kind) not watched: \(daemon.errorsSoFar)")

            // Quick requests: short ticks of every loop, none of them a stall.
            let started = Date()
            let answered = try Self.quickRequests(service, count: 10_000)
            let elapsed = Date().timeIntervalSince(started)
            #expect(answered == 10_000, "\(kind): \(answered) answers")
            Thread.sleep(forTimeInterval: 0.5)
            let quick = try Self.externalEntries(of: service.processID, since: start)
            #expect(quick.isEmpty, "\(kind) reported under \(answered) requests: \(quick.map { $0["MESSAGE"] ?? "" })")
            print("\(kind): \(answered) quick requests in \(String(format: "%.1f", elapsed)) s, none reported")

            let stalls = Self.stalls(of: kind)
            var answers: [FrameworkService.Answer] = []
            for stall in stalls {
                answers.append(try FrameworkService.Answer(service.get("\(stall.route)?ms=\(stall.milliseconds)")))
                Thread.sleep(forTimeInterval: 0.3)
            }
            _ = try Self.externalEntries(of: service.processID, since: start, atLeast: 2 * stalls.count, timeout: 10)
            // Whatever else would come: a second report of one stall, or one of something else.
            let entries = try Self.externalEntries(
                of: service.processID, since: start, atLeast: 2 * stalls.count + 1, timeout: 1.5)
            let records = try entries.map { try StallRecord(journalFields: $0) }
            let ended = records.filter { $0.event == .ended }
            let detected = records.filter { $0.event == .detected }
            let summary = records.map { "\($0.event) \($0.loop) \($0.durationMicroseconds) µs at \($0.frame)" }
            try #require(ended.count == stalls.count, "\(kind): \(summary)")
            #expect(detected.count == stalls.count, "\(kind): \(summary)")
            #expect(Set(ended.map(\.stallID)) == Set(detected.map(\.stallID)), "one stall ID per stall")
            for ((stall, answer), record) in zip(zip(stalls, answers), ended) {
                #expect(answer.handler == stall.function)
                #expect(answer.thread.hasPrefix("NIO-SGLTN-"), "\(stall) ran on \(answer)")
                #expect(record.loop == answer.thread, "\(kind) \(stall): the loop thread's name")
                #expect(record.threadID == answer.tid, "\(kind) \(stall): ran on \(answer)")
                #expect(record.thresholdMicroseconds == 100_000)
                let reported = Double(record.durationMicroseconds) / 1000
                #expect(
                    abs(reported - answer.truthMilliseconds) <= Self.tolerance,
                    "\(kind) \(stall): reported \(reported) ms, the handler measured \(answer.truthMilliseconds) ms")
                print(
                    "\(kind) \(stall): reported \(reported) ms, the handler measured \(answer.truthMilliseconds) ms, "
                        + "stack \(record.stackSource) at \(record.frame)")
                #expect(record.frame.contains(stall.function), "\(kind) \(stall): \(record.backtrace)")
                #expect(record.backtrace.contains(stall.function), "\(kind) \(stall): \(record.backtrace)")
                let seen = detected.first { $0.stallID == record.stallID }
                if let syscalls = stall.syscalls {
                    // Blocked: unwound in place from its registers and the process's memory,
                    // through the Swift frames above the handler into SwiftNIO's (Vapor's stack is
                    // deeper than the 4 KiB of its backtrace).
                    #expect(record.stackSource == "kernel", "\(kind) \(stall)")
                    #expect(record.backtrace.contains("EventLoop"), "\(kind) \(stall): \(record.backtrace)")
                    let syscall = seen?.threadSyscall ?? "?"
                    #expect(syscalls.contains(syscall), "\(kind) \(stall): blocked in \(syscall) when detected")
                } else {
                    // On the CPU: from a perf event's copy of its registers and stack.
                    #expect(record.stackSource == "perf", "\(kind) \(stall)")
                    let syscall = seen?.threadSyscall ?? "?"
                    #expect(syscall == "", "\(kind) \(stall): blocked in \(syscall) when detected")
                }
            }
        }

        /// Both services built without stallmon and both fixtures with it, under one stallmond
        /// whose `watch` names all four executables: a minute of idle (Vapor's loops still wake every second for its date header)
        /// reports nothing; the monitored two are never watched from outside, and an event-loop
        /// stall of each is reported once, by its own monitor.
        @Test(
            .requires(
                .bpf, .example(.hummingbirdWithoutStallmon), .example(.vaporWithoutStallmon),
                .example(.hummingbirdFixture), .example(.vaporFixture)))
        func anIdleMinuteIsNeverReportedAndAMonitoredServiceOnlyByItsOwnMonitor() throws {
            let directory = try ExternalWatchTests.prepareWatch()
            let start = Date()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let unlinked: [FrameworkService.Kind] = [.hummingbirdWithoutStallmon, .vaporWithoutStallmon]
            let unmonitored = try unlinked.map(Self.startWithoutStallmon)
            defer { for service in unmonitored { service.stop() } }
            let kinds: [FrameworkService.Kind] = [.hummingbirdFixture, .vaporFixture]
            for kind in kinds { #expect(try Self.linksStallmon(FrameworkService.requiredBinary(kind))) }
            let monitored = try kinds.map { kind in
                try FrameworkService(
                    kind, binary: try FrameworkService.requiredBinary(kind),
                    environment: FrameworkServiceTests.environment)
            }
            defer { for service in monitored { service.stop() } }
            for service in monitored {
                #expect(
                    Self.monitorThreads(of: service.processID).contains("stallmon-watch"),
                    "\(service.kind): its monitor did not start")
            }
            // `watch` names all four: the monitored two must be left to their own monitors.
            let paths = try (unlinked + kinds).map(Self.watchPath)
            let daemon = try ExternalWatchTests.startStallmond(
                watching: paths[0], paths[1], paths[2], paths[3], directory: directory)
            defer { _ = daemon.terminate() }
            for service in unmonitored {
                #expect(Self.watched(service.processID, by: daemon), "\(service.kind): \(daemon.errorsSoFar)")
            }
            // A request each, so that every service has served one (Vapor's date cache then ticks).
            for service in unmonitored + monitored { _ = try service.get("/hello") }

            Thread.sleep(forTimeInterval: 60)
            for service in unmonitored + monitored {
                let entries = try Self.externalEntries(of: service.processID, since: start)
                #expect(entries.isEmpty, "\(service.kind): \(entries.map { $0["MESSAGE"] ?? "" })")
            }
            for service in monitored {
                #expect(
                    !daemon.errorsSoFar.contains("pid=\(service.processID) "),
                    "\(service.kind) runs its own monitor, yet is watched from outside")
            }

            // A stall of an event loop in each monitored service: its own report, once, and none
            // from outside; and one in the unmonitored Vapor, to show the watcher was live throughout.
            for service in monitored {
                let stall = Self.stalls(of: service.kind)[0]
                let answer = try FrameworkService.Answer(service.get("\(stall.route)?ms=\(stall.milliseconds)"))
                _ = try service.entries(MessageID.stallEnded)
                let own = try service.entries(MessageID.stallEnded, atLeast: 2, timeout: 1.5)
                #expect(own.count == 1, "\(service.kind): \(own.map { $0["MESSAGE"] ?? "" })")
                #expect(own.first?["STALL_LOOP"] == answer.thread, "\(service.kind): \(answer)")
                let external = try Self.externalEntries(of: service.processID, since: start, timeout: 0.5)
                #expect(external.isEmpty, "\(service.kind) reported twice")
            }
            let vapor = unmonitored[1]
            let stall = Self.stalls(of: vapor.kind)[0]
            _ = try vapor.get("\(stall.route)?ms=\(stall.milliseconds)")
            let entries = try Self.externalEntries(of: vapor.processID, since: start, atLeast: 2, timeout: 10)
            let ended = entries.filter { $0["STALL_EVENT"] == "ended" }
            #expect(ended.count == 1, "\(entries.map { $0["MESSAGE"] ?? "" })")
        }
    }
}
