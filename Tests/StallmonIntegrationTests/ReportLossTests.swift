import Foundation
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// A journald that goes away, comes late or takes nothing loses no report without a count, and
    /// never holds up `stop()` for long. Each test runs a journald of its own (a journal namespace).
    @Suite
    struct ReportLossTests {
        /// Stall reports every 200 ms for `seconds`, to the namespace's journal.
        private static func streamArguments(_ journal: Journald, identifier: String, seconds: Double)
            -> [String]
        {
            [
                "--journal", "--journal-socket", journal.socketPath, "--identifier", identifier,
                "--threshold-ms", "40", "--stall-ms", "70", "--period-ms", "200", "--seconds", "\(seconds)",
            ]
        }

        /// The stall ids of ended reports printed on standard error by the fallback.
        private static func endedOnStandardError(_ run: FixtureRun) -> Set<String> {
            var ids = Set<String>()
            for line in run.standardError.split(separator: "\n") {
                // "stallmon[pid]:   stall <id> ended: …"
                let words = line.split(separator: " ")
                if let index = words.firstIndex(of: "stall"), index + 2 < words.count, words[index + 2] == "ended:" {
                    ids.insert(String(words[index + 1]))
                }
            }
            return ids
        }

        @Test func reportsGoToStandardErrorWhileJournaldIsDownAndBackToTheJournalAfter() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.start(), "cannot start a journald")
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run(
                "stream",
                arguments: Self.streamArguments(journal, identifier: identifier, seconds: 5)
                    + ["--journal-fallback"]
            ) { _ in
                usleep(1_500_000)
                journal.signal(SIGKILL)
                usleep(1_500_000)
                _ = journal.start()
            }
            #expect(run.exitStatus == 0)
            let ended = Set(run.ended.map { $0.string("STALL_ID") })
            let inJournal = Set(
                try journal.entries(
                    ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)"], atLeast: ended.count,
                    timeout: 5
                ).compactMap { $0["STALL_ID"] })
            let onStandardError = Self.endedOnStandardError(run)
            #expect(ended.count >= 15, "\(ended.count) stalls")
            #expect(!onStandardError.isEmpty, "no report fell back to standard error")
            #expect(inJournal.isDisjoint(with: onStandardError))
            // Each report is in the journal or on standard error, and the journal has reports from
            // after journald came back.
            #expect(ended.subtracting(inJournal).subtracting(onStandardError).isEmpty)
            let lastEnded = try #require(run.ended.last?.string("STALL_ID"))
            #expect(inJournal.contains(lastEnded))
            let stopped = try #require(run.stopped.first)
            #expect(stopped["lost"] as? Int == 0)
        }

        @Test func journalSinkWithoutFallbackCountsWhatJournaldDidNotTake() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.start(), "cannot start a journald")
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run(
                "stream", arguments: Self.streamArguments(journal, identifier: identifier, seconds: 3)
            ) { _ in
                usleep(1_500_000)
                journal.signal(SIGKILL)
            }
            #expect(run.exitStatus == 0)
            // Everything before `stopped` went to the journal sink: started, detected and ended reports.
            let sent = 1 + run.detected.count + run.ended.count
            _ = try journal.entries(["SYSLOG_IDENTIFIER=\(identifier)"], timeout: 2)
            let taken = try journal.entries(["SYSLOG_IDENTIFIER=\(identifier)"], atLeast: sent, timeout: 1).count
            let stopped = try #require(run.stopped.first)
            let lost = try #require(stopped["lost"] as? Int)
            #expect(lost > 0)
            // journald may die holding one entry it had read but not written, or one still in its
            // socket's queue: the kernel took it, so the sender cannot know.
            #expect(
                (sent - taken - 1...sent - taken).contains(lost),
                "sent \(sent), journal took \(taken), counted lost \(lost)")
            #expect(stopped.string("MESSAGE").contains("\(lost) lost"))
        }

        @Test func sinkMadeBeforeJournaldStartsWritesToTheJournalOnceItListens() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            var started = false
            let run = try FixtureRun.run(
                "stream",
                arguments: Self.streamArguments(journal, identifier: identifier, seconds: 3.5)
                    + ["--journal-fallback"]
            ) { _ in
                usleep(1_500_000)
                started = journal.start()
            }
            try #require(started, "cannot start a journald")
            #expect(run.exitStatus == 0)
            let ended = Set(run.ended.map { $0.string("STALL_ID") })
            let inJournal = Set(
                try journal.entries(
                    ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)"], timeout: 5
                ).compactMap { $0["STALL_ID"] })
            let onStandardError = Self.endedOnStandardError(run)
            #expect(!inJournal.isEmpty, "nothing reached the journal after journald started")
            #expect(!onStandardError.isEmpty, "nothing went to standard error before journald started")
            #expect(ended == inJournal.union(onStandardError))
            #expect(run.stopped.first?["lost"] as? Int == 0)
        }

        @Test func stopReturnsQuicklyWhileJournaldTakesNothing() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.start(), "cannot start a journald")
            journal.signal(SIGSTOP)
            #expect(journal.fillQueue() > 0)
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run(
                "stream",
                arguments: Self.streamArguments(journal, identifier: identifier, seconds: 2)
                    + ["--journal-fallback"]
            )
            #expect(run.exitStatus == 0)
            let stop = try #require(run.lines.first { $0["type"] as? String == "stop" })
            // One send timeout (100 ms) at most, then the reports go to standard error.
            #expect(stop.number("duration_ns") / 1e6 < 500, "stop() took \(stop.number("duration_ns") / 1e6) ms")
            let ended = Set(run.ended.map { $0.string("STALL_ID") })
            #expect(!ended.isEmpty)
            #expect(ended == Self.endedOnStandardError(run))
            #expect(run.stopped.first?["lost"] as? Int == 0)
        }
    }
}
