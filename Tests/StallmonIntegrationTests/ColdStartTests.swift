import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond started with no state behind a journal that a user filled beforehand, on a
    /// journald of the test's own.
    @Suite
    struct ColdStartTests {
        /// `nobody` writes 100,000 stall entries, then a system unit stalls once. A stallmond with no
        /// state reads back only the newest `cold_start_entries` (10,000), counts the service's
        /// stall within seconds, counts the 90,001 it left unread, counts a new stall at once, and
        /// a restart reads nothing twice and skips nothing again.
        @Test func aColdStartBehindAHundredThousandEntriesReadsTheNewestAndCountsTheRest() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let flood = Process()
            flood.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            flood.arguments = [
                "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                Repository.root.appendingPathComponent("Scripts/journal-flood.py").path, "--count", "100000",
                "--socket", journal.socketPath,
            ]
            flood.standardOutput = FileHandle.nullDevice
            try flood.run()
            flood.waitUntilExit()
            try #require(flood.terminationStatus == 0)
            let unit = "stallmon-cold-\(getpid()).service"
            defer { JournalWriters.removeSystemUnit(unit) }
            try JournalWriters.send(
                [Serial.HostileWriterTests.stall("real", fingerprint: 1)], to: journal.socketPath,
                as: .systemUnit(unit))
            try #require(
                journal.waitForEntries(100_001, messageIDs: [MessageID.stallEnded], timeout: 180),
                "journald did not keep the 100,001 entries")

            let scratch = try Serial.HostileWriterTests.Daemon(journal: try #require(journal.directory))
            defer { scratch.remove() }
            let service = #"stallmon_stalls_total{unit="\#(unit)"}"#
            let flooder = #"stallmon_stalls_total{unit="(flood) (uid 65534)"}"#
            let skipped = "stallmond_skipped_entries_total"
            var daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            defer { if daemon.process.isRunning { _ = daemon.terminate() } }
            let started = Date()
            #expect(scratch.wait(service, toBe: 1, timeout: 60), "\(scratch.text)")
            let current = Date().timeIntervalSince(started)
            print("a cold start behind 100,001 entries counted the newest after \(String(format: "%.2f", current)) s")
            #expect(current < 10, "the service's stall counted \(current) s after start")
            #expect(scratch.wait(skipped, toBe: 90_001, timeout: 60), "\(scratch.text)")
            #expect(scratch.value(flooder) == 9_999)
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("cold_start_entries") }, "\(daemon.errorsSoFar)")

            // A stall written now is counted at once.
            try JournalWriters.send(
                [Serial.HostileWriterTests.stall("real", fingerprint: 1)], to: journal.socketPath,
                as: .systemUnit(unit))
            #expect(scratch.wait(service, toBe: 2, timeout: 10), "\(scratch.text)")
            #expect(daemon.terminate().status == 0)

            // Restarted with its state: nothing read twice, nothing skipped again.
            try FileManager.default.removeItem(atPath: scratch.metrics)
            daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            #expect(daemon.waitForOutput { _, errors in errors.contains("caught up with the journal") })
            #expect(scratch.wait(service, toBe: 2, timeout: 30), "\(scratch.text)")
            #expect(scratch.value(skipped) == 90_001)
            #expect(scratch.value(flooder) == 9_999)
            #expect(daemon.terminate().status == 0)
        }
    }
}
