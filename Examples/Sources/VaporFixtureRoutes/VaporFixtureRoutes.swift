import ExampleStalls
import Vapor

/// The routes of VaporFixture that stall on request (its header lists them), with nothing of
/// stallmon's: the fixture adds them to its application, and so does VaporWithoutStallmon, the same
/// service built without stallmon.
public enum VaporFixtureRoutes {
    static func add(to app: Application) {
        app.get("hello") { _ async in "hello" }
        app.get("cpu") { request async in
            spinInHandler(milliseconds: milliseconds(request)).json
        }
        app.get("sleep") { request async in
            sleepInHandler(milliseconds: milliseconds(request)).json
        }
        app.get("lock") { request async in
            waitForLockInHandler(milliseconds: milliseconds(request)).json
        }
        app.get("child-cpu") { request async in
            // In a task of its own, made by the handler's: it serves the handler's request.
            await Task { spinInHandler(milliseconds: milliseconds(request)) }.value.json
        }
        app.get("main-actor") { request async in
            await spinOnMainActor(milliseconds: milliseconds(request)).json
        }
        // Synchronous: Vapor runs it on the request's event loop.
        app.get("sync-cpu") { (request: Request) -> String in
            spinOnEventLoop(milliseconds: milliseconds(request)).json
        }
        app.get("sync-sleep") { (request: Request) -> String in
            sleepOnEventLoop(milliseconds: milliseconds(request)).json
        }
        app.get("sync-lock") { (request: Request) -> String in
            waitForLockOnEventLoop(milliseconds: milliseconds(request)).json
        }
    }

    static func milliseconds(_ request: Request) -> Int {
        ServiceEnvironment.milliseconds(request.query["ms"])
    }

    /// Serves `app` with these routes on 127.0.0.1:$PORT until SIGTERM, printing
    /// `{"event":"listening","port":N}` once bound; the fixture adds its own middleware first.
    public static func serve(_ app: Application) async throws {
        app.http.server.configuration.hostname = "127.0.0.1"
        app.http.server.configuration.port = ServiceEnvironment.port
        add(to: app)
        // The server `execute()` starts, made here before anything else can make another.
        let server = app.http.server.shared
        let listening = Task { await announcePort(server) }
        try await app.execute()
        listening.cancel()
        try await app.asyncShutdown()
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
