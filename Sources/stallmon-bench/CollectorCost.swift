import Foundation
import StallCollector
import StallJournal

/// What one journal entry costs the collector (stallmond's decoding and counting) and
/// `stallmon report --flamegraph` (decoding and merging into the flame graph): a typical entry,
/// and the worst the schema allows (64 stacks of 1,024 frames in a 4 KiB `STALL_STACKS`, each
/// stack under an outermost frame of its own), which anyone on a host can write. CPU time of
/// this thread per entry, and resident memory grown per entry over a run of them; in process,
/// without journald (reading a field costs at most its 64 KiB bound).
enum CollectorCost {
    /// A well-formed ended entry: `stacks` and `backtrace` as given.
    static func entry(index: Int, backtrace: String, stacks: String?, uid: String) -> JournalEntry {
        var record = StallRecord(
            event: .ended, message: "main run loop stalled 400 ms", stallID: hex(UInt64(index), digits: 32),
            durationMicroseconds: 400_000, thresholdMicroseconds: 250_000, activity: "after-waiting",
            runLoopMode: "kCFRunLoopDefaultMode", callout: "timer", loop: "main", threadID: 42, threadState: "R",
            threadSyscall: "", threadWaitChannel: "", cpuMicroseconds: 1, samples: 64, samplesUnanswered: 0,
            stackSamples: 1, fingerprint: hex(UInt64(index % 64), digits: 16), frame: "Service.refresh()",
            backtrace: backtrace, priority: 4, syslogIdentifier: "bench-\(index % 1000)")
        record.sampledStacks = SampledStacks()
        var fields: [String: String] = ["_UID": uid, "_SYSTEMD_UNIT": "bench.service"]
        if uid != "0" { fields["_SYSTEMD_UNIT"] = nil }
        for field in record.fields { fields[field.name] = field.value }
        if let stacks { fields["STALL_STACKS"] = stacks }
        return JournalEntry(
            fields: fields, cursor: "c\(index)", realtimeMicroseconds: 1_800_000_000_000_000 + UInt64(index))
    }

    /// `digits` (16 or 32) lowercase hex digits, distinct for distinct values.
    static func hex(_ value: UInt64, digits: Int) -> String {
        let text = String(value &* 0x9E37_79B9_7F4A_7C15 | 1 << 63, radix: 16)
        return digits == 32 ? text + text : text
    }

    /// The schema's worst: a backtrace of 1,024 lines (1,023 of them empty), 64 frames defined in
    /// the field, and 64 stacks `0-1022,N 1`, each 1,024 frames deep under its own outer frame.
    static func worst(index: Int) -> JournalEntry {
        let backtrace = "#0 Service.refresh() at Service.swift:1" + String(repeating: "\n", count: 1023)
        var lines = (0..<64).map { "=Outer.frame\($0)() at Outer.swift:\($0)" }
        lines += (0..<64).map { "0-1022,\(1024 + $0) 1" }
        let stacks = lines.joined(separator: "\n")
        precondition(stacks.utf8.count <= FieldLimits.stacksBytes, "\(stacks.utf8.count) bytes")
        return entry(index: index, backtrace: backtrace, stacks: stacks, uid: "65534")
    }

    /// A fixture-like stall: a 20-frame backtrace and 12 stacks sharing most of it.
    static func typical(index: Int) -> JournalEntry {
        let backtrace = (0..<20).map { "#\($0) 0x\($0) Frame\($0)() + 4 at Service.swift:\($0) [svc]" }
            .joined(separator: "\n")
        var lines = (0..<4).map { "=Leaf\($0)() at Leaf.swift:\($0)" }
        lines += (0..<12).map { "\($0 < 4 ? "\(20 + $0)," : "")\($0 % 3)-19 \(1 + $0)" }
        return entry(index: index, backtrace: backtrace, stacks: lines.joined(separator: "\n"), uid: "0")
    }

    struct Result {
        var microsecondsPerEntry: Double
        var kibPerEntry: Double
    }

    /// Runs `body` over `count` entries made by `make`, made beforehand.
    static func measure(count: Int, make: (Int) -> JournalEntry, body: (JournalEntry) -> Void) -> Result {
        let entries = (0..<count).map(make)
        for entry in entries.prefix(1) {
            do {
                _ = try StallRecord(journalFields: entry.fields)
            } catch {
                fatalError("the benchmark's entry does not match the schema: \(error)")
            }
        }
        let thread = Kernel.currentThreadID()
        let rss = Kernel.anonymousResidentKiB() ?? 0
        let start = Kernel.threadCPU(thread) ?? 0
        for entry in entries { body(entry) }
        let cpu = (Kernel.threadCPU(thread) ?? 0) - start
        let grown = max(0, (Kernel.anonymousResidentKiB() ?? 0) - rss)
        return Result(
            microsecondsPerEntry: Double(cpu) / 1000 / Double(count), kibPerEntry: Double(grown) / Double(count))
    }

    /// The endpoint ceiling: what the collector holds and what one new stall costs when users
    /// fill every bound there is, 20 users (`max_users`) × 50 identifiers (`max_units`) × 22 routes.
    struct Ceiling {
        var endpointSeries: Int
        var textfileKiB: Double
        var stateKiB: Double
        var residentMiB: Double
        /// CPU of one new stall: counting it, the textfile and `state.json` made again and written.
        var millisecondsPerStall: Double
    }

    /// A stall of `identifier`, written by `uid` outside any unit, in `route`.
    static func routed(index: Int, uid: Int, identifier: Int, route: Int) -> JournalEntry {
        var entry = typical(index: index)
        entry.fields["_SYSTEMD_UNIT"] = nil
        entry.fields["_UID"] = "\(uid)"
        entry.fields["SYSLOG_IDENTIFIER"] = "tool-\(identifier)"
        entry.fields["STALL_FINGERPRINT"] = hex(UInt64(identifier), digits: 16)
        entry.fields["STALL_REQUEST_METHOD"] = "GET"
        entry.fields["STALL_REQUEST_ROUTE"] = "/route/\(route)/:id"
        entry.fields["STALL_REQUEST_OPERATION"] = "GET /route/\(route)/:id"
        return entry
    }

    /// Fills the ceiling, then counts `stalls` new stalls, each followed by a write of the
    /// textfile and of `state.json` as stallmond does (to a scratch directory).
    static func ceiling(stalls: Int) -> Ceiling {
        let directory = NSTemporaryDirectory() + "stallmon-bench-ceiling-\(getpid())"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = StateStore(directory: directory)
        let metrics = directory + "/stallmon.prom"
        let configuration = CollectorConfiguration()
        let before = Kernel.anonymousResidentKiB() ?? 0
        var aggregator = StallAggregator(configuration: configuration)
        var index = 0
        for uid in 0..<20 {
            for identifier in 0..<50 {
                for route in 0..<22 {
                    index += 1
                    aggregator.ingest(routed(index: index, uid: 1000 + uid, identifier: identifier, route: route))
                }
            }
        }
        let renderer = PrometheusTextfile.Renderer()
        let encoder = StateStore.Encoder()
        let now = 1_800_000_000_000_000 + UInt64(index)
        func write() -> (text: Int, state: Int) {
            let text = renderer.render(
                aggregator.state, changed: aggregator.takeChangedUnits(for: .metrics), windows: configuration.windows,
                now: now, aggregator: aggregator)
            let snapshot = aggregator.snapshot()
            do {
                try store.save(snapshot, encoder: encoder, changed: aggregator.takeChangedUnits(for: .state))
                try PrometheusTextfile.write(text, to: metrics)
            } catch {
                fatalError("the benchmark cannot write in \(directory): \(error)")
            }
            let attributes = try? FileManager.default.attributesOfItem(atPath: store.path)
            return (text.utf8.count, (attributes?[.size] as? Int) ?? 0)
        }
        let sizes = write()
        let series = aggregator.state.units.values.reduce(0) { $0 + $1.endpoints.count }
        let thread = Kernel.currentThreadID()
        let start = Kernel.threadCPU(thread) ?? 0
        for stall in 0..<stalls {
            index += 1
            aggregator.ingest(routed(index: index, uid: 1000 + stall % 20, identifier: stall % 50, route: stall % 22))
            _ = write()
        }
        let cpu = (Kernel.threadCPU(thread) ?? 0) - start
        let resident = max(0, (Kernel.anonymousResidentKiB() ?? 0) - before)
        return Ceiling(
            endpointSeries: series, textfileKiB: Double(sizes.text) / 1024, stateKiB: Double(sizes.state) / 1024,
            residentMiB: Double(resident) / 1024, millisecondsPerStall: Double(cpu) / 1e6 / Double(stalls))
    }

    /// The figures, in their JSON order.
    static func figures(scale: Double) -> [Figure] {
        let count = max(200, Int(2000 * scale))
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        let collectorTypical = measure(count: count, make: typical) { aggregator.ingest($0) }
        var worstAggregator = StallAggregator(configuration: CollectorConfiguration())
        let collectorWorst = measure(count: count, make: worst) { worstAggregator.ingest($0) }
        var typicalGraph = ServiceFlameGraph()
        let graphTypical = measure(count: count, make: typical) { entry in
            if let record = try? StallRecord(journalFields: entry.fields) {
                typicalGraph.add(record, fields: entry.fields)
            }
        }
        var worstGraph = ServiceFlameGraph(allWriters: true)
        let graphWorst = measure(count: count, make: worst) { entry in
            if let record = try? StallRecord(journalFields: entry.fields) {
                worstGraph.add(record, fields: entry.fields)
            }
        }
        var figures: [Figure] = []
        func add(_ key: String, _ target: Target?, _ value: Double) {
            var figure = Figure(key, target)
            figure.values = [value]
            figures.append(figure)
        }
        add("collector_entry_us_typical", nil, collectorTypical.microsecondsPerEntry)
        add("collector_entry_us_worst", .atMost(1000), collectorWorst.microsecondsPerEntry)
        add("collector_entry_kib_worst", .atMost(64), collectorWorst.kibPerEntry)
        add("flamegraph_entry_us_typical", nil, graphTypical.microsecondsPerEntry)
        add("flamegraph_entry_us_worst", .atMost(1000), graphWorst.microsecondsPerEntry)
        add("flamegraph_entry_kib_worst", .atMost(64), graphWorst.kibPerEntry)
        let ceiling = ceiling(stalls: max(20, Int(100 * scale)))
        add("collector_ceiling_endpoint_series", nil, Double(ceiling.endpointSeries))
        add("collector_ceiling_textfile_kib", .atMost(8192), ceiling.textfileKiB)
        add("collector_ceiling_state_kib", .atMost(8192), ceiling.stateKiB)
        add("collector_ceiling_rss_mib", .atMost(64), ceiling.residentMiB)
        add("collector_ceiling_stall_ms", .atMost(100), ceiling.millisecondsPerStall)
        return figures
    }
}
