// VaporService (the example a user reads) with what the tests need beside it, switched by
// EXAMPLE_* variables: the same service on Vapor 4's defaults (MultiThreadedEventLoopGroup.singleton;
// async handlers on Swift's cooperative pool, synchronous ones on the event loop), monitored by
// stallmon. Its routes stall on request:
//
//   GET /hello              hello
//   GET /cpu?ms=N           spins N ms on the CPU in an async handler
//   GET /sleep?ms=N         blocks N ms in usleep in an async handler
//   GET /lock?ms=N          waits N ms for a mutex another thread holds
//   GET /main-actor?ms=N    hops to the main actor and spins there N ms
//   GET /child-cpu?ms=N     spins N ms in a `Task {}` the handler makes and awaits
//   GET /sync-cpu?ms=N      spins N ms in a synchronous handler, on the event loop
//   GET /sync-sleep?ms=N    blocks N ms in usleep in a synchronous handler, on the event loop
//   GET /sync-lock?ms=N     waits N ms for a mutex in a synchronous handler, on the event loop
//
// It listens on 127.0.0.1:$PORT (8080; 0 picks a free port) and prints `{"event":"listening","port":N}`
// once it does. STALLMON_* variables configure the monitor (config/README.md).
// EXAMPLE_STALLMON=off runs the same binary without stallmon: the monitor is never made nor started,
// so no thread, signal handler or hook of stallmon's is in the process. VaporWithoutStallmon is the
// same routes built without stallmon (stallmond watches it from outside; ExternalFrameworkWatchTests).
// EXAMPLE_NIO_TAKEOVER=before|after installs NIO's singleton event loops as Swift Concurrency's
// global executor before or after stallmon starts (as Vapor's template did in 2024), and prints
// `{"event":"nio-takeover","when":…,"installed":true|false}`. EXAMPLE_TRACING=stallmon|memory adds
// TracingMiddleware with StallmonTracer (ExampleTracing.swift; `memory` serves the finished spans at
// GET /spans; the synchronous handler then runs in the middleware's task). SIGTERM shuts it down.
import ExampleStalls
import ExampleTracing
import NIOCore
import NIOPosix
import StallMonitorNIO
import Vapor
import VaporFixtureRoutes

@main
enum VaporFixture {
    static func main() async throws {
        var env = try Environment.detect()
        try LoggingSystem.bootstrap(from: &env)
        if ServiceEnvironment.nioTakeover == "before" { takeOverConcurrency() }
        let stallmon = ServiceEnvironment.stallmon ? try StallMonitor() : nil
        try stallmon?.startService()  // main actor, cooperative pool, NIO singleton
        if ServiceEnvironment.nioTakeover == "after" { takeOverConcurrency() }
        // EXAMPLE_TRACING: InstrumentationSystem.bootstrap(StallmonTracer()), so that stalls name their requests.
        let traced = ExampleTracing.bootstrap()

        let app = try await Application.make(env)
        if traced {
            app.middleware.use(TracingMiddleware())
            app.get("spans") { _ in ExampleTracing.finishedSpansJSON() }
        }
        try await VaporFixtureRoutes.serve(app)
    }

    /// NIO's singleton event loops as the global executor: async jobs then run inside their ticks.
    static func takeOverConcurrency() {
        let installed = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        ServiceOutput.line([
            "event": "nio-takeover", "when": ServiceEnvironment.nioTakeover ?? "", "installed": installed,
        ])
    }
}
