import ArgumentParser
import Dispatch
import Foundation
import Logging
import StallCollector
import StallMonitor

#if canImport(Glibc)
    import Glibc
#endif

/// The host's stall collector: follows the journal for stall reports from every unit, keeps
/// per-unit × fingerprint aggregates, writes Prometheus metrics and a periodic digest.
@main
struct Stallmond: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stallmond",
        abstract: "Collect the host's stall reports from the journal into metrics and digests.",
        discussion: """
            Configuration: --config, else $STALLMOND_CONFIG, else /etc/stallmon/stallmond.json (the \
            defaults when that file does not exist); STALLMOND_<KEY> variables override it. SIGHUP \
            reloads it; a broken file is reported and the previous configuration kept. Exit codes: 0 \
            success, 64 usage error, 69 journal or state unavailable, 78 invalid configuration.
            """
    )

    @Option(help: "The configuration file.")
    var config: String?

    @Flag(name: .customLong("check-config"), help: "Validate the configuration and exit.")
    var checkConfig = false

    func run() throws {
        let path = config ?? CollectorConfiguration.defaultPath()
        let required = config != nil || ProcessInfo.processInfo.environment["STALLMOND_CONFIG"] != nil
        let configuration: CollectorConfiguration
        do {
            configuration = try CollectorConfiguration.load(path: path, required: required)
        } catch {
            FileHandle.standardError.write(Data("stallmond: invalid configuration: \(error)\n".utf8))
            throw ExitCode(78)
        }
        if checkConfig {
            print(
                "stallmond: configuration OK (\(FileManager.default.fileExists(atPath: path) ? path : "defaults")): \(configuration.summary)"
            )
            return
        }

        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        let logger = Logger(label: "stallmond")
        let daemon: Daemon
        do {
            daemon = try Daemon(configuration: configuration, path: path, required: required, logger: logger)
        } catch {
            logger.critical("cannot start: \(error)")
            throw ExitCode(69)
        }
        daemon.run()
    }
}

/// The running daemon: its own stall monitor on the main run loop, the collector, and signals.
final class Daemon {
    private let collector: Collector
    private let monitor: StallMonitor
    private let logger: Logger
    private let path: String
    private let required: Bool
    private var signalSources: [any DispatchSourceSignal] = []

    init(configuration: CollectorConfiguration, path: String, required: Bool, logger: Logger) throws {
        self.logger = logger
        self.path = path
        self.required = required
        collector = try Collector(configuration: configuration, logger: logger)
        var monitorConfiguration = StallMonitor.Configuration()
        monitorConfiguration.threshold = configuration.monitorThreshold
        monitorConfiguration.syslogIdentifier = "stallmond"
        monitor = try StallMonitor(configuration: monitorConfiguration, logger: logger)
    }

    func run() -> Never {
        // stallmond eats its own cooking: its main loop is monitored, and gates its WatchdogSec=.
        do {
            try monitor.start()
        } catch {
            logger.error("the stall monitor did not start: \(error)")
        }
        // The backlog is read in slices once the loop runs: ready in moments whatever the journal holds.
        collector.caughtUp = { [collector] in
            collector.publishStatus { StallMonitor.notifyServiceManager("STATUS=\($0)") }
        }
        do {
            try collector.start()
        } catch {
            logger.critical("cannot follow the journal: \(error)")
            exit(69)
        }
        for (number, handler) in [(SIGHUP, reload), (SIGTERM, terminate), (SIGINT, terminate)] as [(Int32, () -> Void)]
        {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .main)
            source.setEventHandler(handler: handler)
            source.resume()
            signalSources.append(source)
        }
        logger.info("stallmond ready", metadata: ["configuration": "\(collector.configuration.summary)"])
        StallMonitor.notifyServiceManager("READY=1")
        collector.publishStatus { StallMonitor.notifyServiceManager("STATUS=\($0)") }
        let status = DispatchSource.makeTimerSource(queue: .main)
        status.schedule(deadline: .now() + 10, repeating: 10)
        status.setEventHandler { [collector] in
            collector.publishStatus { StallMonitor.notifyServiceManager("STATUS=\($0)") }
        }
        status.resume()
        RunLoop.main.run()
        exit(0)
    }

    private func reload() {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        StallMonitor.notifyServiceManager(
            "RELOADING=1\nMONOTONIC_USEC=\(UInt64(time.tv_sec) * 1_000_000 + UInt64(time.tv_nsec) / 1000)")
        do {
            let configuration = try CollectorConfiguration.load(path: path, required: required)
            collector.apply(configuration)
            logger.notice("configuration reloaded", metadata: ["configuration": "\(configuration.summary)"])
            StallMonitor.notifyServiceManager("READY=1")
            collector.publishStatus { StallMonitor.notifyServiceManager("STATUS=\($0)") }
        } catch {
            logger.error("reload failed, keeping the previous configuration: \(error)")
            StallMonitor.notifyServiceManager("READY=1")
            collector.publishStatus { [error = "\(error)"] in
                StallMonitor.notifyServiceManager("STATUS=reload failed (\(error)); \($0)")
            }
        }
    }

    private func terminate() {
        StallMonitor.notifyServiceManager("STOPPING=1")
        collector.stop()
        monitor.stop()
        logger.info("stallmond stopped")
        exit(0)
    }
}
