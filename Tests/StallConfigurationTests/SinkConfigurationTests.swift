import Foundation
import StallConfiguration
import StallMonitor
import Testing

/// The `sink` key (`STALLMON_SINK`): where the default sinks send reports.
struct SinkConfigurationTests {
    @Test func theSinkIsReadFromTheFileAndTheEnvironment() throws {
        #expect(StallMonitor.Configuration().sink == nil)
        for name in ["journal", "json", "text", "logger"] {
            let fromFile = try StallMonitor.Configuration(json: Data(#"{"sink": "\#(name)"}"#.utf8), source: "x")
            #expect(fromFile.sink?.description == name)
            #expect(try StallMonitor.Configuration.fromEnvironment(["STALLMON_SINK": name]).sink?.description == name)
        }
        #expect(try StallMonitor.Configuration.fromEnvironment(["STALLMON_SINK": "auto"]).sink == nil)
        #expect(try StallMonitor.Configuration(json: Data(#"{"sink": "auto"}"#.utf8), source: "x").sink == nil)
        #expect(StallMonitor.Configuration.ReportDestination(named: "json") == .json)
    }

    @Test(arguments: [#"{"sink": "syslog"}"#, #"{"sink": "JSON"}"#, #"{"sink": true}"#, #"{"sink": null}"#])
    func aSinkThatIsNoneIsRefusedNamingTheChoices(_ json: String) throws {
        let error = try #require(ConfigurationTests.error(json: json))
        #expect(error.key == "sink")
        #expect(error.reason == #"must be one of "auto", "journal", "json", "text", "logger""#)
    }

    @Test func theSummaryNamesTheSink() throws {
        var configuration = StallMonitor.Configuration()
        #expect(configuration.summary.contains(" sink=auto "))
        configuration.sink = .json
        #expect(configuration.summary.contains(" sink=json "))
    }
}
