import Foundation
import Logging
import StallCollector
import StallJournal
import StallMonitor
import StallmonTestSupport
import Testing

/// Many hosts, one collector: hosts counted and bounded, entries received twice counted once, and
/// journal directories holding several machines' files read from one position per machine.
struct FleetTests {
    static let boot = "0123456789abcdef0123456789abcdef"

    static func machine(_ number: Int) -> String {
        String(format: "%032x", number + 1)
    }

    /// A stall entry of `machine`, as journal-remote keeps it: its host, machine, boot and times.
    /// An hour ago, in microseconds of the wall clock: the entries lie inside the collector's longest
    /// window, which is all a cold start reads back (`cold_start_entries`).
    static let recently = UInt64(Date().timeIntervalSince1970 * 1e6) - 3_600_000_000

    static func entry(
        machine: String, host: String, monotonic: UInt64, boot: String = FleetTests.boot,
        fingerprint: String = "aaaaaaaaaaaaaaaa", cursor: String = "c"
    ) -> JournalEntry {
        var entry = Entries.entry(fingerprint: fingerprint, time: recently + monotonic, cursor: cursor)
        entry.fields["_MACHINE_ID"] = machine
        entry.fields["_HOSTNAME"] = host
        entry.bootID = boot
        entry.monotonicMicroseconds = monotonic
        return entry
    }

    @Test func hostsAreCountedPerMachineAndFoldedPastTheLimit() throws {
        var configuration = CollectorConfiguration()
        configuration.maximumHosts = 3
        var aggregator = StallAggregator(configuration: configuration)
        // Five machines, two stalls each, all of one fingerprint; machine 4 shares machine 0's name.
        for round in 0..<2 {
            for number in 0..<5 {
                aggregator.ingest(
                    Self.entry(
                        machine: Self.machine(number), host: number == 4 ? "host-0" : "host-\(number)",
                        monotonic: UInt64(round * 10 + number + 1)))
            }
        }
        let state = aggregator.snapshot()
        #expect(state.hosts.count == 4, "3 hosts of their own and (other hosts)")
        #expect(state.hosts[Self.machine(0)]?.stalls == 2)
        #expect(state.hosts[Self.machine(2)]?.name == "host-2")
        #expect(state.hosts[CollectorState.otherHosts]?.stalls == 4)
        #expect(state.foldedHostStalls == 4)
        let fingerprint = try #require(state.units["foo.service"]?.fingerprints["aaaaaaaaaaaaaaaa"])
        #expect(fingerprint.stalls == 10)
        #expect(fingerprint.hostCount == 4, "3 hosts and the other-hosts bucket")
        #expect(state.sources.count == 5, "a position for every machine read, folded or not")

        let text = PrometheusTextfile.render(
            state, windows: [.seconds(300)], now: 1_000_000_100, aggregator: aggregator)
        let hostSeries = text.split(separator: "\n").filter { $0.hasPrefix("stallmon_host_stalls_total{") }
        #expect(hostSeries.count == 4)
        #expect(text.contains(#"stallmon_host_stalls_total{host="host-1",machine_id="\#(Self.machine(1))"} 2"#))
        #expect(text.contains(#"stallmon_host_stalls_total{host="(other hosts)",machine_id=""} 4"#))
        #expect(text.contains(#"stallmon_fingerprint_hosts{unit="foo.service",fingerprint="aaaaaaaaaaaaaaaa"} 4"#))
        #expect(text.contains(#"stallmond_folded_stalls_total{what="host"} 4"#))

        // The state keeps all of it across a restart.
        let decoded = try JSONDecoder().decode(CollectorState.self, from: try JSONEncoder().encode(state))
        #expect(decoded == state)
    }

    @Test func anEntryReceivedTwiceIsCountedOnce() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        let a = Self.machine(0)
        let b = Self.machine(1)
        #expect(aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 100, cursor: "a1")) != .duplicate)
        #expect(aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 200, cursor: "a2")) != .duplicate)
        // An uploader that died before its batch was confirmed sends it again.
        #expect(aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 100, cursor: "a3")) == .duplicate)
        #expect(aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 200, cursor: "a4")) == .duplicate)
        // Another machine at the same time, a later entry, and a new boot are new.
        #expect(aggregator.ingest(Self.entry(machine: b, host: "b", monotonic: 100, cursor: "b1")) != .duplicate)
        #expect(aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 201, cursor: "a5")) != .duplicate)
        #expect(
            aggregator.ingest(Self.entry(machine: a, host: "a", monotonic: 5, boot: String(repeating: "e", count: 32)))
                != .duplicate)
        let state = aggregator.state
        #expect(state.hosts[a]?.stalls == 4)
        #expect(state.hosts[b]?.stalls == 1)
        #expect(state.duplicateEntries == 2)
        #expect(state.units["foo.service"]?.stalls == 5)
        #expect(state.sources[b]?.cursor == "b1")
    }

    /// journal-remote's output: one journal file per host in one directory, written by the real
    /// `systemd-journal-remote` from the export format (with the sender's times, boot and machine).
    struct RemoteDirectory {
        let path = NSTemporaryDirectory() + "stallmon-fleet-\(getpid())-\(UInt32.random(in: .min ... .max))"

        /// Appends `entries` to `remote-NAME.journal`.
        func append(_ entries: [JournalEntry], file name: String) throws {
            var export = ""
            for entry in entries {
                export += "__REALTIME_TIMESTAMP=\(entry.realtimeMicroseconds)\n"
                export += "__MONOTONIC_TIMESTAMP=\(entry.monotonicMicroseconds)\n"
                export += "_BOOT_ID=\(entry.bootID)\n"
                for (field, value) in entry.fields.sorted(by: { $0.key < $1.key }) {
                    precondition(!value.contains("\n"))
                    export += "\(field)=\(value)\n"
                }
                export += "\n"
            }
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: try ExternalTool.required(.journalRemote))
            process.arguments = ["--output=\(path)/remote-\(name).journal", "--split-mode=none", "-"]
            let input = Pipe()
            process.standardInput = input
            process.standardError = FileHandle.nullDevice
            try process.run()
            input.fileHandleForWriting.write(Data(export.utf8))
            try input.fileHandleForWriting.close()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
        }

        func remove() { try? FileManager.default.removeItem(atPath: path) }
    }

    /// Host b's entries reach the central host after host a's later ones (its uploader was down):
    /// one journal over both files sorts them before the position a's entries reached. Read from
    /// one position per machine, across restarts, every stall counts once.
    @Test(.requires(.journalRemote)) func lateEntriesOfAnotherHostAreCountedAcrossRestarts() throws {
        let remote = RemoteDirectory()
        defer { remote.remove() }
        let state = remote.path + "/state"
        var configuration = CollectorConfiguration()
        configuration.journalDirectories = [remote.path]
        configuration.stateDirectory = state
        configuration.metricsPath = ""
        let (a, b) = (Self.machine(0), Self.machine(1))
        func run() throws -> CollectorState {
            let collector = try Collector(configuration: configuration, logger: Logger(label: "test"))
            collector.catchUp()
            collector.stop()
            return collector.state
        }

        try remote.append((10...12).map { Self.entry(machine: a, host: "a", monotonic: $0 * 1_000_000) }, file: "a")
        #expect(try run().hosts[a]?.stalls == 3)

        // Older than everything of a's, arriving after it.
        try remote.append((1...2).map { Self.entry(machine: b, host: "b", monotonic: $0 * 1_000_000) }, file: "b")
        try remote.append([Self.entry(machine: a, host: "a", monotonic: 13_000_000)], file: "a")
        var counted = try run()
        #expect(counted.hosts[a]?.stalls == 4)
        #expect(counted.hosts[b]?.stalls == 2)

        // b's uploader sends its last entry again, then more (still older than a's).
        try remote.append(
            [2, 3, 4].map { Self.entry(machine: b, host: "b", monotonic: $0 * 1_000_000) }, file: "b")
        counted = try run()
        #expect(counted.hosts[a]?.stalls == 4)
        #expect(counted.hosts[b]?.stalls == 4)
        #expect(counted.duplicateEntries == 1)
        #expect(counted.units["foo.service"]?.stalls == 8)
        // Nothing new: a restart counts nothing again.
        #expect(try run() == counted)
    }

    /// A state saved when one cursor stood for every machine resumes after it, for the machines
    /// the journal held then; a machine that appears later is read from its beginning.
    @Test(.requires(.journalRemote)) func stateWithOneCursorResumesAfterIt() throws {
        let remote = RemoteDirectory()
        defer { remote.remove() }
        let (a, b) = (Self.machine(0), Self.machine(1))
        try remote.append((1...3).map { Self.entry(machine: a, host: "a", monotonic: $0 * 1_000_000) }, file: "a")
        let reader = try JournalReader(directory: remote.path)
        _ = try reader.next()
        let second = try #require(try reader.next())
        var configuration = CollectorConfiguration()
        configuration.journalDirectories = [remote.path]
        configuration.stateDirectory = remote.path + "/state"
        configuration.metricsPath = ""
        var earlier = CollectorState()
        earlier.cursor = second.cursor
        try StateStore(directory: remote.path + "/state").save(earlier)

        var collector = try Collector(configuration: configuration, logger: Logger(label: "test"))
        collector.catchUp()
        collector.stop()
        #expect(collector.state.hosts[a]?.stalls == 1, "only the entry after the saved cursor")

        try remote.append((1...2).map { Self.entry(machine: b, host: "b", monotonic: $0 * 1_000_000) }, file: "b")
        collector = try Collector(configuration: configuration, logger: Logger(label: "test"))
        collector.catchUp()
        collector.stop()
        #expect(collector.state.hosts[a]?.stalls == 1)
        #expect(collector.state.hosts[b]?.stalls == 2)
    }

    /// `stallmon report --directory` over journal-remote's files: one row for a fingerprint of
    /// three hosts, `--host` by name or machine id, and clear errors for what it cannot read.
    @Test(.requires(.journalRemote)) func reportReadsDirectoriesAndCountsHosts() throws {
        let remote = RemoteDirectory()
        defer { remote.remove() }
        for number in 0..<3 {
            let entries = (1...(number + 1)).map {
                Self.entry(machine: Self.machine(number), host: "host-\(number)", monotonic: UInt64($0) * 1_000_000)
            }
            try remote.append(entries, file: "host-\(number)")
        }
        func report(_ arguments: [String]) throws -> [StallGroup] {
            let run = try Executable.stallmon.run(["report", "--json"] + arguments)
            #expect(run.status == 0, "\(run.errors)")
            return try JSONDecoder().decode([StallGroup].self, from: Data(run.output.utf8))
        }
        let all = try report(["--directory", remote.path])
        #expect(all.map(\.count) == [6])
        #expect(all.map(\.hosts) == [3])
        let one = try report(["-D", remote.path, "--host", "host-2"])
        #expect(one.map(\.count) == [3])
        #expect(one.map(\.hosts) == [1])
        #expect(try report(["--directory", remote.path, "--host", Self.machine(1)]).map(\.count) == [2])
        #expect(try report(["--directory", remote.path, "--host", "nowhere"]).isEmpty)

        let table = try Executable.stallmon.run(["report", "--directory", remote.path])
        #expect(table.output.hasPrefix("UNIT         FINGERPRINT       COUNT  HOSTS"))

        let missing = try Executable.stallmon.run(["report", "--directory", remote.path + "/missing"])
        #expect(missing.status == 69)
        #expect(missing.errors.contains("is not a directory"))
        let conflicting = try Executable.stallmon.run(["report", "--directory", remote.path, "--merge"])
        #expect(conflicting.status == 64)
    }
}
