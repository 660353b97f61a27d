import Dispatch
import Foundation
import Logging
import StallJournal
import StallMonitor

#if canImport(Glibc)
    import Glibc
#endif

/// Follows the journal for stall reports from every unit and keeps the fleet view: aggregates in
/// the state directory (with the cursor they reflect), a Prometheus textfile and a periodic digest.
///
/// - Important: Confined to the main thread: the journal's descriptor is served by
///   `DispatchQueue.main`, which the main run loop drains.
public final class Collector {
    public private(set) var configuration: CollectorConfiguration
    private var aggregator: StallAggregator
    private var store: StateStore
    private let reader: JournalReader
    private let writer = JournalWriter()
    private let logger: Logger
    private var unsaved = false
    private var metricsStale = true
    private var lastMetricsWrite: UInt64 = 0
    private var lastDigest: UInt64
    private var sources: [any DispatchSourceProtocol] = []
    /// Entries counted since start, for the status line.
    public private(set) var counted = 0

    /// Opens the journal, loads the saved state and positions the reader after its cursor.
    /// - Throws: when the journal cannot be opened or the saved state cannot be read.
    public init(configuration: CollectorConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        self.store = StateStore(directory: configuration.resolvedStateDirectory())
        let state = try store.load()
        self.aggregator = StallAggregator(state: state, configuration: configuration)
        self.reader = try JournalReader()
        for messageID in [MessageID.stallEnded, MessageID.watchdogStall, MessageID.reportsSuppressed] {
            try reader.addMatch("MESSAGE_ID", messageID)
        }
        if let cursor = state.cursor {
            try reader.seek(cursor: cursor)
        } else {
            try reader.seekHead()
        }
        self.lastDigest = Self.monotonicNanoseconds()
        logger.info(
            "collector state loaded",
            metadata: [
                "state": "\(store.path)", "units": "\(state.units.count)",
                "resuming": "\(state.cursor == nil ? "from the start of the journal" : "after the saved cursor")",
            ])
    }

    public var state: CollectorState { aggregator.state }

    /// Reads every entry available now. Returns how many were counted.
    @discardableResult
    public func catchUp() -> Int {
        var read = 0
        do {
            while let entry = try reader.next() {
                read += 1
                switch aggregator.ingest(entry) {
                case .stall, .stallUpdated, .suppressed: counted += 1
                case .ignored: break
                case .malformed(let error):
                    logger.warning(
                        "skipping a malformed stall entry",
                        metadata: ["cursor": "\(entry.cursor)", "error": "\(error)"])
                }
            }
        } catch {
            logger.error("reading the journal failed", metadata: ["error": "\(error)"])
        }
        if read > 0 {
            unsaved = true
            metricsStale = true
        }
        return read
    }

    /// Saves the state (cursor and counts together) and rewrites the metrics when due.
    public func flush(forceMetrics: Bool = false) {
        if unsaved {
            do {
                try store.save(aggregator.state)
                unsaved = false
            } catch {
                logger.error("saving the state failed", metadata: ["path": "\(store.path)", "error": "\(error)"])
            }
        }
        let now = Self.monotonicNanoseconds()
        let interval = UInt64(configuration.metricsInterval.nanoseconds)
        if !configuration.metricsPath.isEmpty, metricsStale, forceMetrics || now - lastMetricsWrite >= interval {
            writeMetrics()
            lastMetricsWrite = now
        }
    }

    private func writeMetrics() {
        let now = Self.realtimeMicroseconds()
        aggregator.trim(now: now)
        let text = PrometheusTextfile.render(
            aggregator.state, windows: configuration.windows, now: now, aggregator: aggregator)
        do {
            try PrometheusTextfile.write(text, to: configuration.metricsPath)
            metricsStale = false
        } catch {
            logger.warning(
                "writing the metrics file failed",
                metadata: ["path": "\(configuration.metricsPath)", "error": "\(error)"])
        }
    }

    /// Writes the digest of the shortest window that covers the digest interval to the journal.
    @discardableResult
    public func writeDigest() -> DigestRecord {
        let window = configuration.windows.first { $0 >= configuration.digestInterval } ?? configuration.windows.max()!
        let digest = aggregator.digest(window: window, now: Self.realtimeMicroseconds())
        do {
            try writer.send(digest.fields)
        } catch {
            logger.warning("writing the digest failed", metadata: ["error": "\(error)"])
        }
        lastDigest = Self.monotonicNanoseconds()
        return digest
    }

    /// `collecting: 12 stalls in 1h from 3 units; worst 540 ms in foo.service`.
    public var statusLine: String {
        let window = configuration.windows.first { $0 >= .seconds(3600) } ?? configuration.windows.max()!
        let digest = aggregator.digest(window: window, now: Self.realtimeMicroseconds())
        var line =
            "collecting: \(digest.stalls) stall\(digest.stalls == 1 ? "" : "s") in \(StallAggregator.describe(window)) from \(digest.units) unit\(digest.units == 1 ? "" : "s")"
        if digest.stalls > 0 { line += "; worst \(digest.worstMicroseconds / 1000) ms in \(digest.worstUnit)" }
        return line
    }

    /// Takes a new configuration (a reload): metrics, windows, digest and histogram bounds.
    /// A new state directory takes effect at the next start.
    public func apply(_ configuration: CollectorConfiguration) {
        if configuration.resolvedStateDirectory() != self.configuration.resolvedStateDirectory() {
            logger.notice("state_directory changes take effect at the next start")
        }
        var adjusted = configuration
        adjusted.stateDirectory = self.configuration.stateDirectory
        self.configuration = adjusted
        aggregator.apply(adjusted)
        metricsStale = true
        unsaved = true
        flush(forceMetrics: true)
    }

    /// Serves the journal's descriptor from the main queue and runs the periodic work.
    public func start() throws {
        let descriptor = try reader.fileDescriptor()
        let journal = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: .main)
        journal.setEventHandler { [self] in
            _ = try? reader.process()
            catchUp()
            flush()
        }
        journal.resume()
        // Once a second: entries the descriptor did not announce, metrics that are due, the digest.
        let timer = DispatchSource.makeTimerSource(queue: .main)
        timer.schedule(deadline: .now() + 1, repeating: 1)
        timer.setEventHandler { [self] in
            catchUp()
            flush()
            let interval = UInt64(configuration.digestInterval.nanoseconds)
            if interval > 0, Self.monotonicNanoseconds() - lastDigest >= interval { writeDigest() }
        }
        timer.resume()
        sources = [journal, timer]
    }

    public func stop() {
        for source in sources { source.cancel() }
        sources = []
        flush(forceMetrics: true)
    }

    static func monotonicNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    static func realtimeMicroseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return UInt64(time.tv_sec) * 1_000_000 + UInt64(time.tv_nsec) / 1000
    }
}
