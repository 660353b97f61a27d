// VaporFixture's routes (VaporFixtureRoutes) in a service built without stallmon: no stallmon
// product among its dependencies, so nothing of stallmon's is in the binary. It is what a service
// nobody can rebuild this week looks like to stallmond, which watches its event loops from outside
// (ExternalFrameworkWatchTests). Vapor 4's defaults, as the fixture: listens on 127.0.0.1:$PORT (0
// picks a free port), prints `{"event":"listening","port":N}`, and SIGTERM shuts it down.
import Vapor
import VaporFixtureRoutes

@main
enum VaporWithoutStallmon {
    static func main() async throws {
        var env = try Environment.detect()
        try LoggingSystem.bootstrap(from: &env)
        try await VaporFixtureRoutes.serve(try await Application.make(env))
    }
}
