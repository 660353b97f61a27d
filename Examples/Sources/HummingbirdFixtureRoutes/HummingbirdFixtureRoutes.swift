import ExampleStalls
import Hummingbird
import NIOCore
import NIOPosix

/// The routes of HummingbirdFixture that stall on request (its header lists them), with nothing of
/// stallmon's: the fixture adds them to its router, and so does HummingbirdWithoutStallmon, the
/// same service built without stallmon.
public enum HummingbirdFixtureRoutes {
    public static func add(to router: Router<BasicRequestContext>) {
        router.get("hello") { _, _ in "hello" }
        router.get("cpu") { request, _ in
            spinInHandler(milliseconds: milliseconds(request)).json
        }
        router.get("sleep") { request, _ in
            sleepInHandler(milliseconds: milliseconds(request)).json
        }
        router.get("lock") { request, _ in
            waitForLockInHandler(milliseconds: milliseconds(request)).json
        }
        router.get("deep") { request, _ in
            let depth = request.uri.queryParameters.get("depth", as: Int.self)
            return spinAtDepth(
                depth.flatMap { (1...200).contains($0) ? $0 : nil } ?? 100, milliseconds: milliseconds(request)
            )
            .json
        }
        router.get("child-cpu") { request, _ in
            // In a task of its own, made by the handler's: it serves the handler's request.
            await Task { spinInHandler(milliseconds: milliseconds(request)) }.value.json
        }
        router.get("main-actor") { request, _ in
            await spinOnMainActor(milliseconds: milliseconds(request)).json
        }
        // Hummingbird runs every handler on the cooperative pool; code that stalls its event loops
        // runs there in a ChannelHandler or an EventLoopFuture's callback. These routes stand for it:
        // the stall is a task of one of the singleton's loops, inside one of its ticks.
        router.get("loop-cpu") { request, _ in
            let duration = milliseconds(request)
            return try await onEventLoop { spinOnEventLoop(milliseconds: duration) }.json
        }
        router.get("loop-sleep") { request, _ in
            let duration = milliseconds(request)
            return try await onEventLoop { sleepOnEventLoop(milliseconds: duration) }.json
        }
        router.get("loop-lock") { request, _ in
            let duration = milliseconds(request)
            return try await onEventLoop { waitForLockOnEventLoop(milliseconds: duration) }.json
        }
    }

    /// Runs `stall` as a task of one of `MultiThreadedEventLoopGroup.singleton`'s loops (the group
    /// the application serves on) and waits for its answer.
    static func onEventLoop(_ stall: @escaping @Sendable () -> StallAnswer) async throws -> StallAnswer {
        try await MultiThreadedEventLoopGroup.singleton.any().submit(stall).get()
    }

    static func milliseconds(_ request: Request) -> Int {
        ServiceEnvironment.milliseconds(request.uri.queryParameters.get("ms", as: Int.self))
    }
}
