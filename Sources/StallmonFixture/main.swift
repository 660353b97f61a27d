// A small service with a real main run loop that stalls on request. The tests run it as a child
// process and read what its monitor reported from standard output (one JSON object a line) and,
// with --journal, from the journal.
//
//   StallmonFixture SCENARIO [--threshold-ms N] [--sample-interval-ms N] [--journal]
//                            [--identifier NAME] [--seconds N] [--deny-membarrier before|after]
//                            [--interrupt-blocked] [--stack-source auto|perf|signal] [--slow-sink-ms N] [--queue-capacity N]

import CoreFoundation
import Dispatch
import Foundation
import StallJournal
import StallMonitor
import StallmonFixtureKit

#if canImport(Glibc)
import Glibc
#endif

struct Options {
    var scenario = ""
    var threshold = 100
    var sampleInterval = 10
    var journal = false
    var identifier = "stallmon-fixture"
    var seconds = 3.0
    var graceMilliseconds = 0
    var stallMilliseconds = 300
    var blockAfter: Double?
    var denyMembarrier: String?
    var journalSocket = "/run/systemd/journal/socket"
    var journalFallback = false
    var periodMilliseconds = 250
    var interruptBlocked = false
    var stackSource: StallMonitor.Configuration.StackSource?
    var slowSinkMilliseconds: Int?
    var queueCapacity: Int?

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--threshold-ms": threshold = Int(iterator.next() ?? "") ?? threshold
            case "--sample-interval-ms": sampleInterval = Int(iterator.next() ?? "") ?? sampleInterval
            case "--journal": journal = true
            case "--identifier": identifier = iterator.next() ?? identifier
            case "--seconds": seconds = Double(iterator.next() ?? "") ?? seconds
            case "--grace-ms": graceMilliseconds = Int(iterator.next() ?? "") ?? graceMilliseconds
            case "--stall-ms": stallMilliseconds = Int(iterator.next() ?? "") ?? stallMilliseconds
            case "--block-after": blockAfter = Double(iterator.next() ?? "")
            case "--deny-membarrier": denyMembarrier = iterator.next()
            case "--journal-socket": journalSocket = iterator.next() ?? journalSocket
            case "--journal-fallback": journalFallback = true
            case "--period-ms": periodMilliseconds = Int(iterator.next() ?? "") ?? periodMilliseconds
            case "--interrupt-blocked": interruptBlocked = true
            case "--stack-source": stackSource = StallMonitor.Configuration.StackSource(rawValue: iterator.next() ?? "")
            case "--slow-sink-ms": slowSinkMilliseconds = Int(iterator.next() ?? "")
            case "--queue-capacity": queueCapacity = Int(iterator.next() ?? "")
            default: scenario = argument
            }
        }
    }
}

let options = Options(Array(CommandLine.arguments.dropFirst()))

extension Fixture {
    static func after(_ seconds: Double, _ body: @escaping @Sendable () -> Void) {
        let timer = Timer(fire: Date(timeIntervalSinceNow: seconds), interval: 0, repeats: false) { _ in body() }
        RunLoop.main.add(timer, forMode: .common)
    }
}

var configuration: StallMonitor.Configuration
if options.scenario == "service" {
    // As a real service would: the defaults, the drop-in's STALLMON_* environment on top.
    configuration = try StallMonitor.Configuration.fromEnvironment()
} else {
    configuration = StallMonitor.Configuration()
    configuration.threshold = .milliseconds(options.threshold)
    configuration.sampleInterval = .milliseconds(options.sampleInterval)
    configuration.syslogIdentifier = options.identifier
}
configuration.interruptBlockedThreads = configuration.interruptBlockedThreads || options.interruptBlocked
if let stackSource = options.stackSource { configuration.stackSource = stackSource }
configuration.startupGracePeriod = .milliseconds(options.scenario == "grace" ? 1000 : options.graceMilliseconds)
if options.scenario != "service" {
    configuration.rateLimit.burst = 1000  // tests count every report; the service keeps its environment's limit
}
if let capacity = options.queueCapacity { configuration.reportQueueCapacity = capacity }
if options.scenario == "repeat" {
    configuration.rateLimit = .init(burst: 2, interval: .seconds(1))
}

var sinks: [any ReportSink] = [JSONLinesSink(identifier: options.identifier)]
if options.journal {
    sinks.append(
        JournalSink(
            syslogIdentifier: options.identifier, socketPath: options.journalSocket,
            fallback: options.journalFallback ? StandardErrorSink() : nil))
}
if options.scenario == "service" { sinks = StallMonitor.defaultSinks(configuration) }
if let milliseconds = options.slowSinkMilliseconds { sinks.append(SlowSink(milliseconds: milliseconds)) }
let monitor = try StallMonitor(configuration: configuration, sinks: sinks)

func finish(after seconds: Double) {
    Fixture.after(seconds) {
        let start = Fixture.now()
        monitor.stop()
        Fixture.print(["type": "stop", "duration_ns": Fixture.now() - start])
        exit(0)
    }
}

switch options.denyMembarrier {
case "before": DeniedCall.membarrier.install()
case "after": DispatchQueue.main.async { DeniedCall.membarrier.install() }  // once the loop runs, after start()
default: break
}
try Scenarios.run(options.scenario, monitor: monitor, options: options)
RunLoop.main.run()
