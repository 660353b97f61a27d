import CStallCapture
import CoreFoundation
import Foundation
import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// What a child process runs on its main thread.
enum Workload: String, CaseIterable, Sendable {
    /// A main-queue block that re-posts itself.
    case busy
    /// The same, with about 50 µs of hashing a pass.
    case work
    /// A repeating timer at a 1 µs interval: it fires on every pass of the loop.
    case timer
    /// A socketpair ping-pong with an echo thread that signals a run-loop source.
    case io
    /// Nothing: the loop sleeps.
    case idle
    /// Repeated short stalls: detection latency, duration error, resident memory.
    case stalls
    /// One long stall: the watchdog's CPU while it samples.
    case longStall = "long-stall"
    /// Direct samples of a thread 64 frames deep: time spent in the signal handler.
    case samplePause = "sample-pause"
    /// Round trips from the cooperative pool to the main actor (``AsyncWorkloads``).
    case mainActorHops = "main-actor-hops"
    /// Tiny tasks on the cooperative pool (``AsyncWorkloads``).
    case poolTasks = "pool-tasks"
    /// Tasks of about 50 µs of hashing each on the cooperative pool (``AsyncWorkloads``).
    case poolWork = "pool-work"
    /// One stall after the monitor settled: the resident memory its report costs.
    case firstStall = "first-stall"
}

/// One child run: `--child VARIANT WORKLOAD [--NAME VALUE]...`, the hidden argument form the
/// benchmark re-executes itself with.
struct ChildRequest: Sendable {
    var variant: Variant
    var workload: Workload
    var parameters: [String: String]

    init(_ variant: Variant, _ workload: Workload, _ parameters: [String: String] = [:]) {
        self.variant = variant
        self.workload = workload
        self.parameters = parameters
    }

    /// Parses the arguments that follow `--child`.
    init?(arguments: [String]) {
        guard arguments.count >= 2, let variant = Variant(rawValue: arguments[0]),
            let workload = Workload(rawValue: arguments[1])
        else { return nil }
        var parameters: [String: String] = [:]
        var rest = arguments.dropFirst(2).makeIterator()
        while let name = rest.next() {
            guard name.hasPrefix("--"), let value = rest.next() else { return nil }
            parameters[String(name.dropFirst(2))] = value
        }
        self.init(variant, workload, parameters)
    }

    var arguments: [String] {
        ["--child", variant.rawValue, workload.rawValue]
            + parameters.sorted { $0.key < $1.key }.flatMap { ["--\($0.key)", $0.value] }
    }

    /// The default configuration, with the loop-latency histogram when `--loop_latency 1` asks for it.
    var monitorConfiguration: StallMonitor.Configuration {
        var configuration = StallMonitor.Configuration()
        configuration.loopLatency = parameters["loop_latency"] == "1"
        return configuration
    }

    func int(_ name: String, default value: Int) -> Int { parameters[name].flatMap { Int($0) } ?? value }
    func double(_ name: String, default value: Double) -> Double { parameters[name].flatMap { Double($0) } ?? value }
}

/// The child side: installs the variant, starts the workload on the main run loop, and ends the
/// process with one marked result line on standard output.
enum Child {
    static let resultMarker = "stallmon-bench-result "

    static func run(_ request: ChildRequest) -> Never {
        // A child that hangs is killed rather than hanging the benchmark.
        alarm(UInt32(request.int("timeout", default: 120)))
        do {
            switch request.workload {
            case .busy, .work, .timer, .io, .idle:
                try ThroughputWorkloads.start(request)
            case .stalls:
                try StallWorkloads.startRepeatedStalls(request)
            case .longStall:
                try StallWorkloads.startLongStall(request)
            case .samplePause:
                SamplePause.run(request)
            case .mainActorHops, .poolTasks, .poolWork:
                try AsyncWorkloads.start(request)
                // The runtime's drain of an async main, or the one start(.asyncMain) installs.
                if request.variant == .unmonitored { dispatchMain() }
                stallmon_async_main_light_drain()
                fail("the light drain returned: libdispatch has no main-queue port")
            case .firstStall:
                try StallWorkloads.startFirstStall(request)
            }
        } catch {
            fail("\(request.variant.rawValue) \(request.workload.rawValue): \(error)")
        }
        if request.parameters["loop"] == "cf" {
            CFRunLoopRun()
        } else {
            RunLoop.main.run()
        }
        fail("the main run loop returned")
    }

    /// Writes the result and ends the process at once, without running exit handlers while the
    /// monitor's threads are still running.
    static func finish(_ result: [String: Double]) -> Never {
        let finite = result.filter { $0.value.isFinite }
        let json = (try? JSONSerialization.data(withJSONObject: finite, options: [.sortedKeys])) ?? Data("{}".utf8)
        writeAll(1, Data(resultMarker.utf8) + json + Data("\n".utf8))
        _exit(0)
    }

    static func fail(_ message: String) -> Never {
        writeAll(2, Data("stallmon-bench child: \(message)\n".utf8))
        _exit(1)
    }

    private static func writeAll(_ descriptor: Int32, _ data: Data) {
        data.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { return }
                offset += written
            }
        }
    }
}
