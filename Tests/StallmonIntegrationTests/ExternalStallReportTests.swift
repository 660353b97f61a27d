import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// What `stallmon report` and `follow` make of a stall stallmond saw from outside, through a
    /// real journald: written by root in stallmond's unit with `STALL_SOURCE=external` and
    /// `OBJECT_PID=` a process of the watched unit, it is shown as that unit's and that process's,
    /// marked as seen from outside; the same fields written by a user are the user's own stall.
    @Suite
    struct ExternalStallReportTests {
        /// A process in the cgroup of system unit `unit`, for journald to read its `OBJECT_` fields from.
        static func startProcess(in unit: String) throws -> Process {
            let moves = try JournalWriters.systemUnitCgroups(unit).map { "echo $$ > \($0)/cgroup.procs" }
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", "\(moves.joined(separator: " && ")) && exec /bin/sleep 60"]
            try process.run()
            let comm = "/proc/\(process.processIdentifier)/comm"
            try #require(
                waitUntil(timeout: 5) {
                    (try? String(contentsOfFile: comm, encoding: .utf8))?.hasPrefix("sleep") == true
                }, "the watched process did not start")
            return process
        }

        /// An ended stall as stallmond writes one it saw in process `pid`.
        static func externalStall(pid: Int32, fingerprint: String) -> [(String, String)] {
            var record = StallRecord(
                event: .ended,
                message: "event loop epoll-loop of legacy-server (PID \(pid)) stalled 250 ms, seen from outside",
                stallID: (0..<4).map { _ in String(format: "%08x", UInt32.random(in: 0...UInt32.max)) }.joined(),
                durationMicroseconds: 250_000, thresholdMicroseconds: 100_000, activity: "event-loop-cycle",
                runLoopMode: "", callout: "unknown", loop: "epoll-loop", threadID: Int(pid), threadState: "S",
                threadSyscall: "clock_nanosleep", threadWaitChannel: "", cpuMicroseconds: 72, samples: 1,
                samplesUnanswered: 0, stackSamples: 1, fingerprint: fingerprint, frame: "run (main.c:59)",
                backtrace: "#0 run (main.c:59)", priority: 4, syslogIdentifier: "legacy-server")
            record.stackSource = "kernel"
            record.source = .external
            return Entries.fields(of: record, overriding: ["OBJECT_PID": String(pid)])
        }

        @Test func reportAndFollowShowAnExternalStallAsTheWatchedUnitsMarkedAsSeenFromOutside() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let watched = "stallmon-legacy-\(getpid()).service"
            let stallmond = "stallmon-outside-\(getpid()).service"
            defer {
                JournalWriters.removeSystemUnit(watched)
                JournalWriters.removeSystemUnit(stallmond)
            }
            let service = try Self.startProcess(in: watched)
            defer {
                // SIGKILL: the tests' own mask, which the process inherited, may block SIGTERM.
                kill(service.processIdentifier, SIGKILL)
                service.waitUntilExit()
            }
            let pid = service.processIdentifier
            try JournalWriters.send(
                [Self.externalStall(pid: pid, fingerprint: "00000000000e0e0e")], to: journal.socketPath,
                as: .systemUnit(stallmond))
            // A user writing the same fields writes its own stall: not the unit's, not marked.
            try JournalWriters.send(
                [
                    Self.externalStall(pid: pid, fingerprint: "000000000000bad0")
                        + [("OBJECT_SYSTEMD_UNIT", watched)]
                ], to: journal.socketPath, as: .nobody)
            try #require(journal.waitForEntries(2, messageIDs: [MessageID.stallEnded]))
            let written = try journal.read(["STALL_SOURCE=external", "_UID=0"])
            try #require(written.count == 1 && written.first?["OBJECT_SYSTEMD_UNIT"] == watched, "\(written)")
            #expect(written.first?["_SYSTEMD_UNIT"] == stallmond)

            // report: the unit's row, marked; the user's row is the user's.
            let table = try Executable.stallmon.run(["report", "--namespace", journal.name])
            #expect(table.status == 0, "\(table.errors)")
            let lines = table.output.split(separator: "\n").map(String.init)
            #expect(lines.count == 3, "\(table.output)")
            let row = try #require(lines.first { $0.contains("00000000000e0e0e") })
            #expect(row.hasPrefix("\(watched) (seen from outside)  "), "\(row)")
            #expect(!table.output.contains(stallmond))
            let forged = try #require(lines.first { $0.contains("000000000000bad0") })
            #expect(forged.hasPrefix("(legacy-server) (uid 65534)  "), "\(forged)")

            let json = try Executable.stallmon.run(["report", "--namespace", journal.name, "--json"])
            #expect(json.status == 0, "\(json.errors)")
            let groups = try JSONDecoder().decode([StallGroup].self, from: Data(json.output.utf8))
            #expect(groups.first { $0.fingerprint == "00000000000e0e0e" }?.unit == watched)
            #expect(groups.first { $0.fingerprint == "00000000000e0e0e" }?.seenFromOutside == 1)
            #expect(groups.first { $0.fingerprint == "000000000000bad0" }?.seenFromOutside == nil)

            // --unit: the watched unit has it; stallmond's unit, which wrote it, does not.
            let unit = try Executable.stallmon.run(["report", "--namespace", journal.name, "--unit", watched])
            #expect(unit.status == 0, "\(unit.errors)")
            #expect(unit.output.split(separator: "\n").count == 2, "\(unit.output)")
            #expect(unit.output.contains("00000000000e0e0e") && !unit.output.contains("000000000000bad0"))
            let writer = try Executable.stallmon.run(["report", "--namespace", journal.name, "--unit", stallmond])
            #expect(writer.status == 0, "\(writer.errors)")
            #expect(writer.output == "no stalls\n", "\(writer.output)")

            // follow: the unit and the watched process's PID, marked.
            let follow = try Executable.stallmon.start(["follow", "--namespace", journal.name, "--lines", "2"])
            defer { if follow.process.isRunning { _ = follow.terminate() } }
            #expect(follow.waitForOutput { output, _ in output.split(separator: "\n").count >= 2 })
            let followed = follow.terminate()
            #expect(followed.status == 0, "\(followed.errors)")
            let external = try #require(
                followed.output.split(separator: "\n").map(String.init).first { $0.contains("[00000000000e0e0e]") })
            #expect(external.contains(" stalled  \(watched)[\(pid)] (seen from outside): event loop epoll-loop"))
            let user = try #require(
                followed.output.split(separator: "\n").map(String.init).first { $0.contains("[000000000000bad0]") })
            #expect(user.contains(" (legacy-server) (uid 65534)[") && !user.contains("seen from outside]"))
            #expect(!user.contains("(seen from outside):"), "\(user)")

            let byUnit = try Executable.stallmon.start([
                "follow", "--namespace", journal.name, "--lines", "5", "--unit", watched, "--json",
            ])
            defer { if byUnit.process.isRunning { _ = byUnit.terminate() } }
            #expect(byUnit.waitForOutput { output, _ in output.contains("\n") })
            usleep(500_000)  // anything else it would print
            let objects = byUnit.terminate().output.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: String]
            }
            #expect(objects.count == 1, "\(objects)")
            let object = try #require(objects.first)
            #expect(object["STALL_SOURCE"] == "external")
            #expect(object["OBJECT_PID"] == String(pid))
            #expect(object["OBJECT_SYSTEMD_UNIT"] == watched)
            #expect(object["_SYSTEMD_UNIT"] == stallmond && object["_UID"] == "0")

            let writerFollow = try Executable.stallmon.start([
                "follow", "--namespace", journal.name, "--lines", "5", "--unit", stallmond,
            ])
            defer { if writerFollow.process.isRunning { _ = writerFollow.terminate() } }
            usleep(1_000_000)
            let nothing = writerFollow.terminate()
            #expect(nothing.status == 0 && nothing.output.isEmpty, "\(nothing.output)")
        }
    }
}
