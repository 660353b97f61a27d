// swift-tools-version: 6.1
import PackageDescription

// Real services on Hummingbird, Vapor and gRPC Swift that adopt stallmon as its README shows.
// One package, so that swift-nio and its neighbours build once. CI builds it; the main package's
// FrameworkServiceTests run the binaries from Examples/.build/debug.
let package = Package(
    name: "stallmon-examples",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "stallmon", path: ".."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/vapor/vapor.git", from: "4.122.3"),
        .package(url: "https://github.com/grpc/grpc-swift-2.git", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport.git", from: "2.9.2"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.2"),
        // OTLP over HTTP only: the gRPC exporter would add swift-protobuf's gRPC code for nothing here.
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
    ],
    targets: [
        // What the services share: the stalls their handlers make, and JSON lines on standard output.
        // Nothing of stallmon's: the services built without it use it too.
        .target(name: "ExampleStalls"),
        // The tracer the fixtures bootstrap for EXAMPLE_TRACING.
        .target(
            name: "ExampleTracing",
            dependencies: [
                .product(name: "StallMonitorTracing", package: "stallmon"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
        // The fixtures' routes that stall on request, stallmon-free, for the fixtures and for the
        // same services built without stallmon.
        .target(
            name: "HummingbirdFixtureRoutes",
            dependencies: [
                "ExampleStalls",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                // MultiThreadedEventLoopGroup.singleton: the /loop-* routes stall one of its loops.
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .target(
            name: "VaporFixtureRoutes",
            dependencies: [
                "ExampleStalls",
                .product(name: "Vapor", package: "vapor"),
            ]
        ),
        // EXAMPLE_TRACING=otel: swift-otel's OTLP exporters, the tracer wrapped in StallmonTracer, the
        // logging backend for the monitor's LoggerSink.
        .target(
            name: "ExampleOTel",
            dependencies: [
                .product(name: "StallMonitorTracing", package: "stallmon"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
            ]
        ),
        // The examples a user reads: README's two lines, a few routes that stall on request.
        .executableTarget(
            name: "HummingbirdService",
            dependencies: [
                "ExampleStalls",
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        .executableTarget(
            name: "VaporService",
            dependencies: [
                "ExampleStalls",
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "Vapor", package: "vapor"),
            ]
        ),
        // The same services with what the tests and the benchmark switch on with EXAMPLE_* variables.
        .executableTarget(
            name: "HummingbirdFixture",
            dependencies: [
                "ExampleStalls",
                "ExampleTracing",
                "HummingbirdFixtureRoutes",
                "ExampleOTel",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                // MultiThreadedEventLoopGroup.singleton: the /loop-* routes stall one of its loops.
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "VaporFixture",
            dependencies: [
                "ExampleStalls",
                "ExampleTracing",
                "VaporFixtureRoutes",
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "Vapor", package: "vapor"),
                // NIOSingletons' takeover of the global executor (EXAMPLE_NIO_TAKEOVER).
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        // The fixtures' routes in services that do not link stallmon at all (no stallmon product
        // among their dependencies, nothing of it in the binary): what stallmond watches from
        // outside in ExternalFrameworkWatchTests.
        .executableTarget(
            name: "HummingbirdWithoutStallmon",
            dependencies: [
                "ExampleStalls",
                "HummingbirdFixtureRoutes",
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        ),
        .executableTarget(
            name: "VaporWithoutStallmon",
            dependencies: [
                "ExampleStalls",
                "VaporFixtureRoutes",
                .product(name: "Vapor", package: "vapor"),
            ]
        ),
        .executableTarget(
            name: "GRPCService",
            dependencies: [
                "ExampleStalls",
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
            ]
        ),
        // Every Swift snippet of README.md and the DocC articles, written into Sources/Snippets/Generated
        // by Scripts/check-snippets.sh (CI runs it before this build), beside what they take as given
        // (Context.swift). A library: its snippets compile and are never run.
        .target(
            name: "Snippets",
            dependencies: [
                .product(name: "StallMonitorNIO", package: "stallmon"),
                .product(name: "StallMonitorServiceLifecycle", package: "stallmon"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Vapor", package: "vapor"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "StallMonitorTracing", package: "stallmon"),
                .product(name: "StallMonitorTestKit", package: "stallmon"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "OTel", package: "swift-otel"),
            ]
        ),
    ]
)

for target in package.targets {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}
