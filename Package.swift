// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "stallmon",
    products: [
        .library(name: "StallMonitor", targets: ["StallMonitor"]),
        .library(name: "StallJournal", targets: ["StallJournal"]),
        .library(name: "StallMonitorNIO", targets: ["StallMonitorNIO"]),
        // For services built on swift-service-lifecycle: the monitor as a `Service` of a `ServiceGroup`.
        .library(name: "StallMonitorServiceLifecycle", targets: ["StallMonitorServiceLifecycle"]),
        .executable(name: "stallmon", targets: ["stallmon"]),
        .executable(name: "stallmond", targets: ["stallmond"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
    ],
    targets: [
        // libsystemd: journald (sd_journal_sendv) and service notification (sd_notify).
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // Async-signal-safe capture: the run-loop observer callouts, the sample slot and the signal handler;
        // and the in-place unwinder of threads blocked in the kernel (libunwind's remote interface).
        .target(
            name: "CStallCapture",
            linkerSettings: [.linkedLibrary("unwind"), .linkedLibrary("unwind-generic")]
        ),
        // Symbolication of captured addresses through elfutils' libdw, and Swift demangling.
        .target(
            name: "CSymbolize",
            linkerSettings: [.linkedLibrary("dw"), .linkedLibrary("elf")]
        ),
        .target(
            name: "StallJournal",
            dependencies: ["CSystemd"]
        ),
        .target(
            name: "StallMonitor",
            dependencies: [
                "CStallCapture",
                "CSymbolize",
                "CSystemd",
                "StallJournal",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // SwiftNIO event loops: a metrics delegate that counts ticks, and one watchdog per group.
        // Its own target, so that services without NIO never build NIO.
        .target(
            name: "StallMonitorNIO",
            dependencies: [
                "StallMonitor",
                "CStallCapture",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // StallMonitorService: starts the monitor, stops it on graceful shutdown; only services that
        // use swift-service-lifecycle build it.
        .target(
            name: "StallMonitorServiceLifecycle",
            dependencies: [
                "StallMonitor",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The collector's logic: journal following, aggregation, state, metrics, digest.
        .target(
            name: "StallCollector",
            dependencies: [
                "StallJournal",
                "StallMonitor",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "stallmond",
            dependencies: [
                "StallCollector",
                "StallMonitor",
                "StallJournal",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "stallmon",
            dependencies: [
                "StallCollector",
                "StallMonitor",
                "StallJournal",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Measures the monitor's cost against an unmonitored loop, a no-op observer and the blog design.
        .executableTarget(
            name: "stallmon-bench",
            dependencies: ["StallMonitor", "CStallCapture"]
        ),
        // What the fixture services share: clocks, JSON lines on standard output, the reporting sink.
        .target(
            name: "StallmonFixtureKit",
            dependencies: ["StallMonitor", "StallJournal"]
        ),
        // A small service with a real main run loop that stalls on request; the tests drive it as a child process.
        .executableTarget(
            name: "StallmonFixture",
            dependencies: ["StallMonitor", "StallJournal", "StallmonFixtureKit"]
        ),
        // An HTTP server on SwiftNIO whose handlers stall on request; `stallmon demo --nio` and the
        // tests run it as a child process.
        .executableTarget(
            name: "StallmonNIOServer",
            dependencies: [
                "StallMonitor",
                "StallMonitorNIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // The same for an async @main service, whose main actor has no run loop unless the monitor runs one.
        .executableTarget(
            name: "StallmonAsyncFixture",
            dependencies: ["StallMonitor", "StallJournal", "CStallCapture", "StallmonFixtureKit"]
        ),
        // An async @main whose monitor runs as a service of a ServiceGroup, next to a service that
        // stalls the main actor; SIGTERM shuts the group down gracefully.
        .executableTarget(
            name: "StallmonServiceFixture",
            dependencies: [
                "StallMonitor", "StallJournal", "StallMonitorServiceLifecycle", "StallmonFixtureKit",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "StallMonitorTests",
            dependencies: [
                "StallMonitor", "StallJournal", "StallCollector", "StallmonFixture", "StallmonAsyncFixture",
                "StallmonNIOServer", "StallmonServiceFixture", "stallmon", "stallmond",
            ]
        ),
    ]
)

for target in package.targets where target.type != .system && target.name.first != "C" {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}
