// A gRPC service (grpc-swift 2, the HTTP/2 transport on NIO's defaults: MultiThreadedEventLoopGroup
// .singleton), monitored by stallmon, without code generation: the service registers its methods
// by hand, and messages are JSON (JSONCoding.swift). Unary methods of `stallmon.examples.Stalls`:
//
//   Cpu    spins on the CPU for the request's `milliseconds` in the handler
//   Sleep  blocks in usleep
//   Lock   waits for a mutex another thread holds
//   Hello  answers at once
//
// Each answers with what the handler measured. It listens on 127.0.0.1:$PORT (8080; 0 picks a
// free port) and prints `{"event":"listening","port":N}` once it does. STALLMON_* variables
// configure the monitor (config/README.md). SIGTERM shuts it down gracefully.
import Dispatch
import ExampleStalls
import GRPCCore
import GRPCNIOTransportHTTP2
import StallMonitorNIO

#if canImport(Glibc)
import Glibc
#endif

@main
struct GRPCService {
    static func main() async throws {
        let stallmon = try StallMonitor()
        try stallmon.startService()  // main actor, cooperative pool, NIO singleton

        let transport = HTTP2ServerTransport.Posix(
            address: .ipv4(host: "127.0.0.1", port: ServiceEnvironment.port),
            transportSecurity: .plaintext
        )
        let server = GRPCServer(transport: transport, services: [StallService()])
        let termination = ShutdownSignal(server: server)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await server.serve() }
            let address = try await transport.listeningAddress
            ServiceOutput.listening(port: address.ipv4?.port ?? -1)
        }
        termination.cancel()
    }
}

/// The request of every method: how long to stall.
struct StallRequest: Codable, Sendable {
    var milliseconds: Int
}

/// `stallmon.examples.Stalls`, registered by hand.
struct StallService: RegistrableRPCService {
    static let name = "stallmon.examples.Stalls"

    func registerMethods<Transport: ServerTransport>(with router: inout RPCRouter<Transport>) {
        unary("Cpu", &router) { spinInHandler(milliseconds: $0) }
        unary("Sleep", &router) { sleepInHandler(milliseconds: $0) }
        unary("Lock", &router) { waitForLockInHandler(milliseconds: $0) }
        unary("Hello", &router) { _ in StallAnswer(handler: "hello", start: monotonicNanoseconds()) }
    }

    private func unary<Transport: ServerTransport>(
        _ method: String, _ router: inout RPCRouter<Transport>,
        _ body: @escaping @Sendable (Int) -> StallAnswer
    ) {
        router.registerHandler(
            forMethod: MethodDescriptor(fullyQualifiedService: Self.name, method: method),
            deserializer: JSONDeserializer<StallRequest>(),
            serializer: JSONSerializer<StallAnswer>()
        ) { request, _ in
            let message = try await ServerRequest(stream: request).message
            let answer = body(ServiceEnvironment.milliseconds(message.milliseconds))
            return StreamingServerResponse(single: ServerResponse(message: answer))
        }
    }
}

/// SIGTERM begins the server's graceful shutdown.
final class ShutdownSignal {
    private let source: any DispatchSourceSignal

    init(server: GRPCServer<HTTP2ServerTransport.Posix>) {
        signal(SIGTERM, SIG_IGN)
        source = DispatchSource.makeSignalSource(signal: SIGTERM, queue: .global())
        source.setEventHandler { server.beginGracefulShutdown() }
        source.resume()
    }

    func cancel() { source.cancel() }
}
