import Logging
import StallmonTestSupport
import Testing

@testable import StallMonitor

/// The `sink` key chooses the default sinks.
struct DefaultSinksTests {
    static func sinks(_ destination: StallMonitor.Configuration.ReportDestination?) -> [String] {
        var configuration = StallMonitor.Configuration()
        configuration.sink = destination
        return StallMonitor.defaultSinks(configuration, logger: .quiet).map { String(describing: type(of: $0)) }
    }

    @Test func eachDestinationHasItsSink() {
        #expect(Self.sinks(nil) == ["JournalSink"])
        #expect(Self.sinks(.journal) == ["JournalSink"])
        #expect(Self.sinks(.json) == ["StandardErrorSink"])
        #expect(Self.sinks(.text) == ["StandardErrorSink"])
        #expect(Self.sinks(.logger) == ["LoggerSink"])
    }
}
