import CoreFoundation
import Foundation
import StallMonitor
import Synchronization

/// Workloads that stall the main run loop under stallmon (the repeated stalls run under any
/// variant, so that `unmonitored` shows what the stall loop itself costs in memory: nothing).
enum StallWorkloads {
    /// `warmup` + `count` stalls of `stall-ms` (burning CPU in a timer callout), `gap-ms` apart, with
    /// `threshold-ms` and `sample-interval-ms`. With `record 1`, every report reaches a sink that
    /// notes when (the rate limit is lifted); otherwise the default rate limit applies and the sink
    /// drops reports. Finishes with:
    /// - `latency_p50_ms`, `latency_p99_ms`: sink emit of `.stallDetected` − (window start + threshold),
    ///   over the stalls after the warm-up ones;
    /// - `first_latency_ms`: the same for the first stall (the symbolicator is cold);
    /// - `capture_p50_ms`, `capture_p99_ms`: of that, the watchdog's part (detected duration − threshold);
    /// - `delivery_p50_ms`, `delivery_p99_ms`: the reporting queue's part, from capture to the sink;
    /// - `duration_error_p99_ms`: |reported ended duration − duration timed around the stalling code|;
    /// - `detected`, `ended`: reports that reached the sink;
    /// - `rss_growth_kib`: VmRSS at the end − VmRSS after `baseline` stalls;
    /// - `rss_anon_growth_kib`: the same for its anonymous part (`RssAnon`: heap, arenas, stacks),
    ///   which pages of library code that the kernel reclaimed and the process faulted back in
    ///   (hundreds of KiB from run to run on a busy host) do not move.
    static func startRepeatedStalls(_ request: ChildRequest) throws {
        var configuration = StallMonitor.Configuration()
        configuration.threshold = .milliseconds(request.int("threshold-ms", default: 20))
        configuration.sampleInterval = .milliseconds(request.int("sample-interval-ms", default: 10))
        let record = request.int("record", default: 1) == 1
        if record { configuration.rateLimit.burst = 1000 }
        let sink = TimingSink(recording: record)
        let installed = try InstalledVariant(request.variant, configuration: configuration, sinks: [sink])
        let stalls = RepeatedStalls(
            count: request.int("count", default: 60), warmup: request.int("warmup", default: 0),
            baseline: request.int("baseline", default: 100),
            stall: UInt64(request.double("stall-ms", default: 35) * 1e6),
            gap: request.double("gap-ms", default: 15) / 1000,
            threshold: UInt64(request.int("threshold-ms", default: 20)) * 1_000_000, record: record, sink: sink,
            installed: installed
        )
        stalls.scheduleNext(after: request.double("settle", default: 0.3))
    }

    /// One stall of `seconds` (default 5) under the default configuration. Finishes with
    /// `cpu_pct`, the watchdog thread's CPU time over the stall as a share of it, and `samples`.
    static func startLongStall(_ request: ChildRequest) throws {
        let sink = TimingSink(recording: true)
        var configuration = StallMonitor.Configuration()
        // `--stack-source signal` measures the signal path where perf events are allowed.
        if let source = request.parameters["stack-source"].flatMap(StallMonitor.Configuration.StackSource.init) {
            configuration.stackSource = source
        }
        let installed = try InstalledVariant(.stallmon, configuration: configuration, sinks: [sink])
        let length = UInt64(request.double("seconds", default: 5) * 1e9)
        Timers.after(request.double("settle", default: 0.5)) {
            let watchdog = installed.watchdogThreadID
            let cpuBefore = Kernel.threadCPU(watchdog) ?? 0
            let start = Kernel.now()
            Spin.burn(until: start + length)
            let cpu = (Kernel.threadCPU(watchdog) ?? 0) - cpuBefore
            let elapsed = Kernel.now() - start
            // Let the window close so that the ended report goes out normally.
            Timers.after(0.05) {
                installed.stallMonitor?.stop()
                Child.finish([
                    "cpu_pct": Double(cpu) / Double(elapsed) * 100, "seconds": Double(elapsed) / 1e9,
                    "samples": Double(sink.endedReports.last?.samples ?? 0),
                ])
            }
        }
    }
}

extension StallWorkloads {
    /// One 300 ms CPU stall (100 ms threshold) once the monitor has settled (`settle`, 1.5 s: the
    /// reporter's look-up of the run loop's wait is done and its pages released). Finishes with
    /// `rss_before_kib` (VmRSS then), `rss_first_stall_kib` (VmRSS growth as the ended report
    /// reaches the sink: symbols loaded for it) and `rss_first_stall_settled_kib` (the growth 2 s
    /// later, once the symbolicator released the pages of the image files it read).
    static func startFirstStall(_ request: ChildRequest) throws {
        var configuration = StallMonitor.Configuration()
        configuration.threshold = .milliseconds(100)
        let sink = TimingSink(recording: true)
        let installed = try InstalledVariant(request.variant, configuration: configuration, sinks: [sink])
        Timers.after(request.double("settle", default: 1.5)) {
            let before = Kernel.residentKiB() ?? 0
            Spin.burn(until: Kernel.now() + 300_000_000)
            let deadline = Kernel.now() + 10_000_000_000
            @Sendable func waitForReport() {
                guard sink.endedReports.isEmpty, Kernel.now() < deadline else {
                    let peak = Kernel.residentKiB() ?? 0
                    Timers.after(2) {
                        let settled = Kernel.residentKiB() ?? 0
                        installed.stallMonitor?.stop()
                        Child.finish([
                            "rss_before_kib": Double(before), "rss_first_stall_kib": Double(peak - before),
                            "rss_first_stall_settled_kib": Double(settled - before),
                            "ended": Double(sink.endedReports.count),
                        ])
                    }
                    return
                }
                Timers.after(0.01) { waitForReport() }
            }
            waitForReport()
        }
    }
}

/// The stall loop of ``StallWorkloads/startRepeatedStalls(_:)``; main thread only.
final class RepeatedStalls: @unchecked Sendable {
    private let count: Int
    private let warmup: Int
    private let baseline: Int
    private let stall: UInt64
    private let gap: Double
    private let threshold: UInt64
    private let record: Bool
    private let sink: TimingSink
    private let installed: InstalledVariant
    private var index = 0
    private var truths: [(start: UInt64, end: UInt64)] = []
    private var baselineKiB: Int?
    private var baselineAnonymousKiB: Int?
    private let debug = ProcessInfo.processInfo.environment["STALLMON_BENCH_DEBUG"] != nil

    init(
        count: Int, warmup: Int, baseline: Int, stall: UInt64, gap: Double, threshold: UInt64, record: Bool,
        sink: TimingSink,
        installed: InstalledVariant
    ) {
        self.count = warmup + count
        self.warmup = warmup
        self.baseline = baseline
        self.stall = stall
        self.gap = gap
        self.threshold = threshold
        self.record = record
        self.sink = sink
        self.installed = installed
        truths.reserveCapacity(record ? warmup + count : 0)
    }

    /// One timer for every stall, re-armed after each: a new Timer a stall would leak a few hundred
    /// bytes each (swift-corelibs-foundation), which would swamp the monitor's own memory figure.
    private var timer: Timer?

    func scheduleNext(after seconds: Double) {
        let fireDate = Date(timeIntervalSinceNow: seconds)
        if let timer {
            timer.fireDate = fireDate
            return
        }
        let timer = Timer(fire: fireDate, interval: 3600, repeats: true) { _ in self.stallOnce() }
        self.timer = timer
        RunLoop.main.add(timer, forMode: .common)
    }

    private func stallOnce() {
        if index == baseline {
            baselineKiB = Kernel.residentKiB()
            baselineAnonymousKiB = Kernel.anonymousResidentKiB()
        }
        if debug, index % 250 == 0 {
            let info = mallinfo2()
            FileHandle.standardError.write(
                Data(
                    "after \(index) stalls: VmRSS \(Kernel.residentKiB() ?? -1) KiB heap in use \(info.uordblks / 1024) KiB arena \(info.arena / 1024) KiB mmap \(info.hblkhd / 1024) free \(info.fordblks / 1024)\n"
                        .utf8))
        }
        index += 1
        let start = Kernel.now()
        Spin.burn(until: start + stall)
        let end = Kernel.now()
        if record { truths.append((start, end)) }
        if index < count {
            scheduleNext(after: gap)
        } else {
            // Give the reporter time for the last reports, then read memory before stopping.
            timer?.invalidate()
            Timers.after(0.2) { self.finish() }
        }
    }

    private func finish() {
        let endKiB = Kernel.residentKiB()
        let endAnonymousKiB = Kernel.anonymousResidentKiB()
        installed.stallMonitor?.stop()
        var result: [String: Double] = [
            "detected": Double(sink.detectedReports.count), "ended": Double(sink.endedReports.count),
            "stalls": Double(installed.stallMonitor?.statistics.stalls ?? 0),
        ]
        if let baselineKiB, let endKiB { result["rss_growth_kib"] = Double(endKiB - baselineKiB) }
        if let baselineAnonymousKiB, let endAnonymousKiB {
            result["rss_anon_growth_kib"] = Double(endAnonymousKiB - baselineAnonymousKiB)
        }
        let allLatencies = sink.detectedReports.map { report in
            (Double(report.emitted) - Double(report.start + report.threshold)) / 1e6
        }
        result["first_latency_ms"] = allLatencies.first
        let latencies = Array(allLatencies.dropFirst(warmup))
        result["latency_p50_ms"] = Statistics.percentile(latencies, 0.5)
        result["latency_p99_ms"] = Statistics.percentile(latencies, 0.99)
        // The two legs of the latency: the watchdog's wakeup and first sample, then the reporting
        // queue (symbolication, rate limit) up to the sink.
        let measured = sink.detectedReports.dropFirst(warmup)
        let capture = measured.map { (Double($0.duration) - Double($0.threshold)) / 1e6 }
        let delivery = measured.map { (Double($0.emitted) - Double($0.start + $0.duration)) / 1e6 }
        result["capture_p50_ms"] = Statistics.percentile(capture, 0.5)
        result["capture_p99_ms"] = Statistics.percentile(capture, 0.99)
        result["delivery_p50_ms"] = Statistics.percentile(delivery, 0.5)
        result["delivery_p99_ms"] = Statistics.percentile(delivery, 0.99)
        let errors = sink.endedReports.dropFirst(warmup).compactMap { report -> Double? in
            // The stalling code starts just after its window does.
            guard let truth = truths.first(where: { $0.start >= report.start && $0.start < report.start + threshold })
            else {
                return nil
            }
            return abs(Double(report.duration) - Double(truth.end - truth.start)) / 1e6
        }
        result["duration_error_p99_ms"] = Statistics.percentile(errors, 0.99)
        result["matched"] = Double(errors.count)
        if debug {
            FileHandle.standardError.write(Data("latencies \(latencies)\nerrors \(errors)\n".utf8))
        }
        Child.finish(result)
    }
}

/// Notes what reached it and when (CLOCK_MONOTONIC at `emit`), or drops everything.
final class TimingSink: ReportSink, Sendable {
    struct Detected {
        var start: UInt64
        var threshold: UInt64
        /// The report's duration: until the watchdog captured it (woke and took the first sample).
        var duration: UInt64
        var emitted: UInt64
    }

    struct Ended {
        var start: UInt64
        var duration: UInt64
        var samples: Int
    }

    private let recording: Bool
    private let detected = Mutex<[Detected]>([])
    private let ended = Mutex<[Ended]>([])

    init(recording: Bool) {
        self.recording = recording
    }

    func emit(_ event: StallMonitorEvent) {
        let now = Kernel.now()
        guard recording, let report = event.report else { return }
        switch event.kind {
        case .stallDetected:
            let entry = Detected(
                start: report.startNanoseconds, threshold: report.threshold.wholeNanoseconds,
                duration: report.duration.wholeNanoseconds, emitted: now
            )
            detected.withLock { $0.append(entry) }
        case .stallEnded:
            let entry = Ended(
                start: report.startNanoseconds, duration: report.duration.wholeNanoseconds, samples: report.samples)
            ended.withLock { $0.append(entry) }
        default:
            break
        }
    }

    var detectedReports: [Detected] { detected.withLock { $0 } }
    var endedReports: [Ended] { ended.withLock { $0 } }
}

extension Duration {
    /// Whole nanoseconds of a non-negative duration.
    var wholeNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        return UInt64(max(0, seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
    }
}

/// One-shot timers on the main run loop.
enum Timers {
    static func after(_ seconds: Double, _ body: @escaping @Sendable () -> Void) {
        let timer = Timer(fire: Date(timeIntervalSinceNow: seconds), interval: 0, repeats: false) { _ in body() }
        RunLoop.main.add(timer, forMode: .common)
    }
}

/// Keeps a thread busy on the CPU.
enum Spin {
    /// Hashes until CLOCK_MONOTONIC reaches `deadline`.
    @inline(never)
    static func burn(until deadline: UInt64) {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        while Kernel.now() < deadline {
            for byte in 0..<UInt64(256) {
                hash = (hash ^ byte) &* 0x100_0000_01b3
            }
        }
        keep(hash)
    }

    @inline(never)
    static func keep(_ value: UInt64) {
        if value == 42 { print("") }
    }
}
