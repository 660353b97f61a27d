// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "stallmon",
    // Where a service is developed, not where it runs: on macOS the libraries build and do nothing
    // (see LinuxImplementation below), from macOS 15 on, the first with Synchronization's Mutex and Atomic.
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "StallMonitor", targets: ["StallMonitor"]),
        .library(name: "StallJournal", targets: ["StallJournal"]),
        .library(name: "StallMonitorNIO", targets: ["StallMonitorNIO"]),
        // For services built on swift-service-lifecycle: the monitor as a `Service` of a `ServiceGroup`.
        .library(name: "StallMonitorServiceLifecycle", targets: ["StallMonitorServiceLifecycle"]),
        // For services traced with swift-distributed-tracing: stalls name their requests.
        .library(name: "StallMonitorTracing", targets: ["StallMonitorTracing"]),
        // For a service's own tests: fail a test on any stall, and collect reports in memory.
        .library(name: "StallMonitorTestKit", targets: ["StallMonitorTestKit"]),
        .executable(name: "stallmon", targets: ["stallmon"]),
        .executable(name: "stallmond", targets: ["stallmond"]),
        // What `stallmond` runs in its place: install both, in one directory, and start `stallmond`.
        .executable(name: "stallmond-daemon", targets: ["stallmond-daemon"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.2"),
    ],
    targets: [
        // libsystemd: reading the journal (sd_journal) and service notification (sd_notify). Entries
        // are written in journald's native protocol (StallJournal's JournalConnection).
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // The one platform header of the C targets: whether they build their Linux implementation.
        .target(name: "CStallPlatform"),
        // Async-signal-safe capture: the run-loop observer callouts, the sample slot and the signal handler;
        // and the in-place unwinder of threads blocked in the kernel (libunwind's remote interface).
        .target(
            name: "CStallCapture",
            dependencies: ["CStallPlatform"],
            linkerSettings: [
                .linkedLibrary("unwind", .when(platforms: [.linux])),
                .linkedLibrary("unwind-generic", .when(platforms: [.linux])),
            ]
        ),
        // Symbolication of captured addresses through elfutils' libdw, and Swift demangling.
        .target(
            name: "CSymbolize",
            dependencies: ["CStallPlatform"],
            linkerSettings: [
                .linkedLibrary("dw", .when(platforms: [.linux])), .linkedLibrary("elf", .when(platforms: [.linux])),
            ]
        ),
        // stallmond's tick watcher: the BPF program on the wait system calls' tracepoints (bpf/, built
        // by Scripts/build-bpf.sh into the committed ticks_object.c) and its loader, through libbpf;
        // the in-place unwinder of another process's blocked threads, through elfutils' libdwfl.
        .target(
            name: "CStallWatch",
            dependencies: ["CStallPlatform"],
            exclude: ["bpf"],
            linkerSettings: [
                .linkedLibrary("bpf", .when(platforms: [.linux])), .linkedLibrary("dw", .when(platforms: [.linux])),
                .linkedLibrary("elf", .when(platforms: [.linux])),
            ]
        ),
        // The benchmark's perf_event_open and bpf calls (no glibc wrappers; syscall(2) is variadic).
        .target(name: "CStallBench", dependencies: ["CStallPlatform"]),
        .target(
            name: "StallJournal",
            dependencies: ["CSystemd"]
        ),
        // The monitor's and the collector's configuration: files, environment, strict JSON, checks.
        // No capture code, so that parsing configuration links neither libunwind nor libdw.
        .target(name: "StallConfiguration"),
        .target(
            name: "StallMonitor",
            dependencies: [
                "StallConfiguration",
                "CStallCapture",
                "CSymbolize",
                "CSystemd",
                "StallJournal",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
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
                .product(name: "CoreMetrics", package: "swift-metrics"),
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
        // StallmonTracer: a tracer (alone, or wrapping the service's) whose spans tell the monitor
        // which request a thread serves; only services that use swift-distributed-tracing build it.
        .target(
            name: "StallMonitorTracing",
            dependencies: [
                "StallMonitor",
                "StallJournal",
                "CStallCapture",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
            ]
        ),
        // withStallDetection and CollectingSink, for the tests of a service and of this package.
        .target(
            name: "StallMonitorTestKit",
            dependencies: [
                "StallMonitor",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ]
        ),
        // The collector's logic: journal following, aggregation, state, metrics, digest.
        .target(
            name: "StallCollector",
            dependencies: [
                "StallJournal",
                "StallConfiguration",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // stallmond: SIGHUP blocked a few tenths of a millisecond after exec, then the daemon in its
        // place (Sources/stallmond/stallmond.c says why). Static and without the Swift runtime, which
        // a C executable would otherwise link: its loading is what delays the daemon's first instruction.
        .executableTarget(
            name: "stallmond",
            linkerSettings: [.unsafeFlags(["-static-executable", "-nostartfiles"], .when(platforms: [.linux]))]
        ),
        // The collector daemon.
        .executableTarget(
            name: "stallmond-daemon",
            dependencies: [
                "StallCollector",
                "StallConfiguration",
                "CStallWatch",
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
            dependencies: [
                "StallMonitor", "CStallCapture", "StallCollector", "StallJournal", "StallMonitorTracing",
                "StallmonBenchTracer", "CStallBench",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
        // The tracer the benchmark wraps, in a module of its own as a service's tracer is.
        .target(
            name: "StallmonBenchTracer",
            dependencies: [.product(name: "Tracing", package: "swift-distributed-tracing")]
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
                "StallmonFixtureKit",
                "StallMonitorTracing",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // The same for an async @main service, whose main actor has no run loop unless the monitor runs one.
        .executableTarget(
            name: "StallmonAsyncFixture",
            dependencies: [
                "StallMonitor", "StallJournal", "CStallCapture", "StallmonFixtureKit", "StallMonitorNIO",
                "StallMonitorTracing", .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ]
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
        // A plain C service with an epoll loop and no stallmon in it, that stalls on command: what
        // stallmond's tick watcher watches from outside in the tests.
        .executableTarget(name: "StallmonEpollFixture"),
        // What a service gets on every platform: `PRETEND_NON_LINUX=1 swift test` runs them as elsewhere.
        .testTarget(
            name: "StallMonitorPortableTests",
            dependencies: [
                "StallMonitor", "StallJournal", "StallMonitorNIO", "StallMonitorServiceLifecycle",
                "StallMonitorTestKit",
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The tests: a target per module, for what it does in this process, and StallmonIntegrationTests
        // for what the project does end to end. Only that one depends on the executables: it runs them
        // as child processes, and `swift test` builds them first. All of them share StallmonTestSupport:
        // the executables as child processes, a real journald, systemd in a namespace, journal entries,
        // and `Serial`, the suites that run one at a time, whichever target they are in.
        .target(
            name: "StallmonTestSupport",
            dependencies: ["StallJournal", .product(name: "Logging", package: "swift-log")],
            path: "Tests/StallmonTestSupport"
        ),
        .testTarget(name: "StallConfigurationTests", dependencies: ["StallConfiguration", "StallMonitor"]),
        .testTarget(name: "StallJournalTests", dependencies: ["StallJournal"]),
        .testTarget(
            name: "StallMonitorTests",
            dependencies: [
                "StallMonitor", "StallJournal", "CStallCapture", "StallmonFixtureKit", "StallmonTestSupport",
                "StallMonitorTestKit", .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        // StallmonTracer's spans and the table of requests they register in, in process.
        .testTarget(
            name: "StallMonitorTracingTests",
            dependencies: [
                "StallMonitorTracing", "StallMonitor", "StallJournal", "CStallCapture",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
        .testTarget(
            name: "StallMonitorNIOTests",
            dependencies: [
                "StallMonitorNIO", "StallMonitor", "StallmonFixtureKit", "StallmonTestSupport",
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "StallCollectorTests",
            dependencies: [
                "StallCollector", "StallConfiguration", "StallJournal", "StallMonitor", "StallmonTestSupport",
            ]
        ),
        // Child processes: the fixtures, the NIO server, the CLI and the daemon, a real journald, a
        // real systemd; the suites that run them run one at a time (`Serial`). Not the C executables
        // `stallmond` and `StallmonEpollFixture`, which `swift build` builds with everything else: as a
        // dependency stallmond's C module changed where `timespec` comes from for these sources
        // (CoreFoundation), and MemberImportVisibility refused it.
        .testTarget(
            name: "StallmonIntegrationTests",
            dependencies: [
                "StallConfiguration", "StallMonitor", "StallJournal", "StallCollector", "CStallCapture",
                "StallmonFixtureKit", "StallmonTestSupport",
                "StallmonFixture", "StallmonAsyncFixture", "StallmonNIOServer", "StallmonServiceFixture", "stallmon",
                "stallmond-daemon",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)

for target in package.targets where target.type != .system && target.name.first != "C" {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    settings += LinuxImplementation.swiftSettings
    target.swiftSettings = settings
}
LinuxImplementation.apply(to: package)

/// The Linux implementation (the sampler, symbolication, journald, the service manager) builds on
/// Linux only. Elsewhere the libraries compile to a monitor that does nothing and says so
/// (`StallMonitor.isSupported` is false), so a service that depends on them still builds on a
/// developer's Mac. Swift code tests `#if STALLMON_LINUX`; C code `#if STALLMON_LINUX` after
/// including its target's header, which defines it on Linux: every C target's headers include
/// CStallPlatform's `stallmon_platform.h`.
///
/// `PRETEND_NON_LINUX=1` builds on Linux as on any other platform: the C headers and sources and
/// the Swift sources take their non-Linux branches, the Linux-only dependencies and libraries drop
/// out, and only the library products a service depends on and their portable tests remain. CI
/// builds and tests that configuration in a build path of its own. (Not a `STALLMON_` variable:
/// the library refuses unknown ones at run time.)
enum LinuxImplementation {
    static let pretendNonLinux = Context.environment["PRETEND_NON_LINUX"] == "1"
    /// Dependencies that only the Linux implementation uses.
    static let linuxOnlyTargets: Set<String> = ["CSystemd", "CSymbolize"]

    static var swiftSettings: [SwiftSetting] {
        pretendNonLinux
            ? [.unsafeFlags(["-Xcc", "-DSTALLMON_PRETEND_NON_LINUX"])]
            : [.define("STALLMON_LINUX", .when(platforms: [.linux]))]
    }

    static func apply(to package: Package) {
        for target in package.targets {
            target.dependencies = target.dependencies.compactMap { dependency in
                switch dependency {
                case .byNameItem(let name, .none) where linuxOnlyTargets.contains(name),
                    .targetItem(let name, .none) where linuxOnlyTargets.contains(name):
                    return pretendNonLinux ? nil : .target(name: name, condition: .when(platforms: [.linux]))
                default: return dependency
                }
            }
        }
        guard pretendNonLinux else { return }
        // The libraries a service depends on, the targets they need, and their portable tests; the
        // tools and fixtures are Linux's. Every C target stays, to show that it compiles here.
        package.products.removeAll { !($0 is Product.Library) }
        var kept: Set<String> = []
        var pending =
            package.products.flatMap { ($0 as? Product.Library)?.targets ?? [] } + ["StallMonitorPortableTests"]
            + package.targets.filter { $0.type == .regular && $0.name.first == "C" }.map(\.name)
        while let name = pending.popLast() {
            guard kept.insert(name).inserted, let target = package.targets.first(where: { $0.name == name }) else {
                continue
            }
            for case .byNameItem(let dependency, _) in target.dependencies { pending.append(dependency) }
            for case .targetItem(let dependency, _) in target.dependencies { pending.append(dependency) }
        }
        package.targets.removeAll { !kept.contains($0.name) }
        for target in package.targets where target.type == .regular && target.name.first == "C" {
            target.cSettings = (target.cSettings ?? []) + [.define("STALLMON_PRETEND_NON_LINUX")]
            target.linkerSettings = nil
        }
    }
}
