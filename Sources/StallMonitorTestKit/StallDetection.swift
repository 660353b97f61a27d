import Logging
import StallMonitor

#if STALLMON_LINUX
import CoreMetrics
#endif

/// The stalls ``withStallDetection(threshold:isolation:_:)`` saw: each job that held a thread of
/// Swift's cooperative pool past the threshold while the body ran, with where it was.
public struct StallsDetected: Error, CustomStringConvertible {
    /// The ended report of each stall, in the order they ended.
    public var reports: [StallReport]
    /// The threshold the body ran under.
    public var threshold: Duration

    public var description: String {
        let count = reports.count == 1 ? "1 stall" : "\(reports.count) stalls"
        let stalls = reports.map { "\($0.message)\n\($0.backtrace)" }.joined(separator: "\n\n")
        return "\(count) of the cooperative pool past \(Int(threshold / .milliseconds(1))) ms:\n\(stalls)"
    }
}

/// Runs `body` with Swift's cooperative pool watched, and throws ``StallsDetected`` when any job
/// held a pool thread past `threshold` while it ran: a handler that blocks (a synchronous read, a
/// lock held across a slow call, `usleep`) or computes for too long, however the test goes on.
///
/// ```swift
/// @Test func priceNeverBlocksThePool() async throws {
///     try await withStallDetection(threshold: .milliseconds(50)) {
///         let response = try await client.get("/price/42")
///         #expect(response.status == .ok)
///     }
/// }
/// ```
///
/// The pool is the process's: a stall of another test that runs at the same time counts too, so a
/// suite of such tests is best `.serialized`, or kept apart from tests that burn CPU. Calls in one
/// process take turns (one watches the pool at a time; a waiting call ends with `CancellationError`
/// when its task is cancelled), and a call inside another's body runs its body under the outer
/// watch. A process whose own monitor watches the pool cannot run one (it throws
/// `StallMonitorError` with `.cooperativePoolHookUnavailable`). Reports go nowhere but the error: no
/// journal entry, no metric. Where stallmon does not monitor (elsewhere than on Linux) it only runs
/// `body`.
///
/// The body must run on the pool: nonisolated, or isolated to an actor of its own. Isolated to the
/// main actor (a `@MainActor` test, or a test target whose default isolation is the main actor) it
/// runs on the main queue, which this does not watch: it throws ``StallDetectionUnavailable``
/// rather than pass unwatched.
/// - Parameters:
///   - threshold: How long one job may hold a pool thread; 10 ms at least.
///   - body: The code under test.
/// - Returns: What `body` returns.
/// - Throws: What `body` throws (before any stall); otherwise ``StallsDetected``, or
///   ``StallDetectionUnavailable``, a `StallMonitorError` or a `ConfigurationError` when the pool
///   cannot be watched as asked.
public func withStallDetection<Result>(
    threshold: Duration = .milliseconds(100),
    isolation: isolated (any Actor)? = #isolation,
    _ body: () async throws -> Result
) async throws -> Result {
    #if STALLMON_LINUX
    if let isolation, ObjectIdentifier(isolation) == ObjectIdentifier(MainActor.shared) {
        throw StallDetectionUnavailable(
            reason: "the body is isolated to the main actor, whose jobs run on the main queue, not on the "
                + "cooperative pool that withStallDetection watches: call it from a nonisolated test")
    }
    // Inside another call's body: the outer call watches the pool, and its error names any stall.
    if PoolTurns.held { return try await body() }
    var configuration = StallMonitor.Configuration()
    configuration.cooperativePool = true
    configuration.cooperativePoolThreshold = threshold
    configuration.rateLimit.burst = 1000
    try configuration.validate()
    try await PoolTurns.shared.acquire()
    let sink = CollectingSink()
    let session: CooperativePoolSession
    do {
        // nil: the runtime's job layout is not the one the pool's hook reads, or it could not be
        // checked. A pool that cannot be watched is no pass.
        guard
            let watching = try CooperativePoolSession(
                configuration: configuration, sinks: [sink], logger: Logger(label: "stallmon.testkit"),
                metricsFactory: NOOPMetricsHandler.instance, coverage: "")
        else {
            throw StallMonitorError.cooperativePoolHookUnavailable(reason: CooperativePoolSession.layoutReason)
        }
        session = watching
    } catch {
        await PoolTurns.shared.release()
        throw error
    }
    // The job running now started before the hook was set, and goes untimed: the body starts in a
    // job of its own. A yield whose continuation is resumed before the task suspends goes on in the
    // same job: then once more.
    for _ in 0..<100 where !CooperativePoolSession.callerRunsATimedJob { await Task.yield() }
    let result: Swift.Result<Result, any Error>
    do {
        result = .success(try await PoolTurns.$held.withValue(true) { try await body() })
    } catch {
        result = .failure(error)
    }
    session.stop()
    await PoolTurns.shared.release()
    let value = try result.get()
    let reports = sink.events.compactMap { $0.kind == .stallEnded ? $0.report : nil }
    guard reports.isEmpty else { throw StallsDetected(reports: reports, threshold: threshold) }
    return value
    #else
    return try await body()
    #endif
}

/// Why ``withStallDetection(threshold:isolation:_:)`` cannot watch its body.
public struct StallDetectionUnavailable: Error, CustomStringConvertible {
    public var reason: String

    public var description: String { "withStallDetection cannot watch the body: \(reason)" }
}

#if STALLMON_LINUX
/// One ``withStallDetection(threshold:isolation:_:)`` at a time watches the pool: the others wait
/// their turn, in order, unless their task is cancelled meanwhile.
private actor PoolTurns {
    static let shared = PoolTurns()
    /// Whether the current task runs a body under a watch.
    @TaskLocal static var held = false

    private var busy = false
    private var waiting: [(id: UInt64, continuation: CheckedContinuation<Void, any Error>)] = []
    private var nextID: UInt64 = 0

    func acquire() async throws {
        guard busy else {
            busy = true
            return
        }
        nextID += 1
        let id = nextID
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                } else {
                    waiting.append((id, continuation))
                }
            }
        } onCancel: {
            Task { await self.cancel(id) }
        }
    }

    private func cancel(_ id: UInt64) {
        guard let index = waiting.firstIndex(where: { $0.id == id }) else { return }
        waiting.remove(at: index).continuation.resume(throwing: CancellationError())
    }

    func release() {
        guard !waiting.isEmpty else {
            busy = false
            return
        }
        waiting.removeFirst().continuation.resume()
    }
}
#endif
