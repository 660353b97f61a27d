import CoreFoundation
import Foundation
import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// What watches the main run loop while a workload runs.
enum Variant: String, CaseIterable, Sendable {
    /// The variants of the run-loop workloads; ``stallmonPool`` runs the async ones only.
    static let allCases: [Variant] = [.unmonitored, .noopObserver, .stallmon, .blog]

    /// Nothing: the baseline.
    case unmonitored
    /// Two observers that do nothing, on the activities and orders stallmon uses: the floor any
    /// observer-based monitor pays for being called out to.
    case noopObserver = "noop-observer"
    /// stallmon with its default configuration and a sink that drops every report.
    case stallmon
    /// The blog design (``BlogMonitor``), as a reference.
    case blog
    /// stallmon started for `.asyncMain` with `cooperative_pool` on: every job of the cooperative
    /// pool goes through its trampoline and is timed (async workloads only).
    case stallmonPool = "stallmon-pool"
}

/// A sink that drops every report.
struct DroppingSink: ReportSink {
    func emit(_ event: StallMonitorEvent) {}
}

/// A variant installed on the main run loop for the rest of the (child) process.
final class InstalledVariant: Sendable {
    let variant: Variant
    private let monitor: StallMonitor?
    private let blog: BlogMonitor?

    /// Installs `variant`; call before the main run loop runs. For an async main's drain
    /// (`asyncMain`), the main thread runs the light drain that `start(.asyncMain)` installs: the
    /// no-op observer variant is that drain alone, the floor, and stallmon starts for `.asyncMain`.
    init(
        _ variant: Variant, configuration: StallMonitor.Configuration = StallMonitor.Configuration(),
        sinks: [any ReportSink] = [DroppingSink()], asyncMain: Bool = false
    ) throws {
        self.variant = variant
        Self.startSleepingThread()
        switch variant {
        case .unmonitored:
            monitor = nil
            blog = nil
        case .noopObserver:
            monitor = nil
            blog = nil
            if !asyncMain { NoopObservers.add(to: CFRunLoopGetMain()) }
        case .stallmon, .stallmonPool:
            var configuration = configuration
            configuration.cooperativePool = variant == .stallmonPool
            let monitor = try StallMonitor(configuration: configuration, sinks: sinks)
            try monitor.start(asyncMain ? .asyncMain : .mainThread)
            self.monitor = monitor
            blog = nil
        case .blog:
            let blog = BlogMonitor(threshold: configuration.threshold)
            blog.start(on: CFRunLoopGetMain())
            self.blog = blog
            monitor = nil
        }
    }

    /// The kernel id of the variant's watchdog thread; 0 when it has none (or it has not run yet).
    var watchdogThreadID: Int32 {
        monitor?.watchdogThreadID ?? blog?.threadID ?? 0
    }

    var stallMonitor: StallMonitor? { monitor }

    /// The kernel id of the cooperative pool's watchdog thread; 0 when it has none.
    var poolWatchdogThreadID: Int32 { monitor?.poolWatchdogThreadID ?? 0 }

    /// Every variant runs with one more thread that sleeps forever. A process that never started
    /// a thread takes glibc's single-threaded fast paths (no cancellation handling around the
    /// loop's poll, read and write); any monitor with a thread of its own turns them off, and
    /// a real service has threads anyway. Without this, the baselines would get a discount of a
    /// few hundred instructions a pass that no service sees.
    private static func startSleepingThread() {
        let sleeper = Thread {
            while true { sleep(3600) }
        }
        sleeper.name = "bench-sleeper"
        sleeper.start()
    }
}

/// Observers that do nothing, added exactly as `StallMonitor.Session.addObservers` adds stallmon's:
/// entry | before-timers | after-waiting at the lowest order, before-waiting | exit at the highest,
/// in the common modes, with a C function callout (CF calls a context's retain and release only when
/// an observer is created and freed, never per callout, so these have none).
enum NoopObservers {
    static func add(to runLoop: CFRunLoop) {
        let callout: CFRunLoopObserverCallBack = { _, _, _ in }
        let specs: [(CFOptionFlags, CFIndex)] = [
            (
                CFRunLoopActivity.entry.rawValue | CFRunLoopActivity.beforeTimers.rawValue
                    | CFRunLoopActivity.afterWaiting.rawValue, CFIndex.min
            ),
            (CFRunLoopActivity.beforeWaiting.rawValue | CFRunLoopActivity.exit.rawValue, CFIndex.max),
        ]
        for (activities, order) in specs {
            let observer = CFRunLoopObserverCreate(kCFAllocatorDefault, activities, true, order, callout, nil)
            CFRunLoopAddObserver(runLoop, observer, kCFRunLoopCommonModes)
        }
    }
}
