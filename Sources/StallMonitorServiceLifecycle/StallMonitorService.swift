import Foundation
import ServiceLifecycle
import StallMonitor

/// A ``StallMonitor`` as a swift-service-lifecycle `Service`: monitoring starts when the service is
/// created, runs while the `ServiceGroup` runs, and stops on graceful shutdown or cancellation.
///
/// An async `@main` must start its monitor before `main()` first suspends (the runtime decides then
/// how the main thread drains the main actor), and `ServiceGroup.run()` suspends at once. So the
/// start happens in the initializer, which `main()` calls before it runs the group:
///
/// ```swift
/// @main
/// struct App {
///     static func main() async throws {
///         let stallMonitor = try StallMonitorService(StallMonitor())  // starts .asyncMain here
///         let group = ServiceGroup(
///             services: [stallMonitor, httpServer],
///             gracefulShutdownSignals: [.sigterm],
///             logger: logger
///         )
///         try await group.run()
///     }
/// }
/// ```
///
/// List it first: a group shuts its services down in reverse order, so the monitor keeps watching
/// while the others shut down, and stops last.
///
/// ``run()`` waits for graceful shutdown (or cancellation), then stops the monitor: the stall in
/// progress is reported, then the monitor's summary, and queued reports are written (for at most
/// ``StallMonitor/stopTimeout``). That stop blocks, so it runs on a thread of its own, never on a
/// thread of the cooperative pool.
public struct StallMonitorService: Service {
    /// The monitor this service started.
    public let monitor: StallMonitor

    /// Starts `monitor` for `target`, now, unless it runs already: a server on SwiftNIO starts it
    /// with `startService()` (StallMonitorNIO), which also watches its event loops, and hands it
    /// here so that graceful shutdown stops it.
    ///
    /// ```swift
    /// let stallmon = try StallMonitor()
    /// try stallmon.startService()
    /// let group = ServiceGroup(services: [StallMonitorService(stallmon), server], logger: logger)
    /// ```
    /// - Parameters:
    ///   - monitor: A monitor, running or not.
    ///   - target: ``StallMonitor/Target/asyncMain`` (the default) for an async `@main`, which
    ///     every `ServiceGroup` service has; ``StallMonitor/Target/mainThread`` where the main thread
    ///     runs the main run loop itself.
    /// - Important: With ``StallMonitor/Target/asyncMain``, create the service in `main()` before
    ///   its first suspension (before `ServiceGroup.run()` and any other `await` that waits).
    /// - Throws: ``StallMonitorError`` when the monitor cannot start (it runs already, or the
    ///   service is created too late for an async main).
    public init(_ monitor: StallMonitor, target: StallMonitor.Target = .asyncMain) throws(StallMonitorError) {
        if !monitor.isRunning { try monitor.start(target) }
        self.monitor = monitor
    }

    /// Waits for graceful shutdown or cancellation, then stops the monitor and returns.
    ///
    /// The monitor is stopped however the wait ends: returning on cancellation as well lets the
    /// group finish its shutdown with the monitor's summary written.
    public func run() async {
        do {
            try await gracefulShutdown()
        } catch {
            // Cancelled: the group is ending without a graceful shutdown; stop all the same.
        }
        await Self.stopOffThePool(monitor)
    }

    /// ``StallMonitor/stop()`` waits (for the watchdog thread, then for the reports to drain) on a
    /// dedicated thread, and the calling task awaits it: a thread of the cooperative pool never blocks.
    static func stopOffThePool(_ monitor: StallMonitor) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let thread = Thread {
                monitor.stop()
                continuation.resume()
            }
            thread.name = "stallmon-stop"
            thread.start()
        }
    }
}
