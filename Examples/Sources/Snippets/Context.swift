// What the snippets of README.md and the DocC articles take as given: a Hummingbird router, a Vapor
// `configure`, a gRPC service, a logger and a server for a ServiceGroup. Scripts/check-snippets.sh
// writes each snippet into Generated/ beside this file (git-ignored), and CI builds this target.
import GRPCCore
import Hummingbird
import Logging
import ServiceLifecycle
import Vapor

/// A Hummingbird service's routes.
func buildRouter() -> Hummingbird.Router<BasicRequestContext> {
    let router = Router()
    router.get("/") { _, _ in "hello" }
    return router
}

/// A Vapor service's configuration, as its template has it.
func configure(_ app: Vapor.Application) async throws {
    app.get { _ in "hello" }
}

/// A gRPC service with no methods.
struct Greeter: RegistrableRPCService {
    func registerMethods<Transport: ServerTransport>(with router: inout RPCRouter<Transport>) {}
}

/// An async service's work.
func serve() async throws {}

/// The service's logger.
let logger = Logger(label: "snippets")

/// A service of a ServiceGroup that runs until graceful shutdown.
struct Server: Service {
    func run() async throws {
        try await gracefulShutdown()
    }
}

/// The server a ServiceGroup runs beside the monitor.
let server = Server()
/// The same, under the name the DocC articles give it.
let httpServer = Server()
