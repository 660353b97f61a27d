import Dispatch
import Foundation
import Logging
import StallConfiguration
import StallJournal
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Follows the journal for stall reports from every unit and keeps the fleet view: aggregates in
/// the state directory (with the cursor they reflect), a Prometheus textfile and a periodic digest.
///
/// - Important: Confined to the main thread: the journal's descriptor is served by
///   `DispatchQueue.main`, which the main run loop drains. (`@unchecked Sendable` only so that
///   blocks on the main queue may hold it.)
package final class Collector: @unchecked Sendable {
    package private(set) var configuration: CollectorConfiguration
    var aggregator: StallAggregator
    private let store: StateStore
    /// One reader per journal directory (`nil` while the directory does not exist yet), or one
    /// for the local journal.
    var readers: [JournalReader?]
    /// The configured directories, by reader; empty for the local journal.
    let directories: [String]
    /// Each source machine, and the reader that holds its entries (the first that has any).
    var machines: [(id: String, reader: Int)] = []
    var knownMachines: Set<String> = []
    /// The machine whose entries each reader is positioned on (its matches name it).
    var positioned: [String?]
    /// The machine the next slice starts with, so that one busy machine cannot starve the others.
    private var nextMachine = 0
    /// Readers whose files changed since their machines were last read to the end: a pass over
    /// every machine costs a seek each, so an idle journal costs none.
    private var pending: [Bool]
    /// Timer ticks since every reader was last read to the end, whatever its descriptor said.
    private var ticksSinceFullPass = 0
    /// Every this many ticks (seconds), every reader is read, for changes no descriptor announced.
    static let fullPassTicks = 10
    /// The one cursor of a state saved before positions were kept per machine: the machines found
    /// at the first look start after it (later ones are new, and start at their beginning).
    var legacyCursor: String?
    private let writer = JournalWriter()
    let logger: Logger
    var unsaved = false
    var metricsStale = true
    private var lastMetricsWrite: UInt64 = 0
    private var lastDigest: UInt64
    var sources: [any DispatchSourceProtocol] = []
    /// Saves run here, off the main loop: encoding and writing a large state must not stall it.
    private let saveQueue = DispatchQueue(label: "stallmond.state")
    private let saving = SaveProgress()
    /// The metrics' and the state's text of each unit, kept from one write to the next.
    private let encoding = Encoding()
    /// Counts the entries a start without a saved position skipped (``coldStart(on:reader:)``).
    let skipCounting = DispatchQueue(label: "stallmond.skipped")
    /// A slice of the backlog is queued on the main queue.
    private var sliceQueued = false
    /// Entries read since start, until the reader first reached the end of the journal.
    private var backlog: Int? = 0
    /// Entries counted since start, for the status line.
    package private(set) var counted = 0
    /// Called on the main thread when the reader first reaches the end of the journal after start.
    package var caughtUp: (() -> Void)?

    /// At most this many entries are read in one turn of the main loop…
    static let sliceEntries = 1000
    /// …and for at most this long, so that a backlog of any size never stalls the loop.
    static let sliceNanoseconds: UInt64 = 20_000_000
    /// Saves are at least this far apart while entries keep coming (a restart re-reads what came
    /// after the last save, counted once: the cursor and the counts are saved together).
    static let saveIntervalNanoseconds: UInt64 = 2_000_000_000

    /// Opens the journal, loads the saved state and positions the reader after its cursor.
    /// - Throws: when the journal cannot be opened or the saved state cannot be read.
    package init(configuration: CollectorConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        self.store = StateStore(directory: configuration.resolvedStateDirectory())
        let state = try store.load()
        self.aggregator = StallAggregator(state: state, configuration: configuration)
        directories = configuration.journalDirectories
        if directories.isEmpty {
            readers = [try JournalReader()]
        } else {
            // systemd-journal-remote creates its directory at its first connection: a missing
            // one is waited for (see openDirectories()); any other failure is an error.
            var opened: [JournalReader?] = []
            for directory in directories {
                do {
                    opened.append(try JournalReader(directory: directory))
                } catch  where error.errno == ENOENT {
                    logger.notice(
                        "the journal directory does not exist yet; reading it once it does",
                        metadata: ["directory": "\(directory)"])
                    opened.append(nil)
                } catch {
                    throw OpenError(directory: directory, error: error)
                }
            }
            readers = opened
        }
        positioned = Array(repeating: nil, count: readers.count)
        pending = Array(repeating: true, count: readers.count)
        legacyCursor = state.sources.isEmpty ? state.cursor : nil
        self.lastDigest = MonotonicClock.now()
        logger.info(
            "collector state loaded",
            metadata: [
                "state": "\(store.path)", "units": "\(state.units.count)", "hosts": "\(state.hosts.count)",
                "journal":
                    "\(configuration.journalDirectories.isEmpty ? "local" : configuration.journalDirectories.joined(separator: ", "))",
                "resuming":
                    "\(state.cursor == nil ? "from the newest entries of each machine (cold_start_entries)" : "after the saved cursors (\(state.sources.count) machines)")",
            ])
    }

    /// A journal directory that could not be opened.
    package struct OpenError: Error, CustomStringConvertible {
        package var directory: String
        package var error: SystemdError
        package var description: String { "cannot open the journal directory \(directory): \(error)" }
    }

    package var state: CollectorState { aggregator.state }

    /// Whether the reader has not yet reached the end of the journal since start.
    package var isCatchingUp: Bool { backlog != nil }

    /// Reads every entry available now, in one go. Returns how many were read.
    @discardableResult
    package func catchUp() -> Int {
        pending = Array(repeating: true, count: readers.count)
        var read = 0
        while true {
            let slice = readSlice()
            read += slice.read
            if !slice.more { return read }
        }
    }

    /// Reads at most ``sliceEntries`` entries, for at most ``sliceNanoseconds``.
    /// - Returns: how many were read, and whether more may be waiting.
    private func readSlice() -> (read: Int, more: Bool) {
        let deadline = MonotonicClock.now() + Self.sliceNanoseconds
        var read = 0
        var more = false
        do {
            // Each machine from its own position: one journal over several machines' files has
            // one order across them, and entries of a machine that arrive late (its uploader was
            // down) sort before the position reached in the others, where a single cursor would
            // pass them by.
            if pending.contains(true) { try discoverMachines() }
            var visited = 0
            machinesLoop: while visited < machines.count {
                let (machine, index) = machines[nextMachine % machines.count]
                guard pending[index] else {
                    visited += 1
                    nextMachine = (nextMachine + 1) % machines.count
                    continue
                }
                try position(on: machine, reader: index)
                while let entry = try readers[index]?.next() {
                    read += 1
                    switch aggregator.ingest(entry) {
                    case .stall, .stallUpdated, .suppressed: counted += 1
                    case .ignored: break
                    case .duplicate:
                        logger.debug("skipping an entry received twice", metadata: ["cursor": "\(entry.cursor)"])
                    case .malformed(let error):
                        logger.warning(
                            "skipping a malformed stall entry",
                            metadata: ["cursor": "\(entry.cursor)", "error": "\(error)"])
                    }
                    if read >= Self.sliceEntries || MonotonicClock.now() >= deadline {
                        more = true
                        break machinesLoop
                    }
                }
                visited += 1
                nextMachine = (nextMachine + 1) % machines.count
            }
            // Every machine read to the end: changes from now on are announced anew.
            if !more { pending = Array(repeating: false, count: readers.count) }
        } catch {
            logger.error("reading the journal failed", metadata: ["error": "\(error)"])
        }
        if read > 0 {
            unsaved = true
            metricsStale = true
        }
        logFolding()
        if let entries = backlog {
            backlog = entries + read
            if !more {
                backlog = nil
                logger.info("caught up with the journal", metadata: ["entries": "\(entries + read)"])
                caughtUp?()
            }
        }
        return (read, more)
    }

    /// When folding was last logged; at most once a minute, whatever the journal holds.
    private var lastFoldLog: UInt64?
    static let foldLogIntervalNanoseconds: UInt64 = 60_000_000_000

    /// Says what was folded or gave way, and why: at once the first time, then at most once a
    /// minute, each kind with its count (a flood costs a few lines a minute).
    private func logFolding() {
        let now = MonotonicClock.now()
        if let lastFoldLog, now - lastFoldLog < Self.foldLogIntervalNanoseconds { return }
        let notes = aggregator.takeFoldNotes()
        guard !notes.isEmpty else { return }
        lastFoldLog = now
        for (note, count) in notes.prefix(10) {
            logger.notice(
                "folded: \(note)",
                metadata: ["what": "\(note.what)", "uid": "\(note.owner ?? "")", "entries": "\(count)"])
        }
        if notes.count > 10 {
            logger.notice(
                "folded: \(notes.count - 10) more kinds of series, with \(notes.dropFirst(10).reduce(0) { $0 + $1.count }) entries"
            )
        }
    }

    /// Reads one slice, saves and writes metrics when due, and queues the next slice behind
    /// whatever else the main loop has to do.
    private func drain() {
        let slice = readSlice()
        flush()
        guard slice.more, !sliceQueued else { return }
        sliceQueued = true
        DispatchQueue.main.async { [self] in
            sliceQueued = false
            drain()
        }
    }

    /// Saves the state (cursor and counts together) when due, and rewrites the metrics when due.
    /// - Parameter final: save now and wait until it is written (at stop).
    package func flush(forceMetrics: Bool = false, final: Bool = false) {
        let now = MonotonicClock.now()
        // A failed save or metrics write is tried again.
        let failures = saving.takeFailures()
        if failures.state { unsaved = true }
        if failures.metrics { metricsStale = true }
        // The trailing-window gauges fall as stalls age out of their windows, new stalls or not.
        if let expiry = saving.windowExpiry, Self.realtimeMicroseconds() >= expiry {
            saving.windowExpiry = nil
            metricsStale = true
        }
        if final {
            saveQueue.sync {}
            if unsaved { save(now: now, wait: true) }
        } else if unsaved, !saving.inFlight, forceMetrics || now - saving.lastStart >= Self.saveIntervalNanoseconds {
            save(now: now, wait: false)
        }
        let interval = UInt64(configuration.metricsInterval.nanoseconds)
        if !configuration.metricsPath.isEmpty, metricsStale, forceMetrics || now - lastMetricsWrite >= interval {
            writeMetrics()
            lastMetricsWrite = now
        }
        if final { saveQueue.sync {} }
    }

    /// Writes a snapshot of the state on the save queue; the loop goes on meanwhile.
    private func save(now: UInt64, wait: Bool) {
        let snapshot = aggregator.snapshot()
        let changed = aggregator.takeChangedUnits(for: .state)
        unsaved = false
        saving.begin(at: now)
        let (store, logger, saving, encoding) = (store, logger, saving, encoding)
        let work: @Sendable () -> Void = {
            do {
                try store.save(snapshot, encoder: encoding.encoder, changed: changed)
                saving.end(failed: false)
            } catch {
                logger.error("saving the state failed", metadata: ["path": "\(store.path)", "error": "\(error)"])
                saving.end(failed: true)
            }
        }
        if wait { saveQueue.sync(execute: work) } else { saveQueue.async(execute: work) }
    }

    /// Renders and writes the metrics of a snapshot on the save queue; the loop goes on meanwhile.
    private func writeMetrics() {
        let now = Self.realtimeMicroseconds()
        aggregator.trim(now: now)
        metricsStale = false
        let changed = aggregator.takeChangedUnits(for: .metrics)
        let (snapshot, windows, path, logger, saving, encoding) = (
            aggregator, configuration.windows, configuration.metricsPath, logger, saving, encoding
        )
        saveQueue.async {
            let text = encoding.renderer.render(
                snapshot.state, changed: changed, windows: windows, now: now, aggregator: snapshot)
            saving.windowExpiry = snapshot.nextWindowExpiry(windows: windows, now: now)
            do {
                try PrometheusTextfile.write(text, to: path)
            } catch {
                logger.warning("writing the metrics file failed", metadata: ["path": "\(path)", "error": "\(error)"])
                saving.metricsFailed()
            }
        }
    }

    /// Writes the digest of the shortest window that covers the digest interval to the journal.
    @discardableResult
    package func writeDigest() -> DigestRecord {
        lastDigest = MonotonicClock.now()
        return Self.writeDigest(of: aggregator, configuration: configuration, writer: writer, logger: logger)
    }

    @discardableResult
    private static func writeDigest(
        of aggregator: StallAggregator, configuration: CollectorConfiguration, writer: JournalWriter, logger: Logger
    ) -> DigestRecord {
        let window = configuration.windows.first { $0 >= configuration.digestInterval } ?? configuration.windows.max()!
        let digest = aggregator.digest(window: window, now: realtimeMicroseconds())
        do {
            try writer.send(digest.fields)
        } catch {
            logger.warning("writing the digest failed", metadata: ["error": "\(error)"])
        }
        return digest
    }

    /// `collecting: 12 stalls in 1h from 3 units; worst 540 ms in foo.service`.
    package var statusLine: String {
        Self.statusLine(of: aggregator, windows: configuration.windows, backlog: backlog)
    }

    /// Computes ``statusLine`` off the main loop (it reads every recent stall) and hands it to `deliver`
    /// there.
    package func publishStatus(_ deliver: @escaping @Sendable (String) -> Void) {
        let (snapshot, windows, backlog) = (aggregator, configuration.windows, backlog)
        saveQueue.async { deliver(Self.statusLine(of: snapshot, windows: windows, backlog: backlog)) }
    }

    private static func statusLine(of aggregator: StallAggregator, windows: [Duration], backlog: Int?) -> String {
        if let backlog {
            return "catching up with the journal: \(backlog) entries read so far"
        }
        let window = windows.first { $0 >= .seconds(3600) } ?? windows.max()!
        let digest = aggregator.digest(window: window, now: realtimeMicroseconds())
        var line =
            "collecting: \(digest.stalls) stall\(digest.stalls == 1 ? "" : "s") in \(StallAggregator.describe(window)) from \(digest.units) unit\(digest.units == 1 ? "" : "s")"
        if digest.stalls > 0 { line += "; worst \(digest.worstMicroseconds / 1000) ms in \(digest.worstUnit)" }
        // A fleet's collector: how many hosts it has heard from.
        let hosts = aggregator.state.hosts.count
        if hosts > 1 { line += "; \(hosts) hosts" }
        return line
    }

    /// Takes a new configuration (a reload): metrics, windows, digest and histogram bounds.
    /// A new state directory takes effect at the next start.
    package func apply(_ configuration: CollectorConfiguration) {
        if configuration.resolvedStateDirectory() != self.configuration.resolvedStateDirectory() {
            logger.notice("state_directory changes take effect at the next start")
        }
        if configuration.journalDirectories != self.configuration.journalDirectories {
            logger.notice("journal_directories changes take effect at the next start")
        }
        var adjusted = configuration
        adjusted.stateDirectory = self.configuration.stateDirectory
        adjusted.journalDirectories = self.configuration.journalDirectories
        self.configuration = adjusted
        aggregator.apply(adjusted)
        metricsStale = true
        unsaved = true
        flush(forceMetrics: true)
    }

    /// Serves the journal's descriptor from the main queue and runs the periodic work.
    package func start() throws {
        var journals: [any DispatchSourceProtocol] = []
        for reader in readers {
            guard let reader else { continue }
            journals.append(try follow(reader))
        }
        // Once a second: entries the descriptor did not announce, saves and metrics that are due, the digest.
        let timer = DispatchSource.makeTimerSource(queue: .main)
        timer.schedule(deadline: .now() + 1, repeating: 1)
        timer.setEventHandler { [self] in
            openDirectories()
            ticksSinceFullPass += 1
            if ticksSinceFullPass >= Self.fullPassTicks {
                ticksSinceFullPass = 0
                pending = Array(repeating: true, count: readers.count)
            }
            for case let reader? in readers where (try? reader.process()) != 0 { markPending(reader) }
            drain()
            let interval = UInt64(configuration.digestInterval.nanoseconds)
            if interval > 0, MonotonicClock.now() - lastDigest >= interval {
                // Off the loop, like the status line: the digest reads every recent stall.
                lastDigest = MonotonicClock.now()
                let (snapshot, configuration, writer, logger) = (aggregator, configuration, writer, logger)
                saveQueue.async {
                    Self.writeDigest(of: snapshot, configuration: configuration, writer: writer, logger: logger)
                }
            }
        }
        timer.resume()
        sources = journals + [timer]
        // The backlog is read in slices from here on, behind everything else the loop does.
        DispatchQueue.main.async { [self] in drain() }
    }

    /// Serves a reader's descriptor from the main queue.
    private func follow(_ reader: JournalReader) throws(SystemdError) -> any DispatchSourceProtocol {
        let descriptor = try reader.fileDescriptor()
        let journal = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: .main)
        journal.setEventHandler { [self] in
            if (try? reader.process()) != 0 { markPending(reader) }
            drain()
        }
        journal.resume()
        return journal
    }

    /// Marks a reader's machines for reading at the next slice.
    private func markPending(_ reader: JournalReader) {
        if let index = readers.firstIndex(where: { $0 === reader }) { pending[index] = true }
    }

    /// Opens the configured directories that did not exist until now, and follows them.
    private func openDirectories() {
        for index in readers.indices where readers[index] == nil {
            guard let reader = try? JournalReader(directory: directories[index]) else { continue }
            do {
                sources.append(try follow(reader))
                readers[index] = reader
                pending[index] = true
                logger.notice("reading the journal directory", metadata: ["directory": "\(directories[index])"])
            } catch {
                logger.error(
                    "cannot follow the journal directory",
                    metadata: ["directory": "\(directories[index])", "error": "\(error)"])
            }
        }
    }

    /// Stops following, and saves and writes the metrics before it returns.
    package func stop() {
        for source in sources { source.cancel() }
        sources = []
        flush(forceMetrics: true, final: true)
    }

    static func realtimeMicroseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return UInt64(time.tv_sec) * 1_000_000 + UInt64(time.tv_nsec) / 1000
    }
}

/// What the save queue keeps from one write to the next: each unit's metrics and state text.
/// Used on the save queue only.
private final class Encoding: @unchecked Sendable {
    let renderer = PrometheusTextfile.Renderer()
    let encoder = StateStore.Encoder()
}

/// Whether a save is under way, when the latest began, and what failed on the save queue; shared
/// between the main loop and that queue.
private final class SaveProgress: Sendable {
    private struct Progress {
        var inFlight = false
        var lastStart: UInt64 = 0
        var stateFailed = false
        var metricsFailed = false
        var windowExpiry: UInt64?
    }
    private let progress = Mutex(Progress())

    var inFlight: Bool { progress.withLock { $0.inFlight } }
    var lastStart: UInt64 { progress.withLock { $0.lastStart } }

    func begin(at time: UInt64) {
        progress.withLock {
            $0.inFlight = true
            $0.lastStart = time
        }
    }

    func end(failed: Bool) {
        progress.withLock {
            $0.inFlight = false
            $0.stateFailed = $0.stateFailed || failed
        }
    }

    func metricsFailed() { progress.withLock { $0.metricsFailed = true } }

    /// When the latest metrics' trailing-window gauges go stale (realtime microseconds).
    var windowExpiry: UInt64? {
        get { progress.withLock { $0.windowExpiry } }
        set { progress.withLock { $0.windowExpiry = newValue } }
    }

    /// What failed since the last call.
    func takeFailures() -> (state: Bool, metrics: Bool) {
        progress.withLock { progress in
            defer { (progress.stateFailed, progress.metricsFailed) = (false, false) }
            return (progress.stateFailed, progress.metricsFailed)
        }
    }
}
