import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond watching a service from outside: the real daemon, its BPF tick watcher, a real
    /// journald, and a plain C epoll service with no stallmon in it (Sources/StallmonEpollFixture).
    @Suite
    struct ExternalWatchTests {
        /// The epoll service, its loop's TID, and the ticks it reports as `done` lines.
        final class EpollService {
            let running: Executable.Running
            let input = Pipe()
            let pid: Int32
            let loopThread: Int

            /// - Parameter arguments: `["--io-uring"]` for a loop that waits in io_uring_enter.
            init(arguments: [String] = []) throws {
                running = try Executable.epollFixture.start(arguments, input: input)
                let ready = running.waitForOutput { output, _ in output.contains("\n") }
                let words = running.outputSoFar.split(separator: "\n").first?.split(separator: " ") ?? []
                guard ready, words.count == 3, words[0] == "ready", let pid = Int32(words[1]), let tid = Int(words[2])
                else {
                    throw Failure(description: "the epoll fixture did not start: \(running.outputSoFar)")
                }
                self.pid = pid
                loopThread = tid
            }

            struct Failure: Error, CustomStringConvertible { var description: String }

            /// Runs one command inside a tick of the loop, and returns the tick's length as the
            /// service measured it, from its wait's return to just before its next wait, and the CPU
            /// time its thread took meanwhile.
            @discardableResult
            func stall(_ command: String, milliseconds: Int) throws -> (duration: Duration, cpu: Duration) {
                let before = running.outputSoFar.split(separator: "\n").count
                input.fileHandleForWriting.write(Data("\(command) \(milliseconds)\n".utf8))
                guard running.waitForOutput({ output, _ in output.split(separator: "\n").count > before }) else {
                    throw Failure(description: "no answer to \(command): \(running.outputSoFar)")
                }
                let words = running.outputSoFar.split(separator: "\n")[before].split(separator: " ")
                guard words.count == 7, let start = UInt64(words[4]), let end = UInt64(words[5]),
                    let cpu = Int64(words[6])
                else {
                    throw Failure(description: "unexpected answer: \(words)")
                }
                return (.nanoseconds(Int64(end - start)), .nanoseconds(cpu))
            }

            /// Asks it to quit; one that has ended already is not written to (SIGPIPE would end the
            /// tests).
            func stop() {
                if running.process.isRunning { input.fileHandleForWriting.write(Data("quit\n".utf8)) }
                _ = running.terminate(grace: 2)
            }
        }

        /// A cgroup named like a systemd unit, made in the unified hierarchy as systemd makes a
        /// unit's (the processes moved into it are that unit's for stallmond), removed by ``remove()``.
        struct UnitCgroup {
            let path: String

            init(name: String) throws {
                // A mountinfo line: "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS … - TYPE SOURCE …".
                let mountInfo = try String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)
                var mountPoint: Substring?
                for line in mountInfo.split(separator: "\n") {
                    let fields: [Substring] = line.split(separator: " ")
                    guard let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count, fields.count > 4 else {
                        continue
                    }
                    if fields[dash + 1] == "cgroup2" {
                        mountPoint = fields[4]
                        break
                    }
                }
                guard let mountPoint else {
                    throw EpollService.Failure(description: "no cgroup2 hierarchy is mounted")
                }
                path = "\(mountPoint)/\(name)"
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            }

            func move(_ pid: Int32) throws {
                try "\(pid)\n".write(toFile: path + "/cgroup.procs", atomically: false, encoding: .utf8)
            }

            func remove() { rmdir(path) }
        }

        /// stallmond with a configuration of its own that watches `patterns` (executable paths, unit globs);
        /// under `setpriv` with `setprivArguments` when they are given. It writes its metrics to
        /// `DIRECTORY/stallmon.prom` every second, counts what is written from its start on
        /// (`cold_start_entries` 0: earlier runs' stalls are in this machine's journal), and gives
        /// every unit a series of its own.
        static func startStallmond(watching patterns: String..., directory: String, setprivArguments: [String] = [])
            throws -> Executable.Running
        {
            let configuration = directory + "/stallmond.json"
            let watch = patterns.map { "\"\($0)\"" }.joined(separator: ", ")
            let json =
                #"{"metrics_path": "\#(directory)/stallmon.prom", "metrics_interval_s": 1, "cold_start_entries": 0, "max_units": 100000, "state_directory": "\#(directory)/state", "digest_interval_s": 0, "watch": [\#(watch)], "watch_threshold_ms": 100}"#
            try json.write(toFile: configuration, atomically: true, encoding: .utf8)
            guard !setprivArguments.isEmpty else { return try Executable.stallmond.start(["--config", configuration]) }
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = setprivArguments + [Executable.stallmond.url.path, "--config", configuration]
            let output = Pipe()
            let errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            try process.runWithEmptySignalMask()
            return Executable.Running(process: process, output: output, errors: errors)
        }

        /// What every test of the watcher needs first: journald listening, tracefs mounted (libbpf
        /// finds the tracepoints there), and a scratch directory for stallmond's configuration and
        /// metrics, which the caller removes.
        static func prepareWatch() throws -> String {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            try #require(TestRequirement.mountTracefs(), "tracefs could not be mounted at /sys/kernel/tracing")
            return try ScratchDirectory.make()
        }

        /// The epoll fixture (started with `arguments`) under a stallmond whose `watch` names its
        /// executable, once stallmond says it watches it; `body` gets both and stallmond's scratch
        /// directory, and everything is stopped and removed after it.
        static func withWatchedEpollService(
            arguments: [String] = [], _ body: (EpollService, Executable.Running, String) throws -> Void
        ) throws {
            let directory = try prepareWatch()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let service = try EpollService(arguments: arguments)
            defer { service.stop() }
            let daemon = try startStallmond(watching: Executable.epollFixture.url.path, directory: directory)
            defer { _ = daemon.terminate() }
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("pid=\(service.pid) ") },
                "stallmond did not watch the service: \(daemon.errorsSoFar)")
            try body(service, daemon, directory)
        }

        static func occurrences(of text: String, in log: String) -> Int {
            log.components(separatedBy: text).count - 1
        }

        static func externalEntries(of pid: Int32) throws -> [[String: String]] {
            try Journald.host.read(["STALL_SOURCE=external", "OBJECT_PID=\(pid)"])
        }

        @Test(.requires(.bpf))
        func eachStallOfAnUnlinkedEpollLoopIsReportedOnceWithTheKernelsDuration() throws {
            try Self.withWatchedEpollService { service, _, directory in
                // Idle: the loop wakes every 20 ms, and nothing is a stall.
                Thread.sleep(forTimeInterval: 1)
                #expect(try Self.externalEntries(of: service.pid).isEmpty)

                // Quick ticks are not stalls either: 10,000 of 200 us between waits that return at once,
                // as a busy server's loop runs, while stallmond scans them every 12.5 ms.
                for _ in 0..<20 { try service.stall("spin", milliseconds: 5) }
                try service.stall("ticks", milliseconds: 10_000)
                #expect(try Self.externalEntries(of: service.pid).isEmpty)
                var truths: [(command: String, duration: Duration, cpu: Duration)] = []
                for (command, milliseconds) in [("spin", 300), ("sleep", 250), ("lock", 200)] {
                    let truth = try service.stall(command, milliseconds: milliseconds)
                    truths.append((command, truth.duration, truth.cpu))
                    Thread.sleep(forTimeInterval: 0.3)
                }
                let entries = try Journald.host.entries(
                    ["STALL_SOURCE=external", "OBJECT_PID=\(service.pid)"], atLeast: 6, timeout: 10)
                Thread.sleep(forTimeInterval: 0.5)
                let settled = try Self.externalEntries(of: service.pid)
                #expect(settled.count == entries.count, "no entry after the stalls ended")
                let records = try settled.map { try StallRecord(journalFields: $0) }
                #expect(records.allSatisfy { $0.source == .external }, "read back through the schema")
                let ended = records.filter { $0.event == .ended }
                let detected = records.filter { $0.event == .detected }
                try #require(ended.count == 3, "\(settled.map { $0["MESSAGE"] ?? "" })")
                #expect(detected.count == 3)
                #expect(Set(ended.map(\.stallID)) == Set(detected.map(\.stallID)), "one stall ID per stall")
                for (record, truth) in zip(ended, truths) {
                    let reported = Duration.microseconds(Int64(record.durationMicroseconds))
                    let error = reported > truth.duration ? reported - truth.duration : truth.duration - reported
                    #expect(
                        error <= .milliseconds(10), "\(truth.command): reported \(reported), truth \(truth.duration)")
                    #expect(record.loop == "epoll-loop")
                    #expect(record.threadID == service.loopThread)
                    #expect(record.thresholdMicroseconds == 100_000)
                    // The scheduler's count, read by the BPF program when the tick ends: late by at most
                    // one scheduler tick (4 ms at 250 Hz, 10 ms at 100 Hz) against the thread's CPU clock.
                    let cpu = Duration.microseconds(Int64(record.cpuMicroseconds))
                    let cpuError = cpu > truth.cpu ? cpu - truth.cpu : truth.cpu - cpu
                    #expect(cpuError <= .milliseconds(12), "\(truth.command): CPU \(cpu), truth \(truth.cpu)")
                }
                // A blocked thread's stack, unwound in place from the process's memory and the registers
                // the kernel saved at its system call: the stalled function's frame, with its line (the
                // fixture is built with debug information), and through the fixture's frame-pointer
                // frames down to the thread's start.
                for record in records where record.threadSyscall != "" {
                    #expect(record.stackSource == "kernel")
                    #expect(record.frame.hasPrefix("run (main.c:"), "\(record.backtrace)")
                    #expect(record.backtrace.hasPrefix("#0 "), "\(record.backtrace)")
                    #expect(record.backtrace.contains(" loop + "), "\(record.backtrace)")
                    #expect(record.backtrace.contains("start_thread"), "\(record.backtrace)")
                }
                // A running thread's, from a perf event's copy of its registers and stack: the spin's
                // own code, down to the thread's start.
                for record in records where record.threadSyscall == "" {
                    #expect(record.stackSource == "perf")
                    #expect(record.frame.contains("(main.c:"), "\(record.backtrace)")
                    #expect(record.backtrace.contains(" run + "), "\(record.backtrace)")
                    #expect(record.backtrace.contains("start_thread"), "\(record.backtrace)")
                }
                let syscalls = detected.map(\.threadSyscall)
                #expect(syscalls == ["", "clock_nanosleep", "futex"], "the thread's system call when detected")
                #expect(settled.allSatisfy { $0["OBJECT_COMM"] == "StallmonEpollFi" }, "journald's trusted fields")
                // Counted by stallmond's collector like any stall, as the watched process's.
                let series = #"stallmon_stalls_total{unit="(StallmonEpollFi)"} 3"#
                #expect(
                    waitUntil(timeout: 10) {
                        (try? String(contentsOfFile: directory + "/stallmon.prom", encoding: .utf8))?.contains(series)
                            == true
                    },
                    "\(String(describing: try? String(contentsOfFile: directory + "/stallmon.prom", encoding: .utf8)))")
            }
        }

        @Test(.requires(.bpf))
        func aProcessThatRunsItsOwnMonitorIsNotWatchedFromOutside() throws {
            let directory = try Self.prepareWatch()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            // The run-loop fixture, monitored by its own linked monitor for 4 s.
            let fixture = try Executable.fixture.start(["idle", "--seconds", "4"])
            defer { _ = fixture.terminate() }
            let pid = fixture.process.processIdentifier
            #expect(
                waitUntil(timeout: 10) {
                    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
                    return tasks.contains { tid in
                        (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8))
                            == "stallmon-watch\n"
                    }
                }, "the fixture's monitor did not start")
            let daemon = try Self.startStallmond(watching: Executable.fixture.url.path, directory: directory)
            defer { _ = daemon.terminate() }
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("watch names no running process") },
                "\(daemon.errorsSoFar)")
            #expect(!daemon.errorsSoFar.contains("watching a process from outside"))
            Thread.sleep(forTimeInterval: 2.5)
            #expect(Self.occurrences(of: "watch names no running process", in: daemon.errorsSoFar) == 1, "said once")
        }

        /// A stall is looked at through its course, not only when it is detected: one that spins
        /// past the threshold and then sleeps for most of its time is detected on the CPU, and its
        /// ended entry shows the sleep, where its time went, with every stack seen and its count.
        @Test(.requires(.bpf))
        func aStallThatMovesOnIsReportedWhereItsTimeWent() throws {
            try Self.withWatchedEpollService { service, daemon, _ in
                // 200 ms on the CPU, then 600 ms in nanosleep; stallmond looks every 50 ms.
                _ = try service.stall("spinsleep", milliseconds: 800)
                let entries = try Journald.host.entries(
                    ["STALL_SOURCE=external", "OBJECT_PID=\(service.pid)"], atLeast: 2, timeout: 10)
                #expect(daemon.process.isRunning, "\(daemon.errorsSoFar)")
                let records = try entries.map { try StallRecord(journalFields: $0) }
                let detected = try #require(records.first { $0.event == .detected }, "\(daemon.errorsSoFar)")
                let ended = try #require(records.first { $0.event == .ended })
                #expect(detected.threadSyscall == "", "on the CPU when detected")
                #expect(detected.stackSource == "perf", "\(detected.backtrace)")
                #expect(detected.samples == 1)
                #expect(ended.stackSource == "kernel", "the heaviest stack is the sleep's: \(ended.backtrace)")
                #expect(ended.backtrace.contains("__nanosleep"), "\(ended.backtrace)")
                #expect(ended.frame.hasPrefix("run (main.c:"), "\(ended.frame)")
                #expect(ended.samples >= 6, "looks through 600 ms of sleep: \(ended.samples)")
                #expect(ended.stackSamples * 2 > ended.samples, "\(ended.stackSamples) of \(ended.samples)")
                #expect(
                    ended.sampledStacks.stacks.count >= 2, "the spin's stack and the sleep's: \(ended.sampledStacks)")
                #expect(ended.sampledStacks.totalSamples == ended.samples - ended.samplesUnanswered)
            }
        }

        @Test(.requires(.bpf))
        func aLoopThatWaitsInIOUringEnterIsWatchedToo() throws {
            try Self.withWatchedEpollService(arguments: ["--io-uring"]) { service, _, _ in
                // A loop from its first wait on: one quick command first, then the stall.
                try service.stall("spin", milliseconds: 1)
                let truth = try service.stall("sleep", milliseconds: 200)
                let ended = try Journald.host.entries(
                    ["STALL_SOURCE=external", "OBJECT_PID=\(service.pid)", "STALL_EVENT=ended"], atLeast: 1)
                try #require(ended.count == 1)
                let record = try StallRecord(journalFields: ended[0])
                let reported = Duration.microseconds(Int64(record.durationMicroseconds))
                let error = reported > truth.duration ? reported - truth.duration : truth.duration - reported
                #expect(error <= .milliseconds(10), "reported \(reported), truth \(truth.duration)")
                #expect(record.loop == "uring-loop")
                #expect(record.frame.hasPrefix("run (main.c:"), "\(record.backtrace)")
            }
        }

        @Test(.requires(.bpf))
        func aServiceThatEndsInsideAStallHasThatStallEndedByItsExit() throws {
            try Self.withWatchedEpollService { service, _, _ in
                Thread.sleep(forTimeInterval: 0.2)
                // 300 ms on the CPU, then the process ends inside that tick (a watchdog's kill, a crash).
                service.input.fileHandleForWriting.write(Data("die 300\n".utf8))
                #expect(service.running.wait().status == 0)
                let ended = try Journald.host.entries(
                    ["STALL_SOURCE=external", "OBJECT_PID=\(service.pid)", "STALL_EVENT=ended"], atLeast: 1)
                try #require(ended.count == 1)
                let record = try StallRecord(journalFields: ended[0])
                #expect((295_000...330_000).contains(record.durationMicroseconds), "\(record.message)")
                #expect(record.message.contains("ended by the thread's exit"), "\(record.message)")
                #expect(record.loop == "epoll-loop", "named as it was seen at detection")
            }
        }

        @Test(.requires(.bpf))
        func aProcessThatStartsInAWatchedUnitIsWatchedWithinSeconds() throws {
            let directory = try Self.prepareWatch()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let prefix = "stallmon-watch-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let daemon = try Self.startStallmond(watching: prefix + "-*.service", directory: directory)
            defer { _ = daemon.terminate() }
            #expect(daemon.waitForOutput { _, errors in errors.contains("watch names no running process") })

            let unit = try UnitCgroup(name: prefix + "-web.service")
            defer { unit.remove() }
            let service = try EpollService()
            defer {
                service.stop()
                _ = service.running.wait()
            }
            try unit.move(service.pid)
            let started = Date()
            #expect(
                daemon.waitForOutput(timeout: 5) { _, errors in errors.contains("pid=\(service.pid) ") },
                "\(daemon.errorsSoFar)")
            #expect(Date().timeIntervalSince(started) < 2.5, "looked for every second")
            // Watched from its next wait on.
            Thread.sleep(forTimeInterval: 0.1)
            try service.stall("spin", milliseconds: 200)
            let entries = try Journald.host.entries(
                ["STALL_SOURCE=external", "OBJECT_PID=\(service.pid)", "STALL_EVENT=ended"], atLeast: 1)
            #expect(entries.count == 1)
        }

        /// The shipped unit with the shipped drop-in (systemd/stallmond-watch.conf) under a real
        /// systemd, in its own PID namespace, watching a unit: the stalls are the unit's, in
        /// journald's trusted fields, in `journalctl -u` and in stallmond's metrics.
        @Test(.requires(.bpf, .systemd))
        func underSystemdTheWatchDropInReportsAUnitsStallsAsTheUnits() throws {
            try #require(TestRequirement.mountTracefs(), "tracefs could not be mounted at /sys/kernel/tracing")
            let systemd = try SystemdNamespace.started()
            defer { systemd.stop() }
            try SystemdTests.installExecutables(systemd)
            let fixture = try Data(contentsOf: Executable.epollFixture.url)
            try systemd.copy(fixture, to: "/usr/local/bin/StallmonEpollFixture", mode: 0o755)
            try systemd.install(unit: "stallmond.service", contents: try SystemdTests.file("systemd/stallmond.service"))
            try systemd.install(
                unit: "stallmond.service.d/watch.conf", contents: try SystemdTests.file("systemd/stallmond-watch.conf"))
            try SystemdTests.makeTextfileDirectory(systemd)
            let configuration =
                #"{"metrics_interval_s": 1, "cold_start_entries": 0, "watch": ["legacy.service"], "watch_threshold_ms": 100}"#
            try systemd.copy(Data(configuration.utf8), to: "/etc/stallmon/stallmond.json")
            try systemd.install(
                unit: "legacy.service",
                contents: """
                    [Unit]
                    Description=a service without stallmon

                    [Service]
                    ExecStart=/usr/local/bin/StallmonEpollFixture sleep:250,spin:300
                    """)
            try systemd.check(["systemctl", "start", "stallmond.service"])
            #expect(try systemd.property("ActiveState", of: "stallmond.service") == "active")
            try systemd.check(["systemctl", "start", "legacy.service"])

            let ended = try systemd.journal(
                matches: ["OBJECT_SYSTEMD_UNIT=legacy.service", "STALL_EVENT=ended"], atLeast: 2, timeout: 20)
            let stallmondLog = try systemd.run(["journalctl", "-u", "stallmond.service", "--no-pager"]).output
            try #require(ended.count == 2, "\(stallmondLog)")
            #expect(ended.allSatisfy { $0["STALL_SOURCE"] == "external" && $0["_SYSTEMD_UNIT"] == "stallmond.service" })
            #expect(
                ended.map { $0["STALL_STACK_SOURCE"] } == ["kernel", "perf"], "\(ended.map { $0["STALL_BACKTRACE"] })")
            let unitLog = try systemd.check(["journalctl", "-u", "legacy.service", "-o", "json", "--no-pager"])
            #expect(Journald.entries(json: unitLog).filter { $0["STALL_SOURCE"] == "external" }.count == 4)
            let series = #"stallmon_stalls_total{unit="legacy.service"} 2"#
            func metrics() -> String {
                (try? systemd.run(["cat", "/var/lib/prometheus/node-exporter/stallmon.prom"]).output) ?? ""
            }
            #expect(waitUntil(timeout: 10) { metrics().contains(series) }, "\(metrics())")
        }

        @Test(.requires(.bpf, .tool(["setpriv"], package: "util-linux")))
        func withoutCapBPFStallmondSaysOnceWhatToGrantAndKeepsCollecting() throws {
            let directory = try Self.prepareWatch()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let service = try EpollService()
            defer { service.stop() }
            // Root, less what BPF needs: the kernel refuses the program.
            let daemon = try Self.startStallmond(
                watching: Executable.epollFixture.url.path, directory: directory,
                setprivArguments: ["--bounding-set=-bpf,-perfmon,-sys_admin"])
            defer { _ = daemon.terminate() }
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("caught up with the journal") },
                "stallmond goes on collecting: \(daemon.errorsSoFar)")
            try service.stall("spin", milliseconds: 300)
            Thread.sleep(forTimeInterval: 1.5)
            let log = daemon.errorsSoFar
            #expect(Self.occurrences(of: "cannot watch from outside", in: log) == 1, "\(log)")
            #expect(log.contains("grant it CAP_BPF and CAP_PERFMON (AmbientCapabilities=CAP_BPF CAP_PERFMON)"))
            #expect(!log.contains("libbpf"), "one line of stallmond's, not libbpf's own")
            #expect(daemon.process.isRunning)
            #expect(try Self.externalEntries(of: service.pid).isEmpty)
        }
    }
}
