import ArgumentParser
import Dispatch
import Foundation
import Logging
import StallCollector
import StallJournal
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
            defaults when that file does not exist); STALLMOND_<KEY> variables override it. \
            journal_directories reads journal directories instead of the local journal: \
            /var/log/journal/remote on a fleet's central host (systemd-journal-remote). SIGHUP \
            reloads it; a broken file is reported and the previous configuration kept. Exit codes: 0 \
            success, 64 usage error, 69 journal or state unavailable, 78 invalid configuration.
            """
    )

    @Option(help: "The configuration file.")
    var config: String?

    @Flag(name: .customLong("check-config"), help: "Validate the configuration and exit.")
    var checkConfig = false

    /// A SIGHUP's default action ends the process, and `systemctl reload` may send one at any
    /// moment after exec: `stallmond` (Sources/stallmond) blocks it before it runs this program, a
    /// dispatch source reads it from here on, and it is served (a reload) from the main loop once
    /// the daemon runs, one that came while it started included.
    static func main() {
        // Blocked already when started by `stallmond`; started without it, from here on.
        var hangUp = sigset_t()
        sigemptyset(&hangUp)
        sigaddset(&hangUp, SIGHUP)
        pthread_sigmask(SIG_BLOCK, &hangUp, nil)
        // The kernel names the process after the file it runs, cut at 15 bytes (`stallmond-daemo`):
        // the journal's _COMM, `killall` and `top` know it as stallmond.
        Thread.current.name = "stallmond"
        _ = hangUps
        main(nil)
    }

    /// Read from the first instruction of ``main()`` on; pending, not lost, before.
    static let hangUps = HangUpRelay()

    func run() throws {
        // --check-config and the start read and validate through this one call.
        let configuration: CollectorConfiguration
        let location: CollectorConfiguration.Location
        do {
            (configuration, location) = try CollectorConfiguration.load(option: config)
        } catch {
            FileHandle.standardError.write(Data("stallmond: invalid configuration: \(error)\n".utf8))
            throw ExitCode(78)
        }
        if checkConfig {
            let source = FileManager.default.fileExists(atPath: location.path) ? location.path : "defaults"
            print("stallmond: configuration OK (\(source)): \(configuration.summary)")
            return
        }

        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        let logger = Logger(label: "stallmond")
        let daemon: Daemon
        do {
            daemon = try Daemon(configuration: configuration, location: location, logger: logger)
        } catch let error as ConfigurationError {
            // validate() covers the monitor's configuration; should it still refuse, it is a configuration error.
            logger.critical("invalid configuration: \(error)")
            throw ExitCode(78)
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
    /// The watch from outside, when `watch` names something and the kernel allows it.
    private var tickWatcher: TickWatcher?
    /// `watch` and `watch_threshold_ms` as the daemon started with them: read at start only.
    private let watchInForce: (patterns: [WatchPattern], threshold: Duration)
    private let logger: Logger
    private let location: CollectorConfiguration.Location
    private var signalSources: [any DispatchSourceSignal] = []

    init(configuration: CollectorConfiguration, location: CollectorConfiguration.Location, logger: Logger) throws {
        self.logger = logger
        self.location = location
        collector = try Collector(configuration: configuration, logger: logger)
        watchInForce = (configuration.watch, configuration.watchThreshold)
        monitor = try StallMonitor(configuration: configuration.monitorConfiguration, logger: logger)
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
        // A SIGHUP that came since main() is served once the loop runs; SIGTERM and SIGINT keep
        // their default action (ending a daemon that is not running yet) until here.
        Stallmond.hangUps.serve { [self] in reload() }
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .main)
            source.setEventHandler { [self] in terminate() }
            source.resume()
            signalSources.append(source)
        }
        if !watchInForce.patterns.isEmpty {
            tickWatcher = TickWatcher(
                patterns: watchInForce.patterns, threshold: watchInForce.threshold, logger: logger)
            tickWatcher?.start()
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
        StallMonitor.notifyServiceManager("RELOADING=1\nMONOTONIC_USEC=\(MonotonicClock.microseconds())")
        do {
            let configuration = try CollectorConfiguration.load(
                path: location.path, required: location.required)
            if configuration.monitorThreshold != monitor.configuration.threshold {
                logger.notice("monitor_threshold_ms changes take effect at the next start")
            }
            if configuration.watch != watchInForce.patterns || configuration.watchThreshold != watchInForce.threshold {
                logger.notice("watch and watch_threshold_ms changes take effect at the next start")
            }
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

/// SIGHUP, read from the moment this is made and served on the main queue: a SIGHUP that comes
/// before ``serve(_:)`` is served once the main loop runs. Confined to the main queue once made.
///
/// - Important: SIGHUP stays blocked in every thread. libdispatch reads it through a signalfd,
///   which also sees a SIGHUP pending since before main(); `signal(SIGHUP, SIG_IGN)` would
///   discard that one (setting SIG_IGN flushes a pending signal), and unblocking SIGHUP before
///   libdispatch installs its own handler (on its manager thread, some time after `resume()`)
///   would let the default action end the process.
final class HangUpRelay: @unchecked Sendable {
    private let source: any DispatchSourceSignal
    private var reload: (() -> Void)?

    init() {
        source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .main)
        source.setEventHandler { [unowned self] in reload?() }
        source.resume()
    }

    /// What a SIGHUP does from now on.
    func serve(_ reload: @escaping () -> Void) { self.reload = reload }
}
