import ExampleOTel
// HummingbirdService (the example a user reads) with what the tests and the benchmark need beside
// it, switched by EXAMPLE_* variables: the same service on Hummingbird 2's defaults
// (MultiThreadedEventLoopGroup.singleton, handlers on Swift's cooperative pool), monitored by
// stallmon. Its routes stall on request:
//
//   GET /hello              hello
//   GET /cpu?ms=N           spins N ms on the CPU in the async handler
//   GET /sleep?ms=N         blocks N ms in usleep in the async handler
//   GET /lock?ms=N          waits N ms for a mutex another thread holds
//   GET /main-actor?ms=N    hops to the main actor and spins there N ms
//   GET /child-cpu?ms=N     spins N ms in a `Task {}` the handler makes and awaits
//   GET /deep?ms=N&depth=D  spins N ms at the bottom of D nested calls (1 to 200, default 100)
//   GET /loop-cpu?ms=N      spins N ms on an event loop of the NIO singleton (submitted to it and awaited)
//   GET /loop-sleep?ms=N    blocks N ms in usleep on an event loop
//   GET /loop-lock?ms=N     waits N ms for a mutex on an event loop
//
// It listens on 127.0.0.1:$PORT (8080; 0 picks a free port) and prints `{"event":"listening","port":N}`
// once it does. STALLMON_* variables configure the monitor (config/README.md). SIGTERM shuts it down.
// For the tests and the benchmark (stallmon-bench), the same binary runs:
//
//   EXAMPLE_STALLMON=off       without stallmon: its monitor never made nor started, so no thread, signal
//                              handler or hook of stallmon's is in the process (the benchmark's unmonitored
//                              service; HummingbirdWithoutStallmon is the same routes built without stallmon)
//   EXAMPLE_PRINT_REPORTS=1    with the reports on standard output instead of the journal, one line each:
//                              `report <event> start_ns=N duration_ns=N threshold_ns=N emitted_ns=N tid=N`
//   EXAMPLE_DENY_IO_URING=1    with io_uring_setup(2) failing (a seccomp filter), as valgrind needs
//   EXAMPLE_TRACING=stallmon|memory|otel  with TracingMiddleware and StallmonTracer (ExampleTracing.swift);
//                              `memory` serves the finished spans at GET /spans; `otel` wraps swift-otel's
//                              backend, which exports them over OTLP (OTEL_EXPORTER_OTLP_* say where),
//                              and logs each stall report through swift-otel's logging backend too: an
//                              OTLP log record linked to the stalled span
//   EXAMPLE_SINK=json|text|journal|logger   where the monitor's default sinks send reports (`sink`)
//   EXAMPLE_STDERR_CHATTER=N   a line of the service's own on standard error every N ms
//   EXAMPLE_BACKGROUND_STALL_MS=N    a stall of the service's own, in no request, 1 s after start
//   EXAMPLE_MAIN_RUN_LOOP=1    (with EXAMPLE_STALLMON=off) with the main thread in RunLoop.main rather
//                              than dispatch_main(), which valgrind cannot run
import ExampleStalls
import ExampleTracing
import Foundation
import Hummingbird
import HummingbirdFixtureRoutes
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import StallMonitorNIO
import UnixSignals

@main
struct HummingbirdFixture {
    static func main() async throws {
        if ServiceEnvironment.denyIOUring, let failure = IOUringDenial.install() { fatalError(failure) }
        if ServiceEnvironment.mainRunLoop, !MainRunLoop.install() { fatalError("cannot set the async main's drain") }
        // EXAMPLE_TRACING: InstrumentationSystem.bootstrap(StallmonTracer()), so that stalls name their requests.
        let otel = try ExampleOTel.bootstrap(ExampleTracing.mode)
        let traced = otel != nil || ExampleTracing.bootstrap()
        // EXAMPLE_STALLMON=off skips stallmon (the benchmark's unmonitored server).
        let stallmon = ServiceEnvironment.stallmon ? try makeMonitor(otel) : nil
        try stallmon?.startService()  // main actor, cooperative pool, NIO singleton
        StandardErrorChatter.start(every: ServiceEnvironment.standardErrorChatter)
        BackgroundStall.start()

        let app = Application(
            router: buildRouter(traced: traced),
            configuration: .init(address: .hostname("127.0.0.1", port: ServiceEnvironment.port)),
            onServerRunning: { channel in
                ServiceOutput.listening(port: channel.localAddress?.port ?? -1)
            }
        )
        if let otel {
            // The exporter runs beside the application; SIGTERM stops both, the exporter last.
            let group = ServiceGroup(
                configuration: .init(
                    services: otel.services.map { .init(service: $0) } + [
                        .init(service: app, successTerminationBehavior: .gracefullyShutdownGroup)
                    ],
                    gracefulShutdownSignals: [.sigterm], logger: app.logger))
            try await group.run()
        } else {
            try await app.runService()
        }
    }

    /// The monitor as the README adopts it, its configuration from `STALLMON_*`; EXAMPLE_SINK sets
    /// where the default sinks send reports, and with swift-otel each report is also an OTLP log record.
    static func makeMonitor(_ otel: ExampleOTel.Backends?) throws -> StallMonitor {
        if let sinks = PrintingSink.sinks { return try StallMonitor(sinks: sinks) }
        var configuration = try StallMonitor.Configuration.fromEnvironment()
        if let name = ServiceEnvironment.sink {
            guard let sink = StallMonitor.Configuration.ReportDestination(named: name) else {
                fatalError("EXAMPLE_SINK=\(name): not journal, json, text or logger")
            }
            configuration.sink = sink
        }
        var sinks = StallMonitor.defaultSinks(configuration)
        if let otel {
            sinks.append(LoggerSink(logger: Logger(label: "stallmon", factory: otel.logHandlers)))
        }
        return try StallMonitor(configuration: configuration, sinks: sinks)
    }

    static func buildRouter(traced: Bool) -> Router<BasicRequestContext> {
        let router = Router()
        if traced {
            router.add(middleware: TracingMiddleware())
            router.get("spans") { _, _ in ExampleTracing.finishedSpansJSON() }
        }
        HummingbirdFixtureRoutes.add(to: router)
        return router
    }
}

/// EXAMPLE_PRINT_REPORTS=1: each stall report as one line on standard output, stamped when it
/// reached the sink (CLOCK_MONOTONIC), for the benchmark's detection latency.
struct PrintingSink: ReportSink {
    /// With EXAMPLE_PRINT_REPORTS=1 this sink alone; otherwise `nil`, the monitor's default (the journal).
    static var sinks: [any ReportSink]? { ServiceEnvironment.printReports ? [PrintingSink()] : nil }

    func emit(_ event: StallMonitorEvent) {
        let emitted = monotonicNanoseconds()
        guard let report = event.report else { return }
        let name: String
        switch event.kind {
        case .stallDetected: name = "detected"
        case .stallEnded: name = "ended"
        default: return
        }
        let line =
            "report \(name) start_ns=\(report.startNanoseconds) duration_ns=\(Self.nanoseconds(report.duration)) "
            + "threshold_ns=\(Self.nanoseconds(report.threshold)) emitted_ns=\(emitted) tid=\(report.threadID)\n"
        FileHandle.standardOutput.write(Data(line.utf8))
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
