// HummingbirdFixture's routes (HummingbirdFixtureRoutes) in a service built without stallmon: no
// stallmon product among its dependencies, so nothing of stallmon's is in the binary. It is what a
// service nobody can rebuild this week looks like to stallmond, which watches its event loops from
// outside (ExternalFrameworkWatchTests). Hummingbird 2's defaults, as the fixture: listens on
// 127.0.0.1:$PORT (0 picks a free port), prints `{"event":"listening","port":N}`, and SIGTERM
// shuts it down.
import ExampleStalls
import Hummingbird
import HummingbirdFixtureRoutes

@main
struct HummingbirdWithoutStallmon {
    static func main() async throws {
        let router = Router()
        HummingbirdFixtureRoutes.add(to: router)
        let app = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: ServiceEnvironment.port)),
            onServerRunning: { channel in
                ServiceOutput.listening(port: channel.localAddress?.port ?? -1)
            }
        )
        try await app.runService()
    }
}
