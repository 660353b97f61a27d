import Dispatch
import Foundation
import Logging
import StallConfiguration
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where reading starts on each source machine: the machines found in the journal files, each
/// reader positioned after the machine's saved position, a start without one (the cold start and
/// its skipped entries), and a seek past the last entry read.
extension Collector {
    /// Machines are looked up in the files at most this many at a time (a bound on memory: the
    /// number of machines a journal directory holds is the number of positions kept).
    static let maximumMachines = 100_000

    /// Adds the machines whose entries appeared since the last look, in each reader's files.
    func discoverMachines() throws(SystemdError) {
        for (index, reader) in readers.enumerated() {
            guard let reader else { continue }
            for id in try reader.uniqueValues(of: "_MACHINE_ID", limit: Self.maximumMachines)
            where !knownMachines.contains(id) && knownMachines.count < Self.maximumMachines {
                // A machine in two directories is read from the first only: its entries count once.
                knownMachines.insert(id)
                machines.append((id, index))
                if let legacyCursor { aggregator.adopt(cursor: legacyCursor, for: id) }
            }
        }
        if readers.allSatisfy({ $0 != nil }) { legacyCursor = nil }
    }

    /// Points the machine's reader at the entry after the last one read from that machine (or
    /// at the start, or, for a state saved before positions were kept per machine, after its one
    /// cursor), matching only that machine's stall entries.
    func position(on machine: String, reader index: Int) throws(SystemdError) {
        if positioned[index] == machine { return }
        guard let reader = readers[index] else { return }
        positioned[index] = nil
        reader.flushMatches()
        for messageID in [MessageID.stallEnded, MessageID.watchdogStall, MessageID.reportsSuppressed] {
            try reader.addMatch("MESSAGE_ID", messageID)
        }
        try reader.addMatch("_MACHINE_ID", machine)
        let state = aggregator.state
        if let source = state.sources[machine], source.cursor.isEmpty {
            // Its cursor was refused earlier, and no entry of it has been read since.
            try seek(after: source, reader: reader)
        } else if let source = state.sources[machine] {
            do {
                // A position adopted from a state's one cursor (no boot of its own) may name
                // another machine's entry: only a machine's own last entry can have vanished.
                if try !reader.seek(cursor: source.cursor), !source.bootID.isEmpty {
                    aggregator.noteCursorRecovery(rejected: false, machine: machine)
                    unsaved = true
                    metricsStale = true
                    logger.warning(
                        "the journal no longer holds the last entry read from this machine (vacuumed?); resuming at the first entry after it",
                        metadata: ["machine": "\(machine)", "cursor": "\(DisplayText.escaped(source.cursor))"])
                }
            } catch  where error.errno == EINVAL {
                try resume(after: source, machine: machine, reader: reader, error: error)
            }
        } else {
            try coldStart(on: machine, reader: index)
        }
        positioned[index] = machine
    }

    /// Positions a machine that has no saved position (a first start, a deleted state, a machine
    /// new to the journal) on its recent entries only: those of the longest window, at most
    /// ``CollectorConfiguration/coldStartEntries`` of them. Whatever the journal holds (a user can
    /// write a million entries beforehand), the start reads that many and is current within
    /// seconds. The last entry left unread becomes the machine's position, so that a restart
    /// before any entry is read skips the same ones; how many were left unread is counted apart.
    func coldStart(on machine: String, reader index: Int) throws(SystemdError) {
        guard let reader = readers[index] else { return }
        let longest = UInt64(configuration.windows.max()?.microseconds ?? 0)
        let now = Self.realtimeMicroseconds()
        let horizon = now > longest ? now - longest : 0
        // The last entry before the newest coldStartEntries, if it is inside the window…
        var lastSkipped: JournalEntry?
        try reader.seekTail()
        let kept = configuration.coldStartEntries
        if try reader.skipBackward(kept + 1) == kept + 1 {
            lastSkipped = try reader.currentEntry()
        }
        // …else the last entry received before the window, if any.
        if lastSkipped.map({ $0.realtimeMicroseconds < horizon }) ?? true {
            try reader.seek(realtimeMicroseconds: horizon)
            lastSkipped = try reader.previous()
        }
        guard let lastSkipped else {
            try reader.seekHead()
            return
        }
        aggregator.start(after: lastSkipped, machine: machine)
        unsaved = true
        try reader.seek(cursor: lastSkipped.cursor)
        logger.notice(
            "no saved position for this machine: reading its entries of the last \(StallAggregator.describe(.microseconds(Int64(longest)))), at most the newest \(kept) (cold_start_entries); counting the older ones as skipped",
            metadata: ["machine": "\(machine)"])
        countSkipped(through: lastSkipped.cursor, machine: machine, reader: index)
    }

    /// Counts, off the main loop with a reader of its own, the machine's entries up to the one at
    /// `cursor` (included), and adds them to ``CollectorState/skippedEntries``: moving over an entry
    /// reads none of its fields, but a journal of millions of entries still takes a while.
    private func countSkipped(through cursor: String, machine: String, reader index: Int) {
        let directory = directories.isEmpty ? nil : directories[index]
        let logger = logger
        let messageIDs = [MessageID.stallEnded, MessageID.watchdogStall, MessageID.reportsSuppressed]
        let done: @Sendable (Int) -> Void = { [self] count in
            DispatchQueue.main.async { [self] in
                aggregator.noteSkipped(count)
                unsaved = true
                metricsStale = true
                logger.notice(
                    "skipped \(count) older entries of this machine (stallmond_skipped_entries_total)",
                    metadata: ["machine": "\(machine)"])
            }
        }
        skipCounting.async {
            do {
                let counter: JournalReader
                if let directory {
                    counter = try JournalReader(directory: directory)
                } else {
                    counter = try JournalReader()
                }
                for messageID in messageIDs { try counter.addMatch("MESSAGE_ID", messageID) }
                try counter.addMatch("_MACHINE_ID", machine)
                guard try counter.seek(cursor: cursor) else { return done(0) }
                var count = 1
                while true {
                    let moved = try counter.skipBackward(1 << 20)
                    count += moved
                    if moved < 1 << 20 { break }
                }
                done(count)
            } catch {
                logger.warning(
                    "counting the entries a start skipped failed",
                    metadata: ["machine": "\(machine)", "error": "\(error)"])
            }
        }
    }

    /// A saved cursor the journal refuses (a damaged or hand-edited state): reading resumes after
    /// the machine's last entry by its boot and monotonic time, the entries up to it being
    /// recognized as read (see ``StallAggregator/ingest(_:)``), or, without them, from the time of
    /// the last entry counted. Never a daemon that reports ready and counts nothing.
    func resume(
        after source: CollectorState.Source, machine: String, reader: JournalReader, error: SystemdError
    ) throws(SystemdError) {
        let since = try seek(after: source, reader: reader)
        aggregator.noteCursorRecovery(rejected: true, machine: machine)
        unsaved = true
        metricsStale = true
        logger.error(
            "the journal rejects the saved cursor of this machine; resuming after its last entry read, from \(since)",
            metadata: [
                "machine": "\(machine)", "cursor": "\(DisplayText.escaped(source.cursor))", "error": "\(error)",
            ])
    }

    /// Points `reader` after the last entry of `source` by its boot and monotonic time, or, where
    /// they are unknown, at the time of the last entry counted. Returns where, in words.
    @discardableResult
    func seek(after source: CollectorState.Source, reader: JournalReader) throws(SystemdError) -> String {
        if JournalEntry.isMachineID(source.bootID) {
            // Past the last entry read: the same boot at or before its time is read already
            // (``StallAggregator/ingest(_:)`` would take it for an entry received twice).
            try reader.seek(bootID: source.bootID, monotonicMicroseconds: source.monotonicMicroseconds &+ 1)
            return "boot \(source.bootID) at \(source.monotonicMicroseconds) µs"
        }
        let time = aggregator.state.lastEntryMicroseconds
        try reader.seek(realtimeMicroseconds: time)
        return "the time of the last entry counted (\(time) µs since the epoch)"
    }
}
