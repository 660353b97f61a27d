import Foundation
import Logging
import StallmonFixtureKit
import StallmonTestSupport
import Testing

@testable import StallMonitor

/// Events can gain kinds without breaking sinks: a sink switches over the kinds it knows.
extension Serial {
    @Suite
    struct StallMonitorEventTests {
        @Test func eachEventCarriesWhatItsKindSays() {
            let description = MonitorDescription(loop: "main", threadID: 1, configuration: .init(), signal: nil)
            let statistics = StallMonitor.Statistics(stalls: 2, suppressedReports: 0, droppedReports: 0)
            let report = Reports.report()
            let suppression = SuppressionReport(
                loop: "main", threadID: 1, fingerprint: "f", frame: "g", count: 3, totalDuration: .seconds(1),
                worstDuration: .milliseconds(400), burst: 5, interval: .seconds(60))
            let events: [StallMonitorEvent] = [
                .started(description), .stopped(description, statistics), .stallDetected(report),
                .stallEnded(report), .watchdogStall(report), .suppressed(suppression),
            ]
            #expect(
                events.map(\.kind) == [.started, .stopped, .stallDetected, .stallEnded, .watchdogStall, .suppressed])
            #expect(Set(events.map(\.kind.description)).count == events.count)
            #expect(events.map { $0.monitor != nil } == [true, true, false, false, false, false])
            #expect(events.map { $0.statistics != nil } == [false, true, false, false, false, false])
            #expect(events.map { $0.report != nil } == [false, false, true, true, true, false])
            #expect(events.map { $0.suppression != nil } == [false, false, false, false, false, true])
        }

        /// The way the documentation tells sinks to switch: on the kinds they know, with a default
        /// for the kinds later versions add. Fed by a real monitor and a real stall.
        @Test func aSinkThatSwitchesOnTheKindsItKnowsGetsARealMonitorsEvents() throws {
            let sink = KindCountingSink()
            var configuration = StallMonitor.Configuration()
            configuration.threshold = .milliseconds(50)
            let monitor = try StallMonitor(configuration: configuration, logger: .quiet, sinks: [sink])
            let loop = LoopThread { try? monitor.start(.currentThread) }
            loop.perform { Burn.cpu(milliseconds: 250) }
            #expect(sink.waitForEnded(timeout: 5))
            monitor.stop()
            loop.stop()
            #expect(sink.counts[.started] == 1)
            #expect(sink.counts[.stopped] == 1)
            #expect(sink.counts[.stallEnded] == 1)
            #expect(sink.others.contains(.stallDetected), "the kinds the sink left to its default")
            #expect(sink.endedDurations.allSatisfy { $0 >= .milliseconds(200) }, "\(sink.endedDurations)")
        }

    }
}

/// A sink as the documentation shows one: a switch over the kinds it knows, and a default.
final class KindCountingSink: ReportSink, @unchecked Sendable {
    private let lock = NSLock()
    private(set) var counts: [StallMonitorEvent.Kind: Int] = [:]
    private(set) var others: [StallMonitorEvent.Kind] = []
    private(set) var endedDurations: [Duration] = []
    private let ended = DispatchSemaphore(value: 0)

    func emit(_ event: StallMonitorEvent) {
        lock.lock()
        defer { lock.unlock() }
        switch event.kind {
        case .started, .stopped:
            counts[event.kind, default: 0] += 1
        case .stallEnded:
            counts[event.kind, default: 0] += 1
            if let report = event.report { endedDurations.append(report.duration) }
            ended.signal()
        default:
            others.append(event.kind)
        }
    }

    func waitForEnded(timeout: Double) -> Bool {
        ended.wait(timeout: .now() + timeout) == .success
    }
}
