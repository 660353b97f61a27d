// A Vapor 4 service on the framework's defaults (MultiThreadedEventLoopGroup.singleton; async
// handlers on Swift's cooperative pool, synchronous ones on the event loop), monitored by stallmon
// as README shows: two lines in main(), after Vapor's logging. Its routes stall on request:
//
//   GET /hello              hello
//   GET /cpu?ms=N           spins N ms on the CPU in an async handler
//   GET /sleep?ms=N         blocks N ms in usleep in an async handler
//   GET /lock?ms=N          waits N ms for a mutex another thread holds
//   GET /main-actor?ms=N    hops to the main actor and spins there N ms
//   GET /sync-cpu?ms=N      spins N ms in a synchronous handler, on the event loop
//
// It listens on 127.0.0.1:$PORT (8080; 0 picks a free port) and prints `{"event":"listening","port":N}`
// once it does. STALLMON_* variables configure the monitor (config/README.md). SIGTERM shuts it
// down. VaporFixture is this service with what the tests need beside it.
import ExampleStalls
import StallMonitorNIO
import Vapor

@main
enum VaporService {
    static func main() async throws {
        var env = try Environment.detect()
        try LoggingSystem.bootstrap(from: &env)
        let stallmon = try StallMonitor()
        try stallmon.startService()  // main actor, cooperative pool, NIO singleton

        let app = try await Application.make(env)
        app.http.server.configuration.hostname = "127.0.0.1"
        app.http.server.configuration.port = ServiceEnvironment.port
        app.get("hello") { _ async in "hello" }
        app.get("cpu") { request async in spinInHandler(milliseconds: milliseconds(request)).json }
        app.get("sleep") { request async in sleepInHandler(milliseconds: milliseconds(request)).json }
        app.get("lock") { request async in waitForLockInHandler(milliseconds: milliseconds(request)).json }
        app.get("main-actor") { request async in await spinOnMainActor(milliseconds: milliseconds(request)).json }
        // Synchronous: Vapor runs it on the request's event loop.
        app.get("sync-cpu") { (request: Request) -> String in
            spinOnEventLoop(milliseconds: milliseconds(request)).json
        }
        // The server `execute()` starts, made here before anything else can make another.
        let server = app.http.server.shared
        let listening = Task { await announcePort(server) }
        try await app.execute()
        listening.cancel()
        try await app.asyncShutdown()
    }

    static func milliseconds(_ request: Request) -> Int {
        ServiceEnvironment.milliseconds(request.query["ms"])
    }

    /// Vapor binds in `execute()`, which returns only at shutdown: prints the port once it is bound.
    static func announcePort(_ server: HTTPServer) async {
        while !Task.isCancelled {
            if let port = server.localAddress?.port {
                ServiceOutput.listening(port: port)
                return
            }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}
