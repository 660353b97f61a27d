// A Hummingbird 2 service on the framework's defaults (MultiThreadedEventLoopGroup.singleton,
// handlers on Swift's cooperative pool), monitored by stallmon as README shows: two lines at the
// top of main(). Its routes stall on request:
//
//   GET /hello              hello
//   GET /cpu?ms=N           spins N ms on the CPU in the async handler
//   GET /sleep?ms=N         blocks N ms in usleep in the async handler
//   GET /lock?ms=N          waits N ms for a mutex another thread holds
//   GET /main-actor?ms=N    hops to the main actor and spins there N ms
//
// It listens on 127.0.0.1:$PORT (8080; 0 picks a free port) and prints `{"event":"listening","port":N}`
// once it does. STALLMON_* variables configure the monitor (config/README.md). HummingbirdFixture
// is this service with what the tests and the benchmark need beside it.
import ExampleStalls
import Hummingbird
import StallMonitorNIO

@main
struct HummingbirdService {
    static func main() async throws {
        let stallmon = try StallMonitor()
        try stallmon.startService()  // main actor, cooperative pool, NIO singleton

        let router = Router()
        router.get("hello") { _, _ in "hello" }
        router.get("cpu") { request, _ in spinInHandler(milliseconds: milliseconds(request)).json }
        router.get("sleep") { request, _ in sleepInHandler(milliseconds: milliseconds(request)).json }
        router.get("lock") { request, _ in waitForLockInHandler(milliseconds: milliseconds(request)).json }
        router.get("main-actor") { request, _ in await spinOnMainActor(milliseconds: milliseconds(request)).json }
        let app = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: ServiceEnvironment.port)),
            onServerRunning: { channel in ServiceOutput.listening(port: channel.localAddress?.port ?? -1) }
        )
        try await app.runService()
    }

    static func milliseconds(_ request: Request) -> Int {
        ServiceEnvironment.milliseconds(request.uri.queryParameters.get("ms", as: Int.self))
    }
}
