// An HTTP/1.1 server on SwiftNIO whose handlers stall on request, monitored by NIOStallMonitor:
// `stallmon demo --nio`, the tests and the benchmark run it as a child process.
//
//   StallmonNIOServer [--port N] [--threads N] [--threshold-ms N] [--no-monitor] [--print-reports]
//                     [--deny-io-uring] [--tick-delegate]
//
// It prints `listening on <port>` once ready and serves:
//   /hello            `hello`, and nothing else: the benchmark's request
//   /cpu?ms=N         spins on the CPU for N ms inside the handler
//   /sleep?ms=N       blocks in nanosleep for N ms (a blocking system call)
//   /lock?ms=N        waits N ms for a mutex another thread holds
//   /task?ms=N, /scheduled?ms=N, /future?ms=N
//                     spin N ms in an `execute` task, a scheduled task or a future's callback
//   /traced-cpu?ms=N, /traced-sleep?ms=N
//                     the same as /cpu and /sleep inside a span of StallmonTracer (alone) started on
//                     the event loop, outside any task: the span of a NIO handler's own tracing
//   /stats            the monitor's counters: watchdog wakeups, stalls
// Stalling handlers answer with the time the handler itself measured, and when it began (CLOCK_MONOTONIC):
// `{"handler":…,"truth_us":…,"start_ns":…,"loop":…}`.
// With --print-reports, the monitor's reports go to standard output instead of the journal, one line
// each, as the benchmark reads them: `report <event> start_ns=N duration_ns=N threshold_ns=N emitted_ns=N`.
// --deny-io-uring makes io_uring_setup fail with ENOSYS (a seccomp filter, as a service's own could):
// the watchdog then falls back to looking at idle loops once per threshold. valgrind needs it, since it
// holds its lock while a thread waits in io_uring_enter and the whole process hangs.
// The group is a plain MultiThreadedEventLoopGroup, watched with heartbeats as a framework's would be;
// --tick-delegate makes it with the monitor's metrics delegate instead (stalls timed from tick ends).
// SIGTERM or SIGINT stops the monitor (every report written) and exits.
import CStallCapture
import Dispatch
import NIOCore
import NIOHTTP1
import NIOPosix
import StallMonitor
import StallMonitorNIO
import StallMonitorTracing
import StallmonFixtureKit
import Synchronization
import Tracing

#if canImport(Glibc)
import Glibc
#endif

struct Options {
    var port = 0
    var threads = 2
    var thresholdMilliseconds: Int?
    var monitor = true
    var printReports = false
    var denyIOUring = false
    var tickDelegate = false

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var iterator = arguments.dropFirst().makeIterator()
        while let argument = iterator.next() {
            func value() -> Int {
                guard let text = iterator.next(), let number = Int(text), number >= 0 else {
                    fail("\(argument) needs a non-negative number")
                }
                return number
            }
            switch argument {
            case "--port": options.port = value()
            case "--threads": options.threads = max(1, value())
            case "--threshold-ms": options.thresholdMilliseconds = value()
            case "--no-monitor": options.monitor = false
            case "--print-reports": options.printReports = true
            case "--deny-io-uring": options.denyIOUring = true
            case "--tick-delegate": options.tickDelegate = true
            default: fail("unknown argument \(argument)")
            }
        }
        return options
    }
}

func fail(_ message: String) -> Never {
    FileHandleOutput.standardError("StallmonNIOServer: \(message)\n")
    exit(64)
}

enum FileHandleOutput {
    static func standardError(_ text: String) {
        var text = text
        text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    }

    static func standardOutput(_ text: String) {
        var text = text
        text.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
    }
}

// MARK: - The stalling handlers (what the reports should name)

/// Spins on the CPU for `milliseconds`.
@inline(never)
func stallOnCPU(milliseconds: Int) -> UInt64 {
    let start = stallmon_now_ns()
    var accumulator: UInt64 = 0
    while stallmon_now_ns() - start < UInt64(milliseconds) * 1_000_000 {
        for index in 0..<1000 { accumulator = accumulator &* 31 &+ UInt64(index) }
    }
    blackHole(accumulator)
    return stallmon_now_ns() - start
}

/// Blocks in `nanosleep` for `milliseconds`, resuming after any interruption.
@inline(never)
func stallInSleep(milliseconds: Int) -> UInt64 {
    let start = stallmon_now_ns()
    var request = timespec(tv_sec: milliseconds / 1000, tv_nsec: (milliseconds % 1000) * 1_000_000)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0, errno == EINTR {
        interruptions.add(1, ordering: .relaxed)
        request = remaining
    }
    return stallmon_now_ns() - start
}

/// Waits for a mutex that another thread holds for `milliseconds`.
@inline(never)
func stallOnLock(milliseconds: Int) -> UInt64 {
    let start = stallmon_now_ns()
    let holding = DispatchSemaphore(value: 0)
    let holder = Thread {
        pthread_mutex_lock(&sharedMutex)
        holding.signal()
        usleep(UInt32(milliseconds) * 1000)
        pthread_mutex_unlock(&sharedMutex)
    }
    holder.start()
    holding.wait()
    pthread_mutex_lock(&sharedMutex)
    pthread_mutex_unlock(&sharedMutex)
    return stallmon_now_ns() - start
}

@inline(never)
func blackHole(_ value: UInt64) {
    if value == 1 { FileHandleOutput.standardError("") }
}

nonisolated(unsafe) var sharedMutex = pthread_mutex_t()
/// Times `nanosleep` returned EINTR in a handler: a monitor that signalled a blocked loop shows here.
let interruptions = Atomic<Int>(0)

final class Thread {
    private let body: () -> Void

    init(_ body: @escaping () -> Void) {
        self.body = body
    }

    func start() {
        let box = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let rc = pthread_create(
            &thread, nil,
            { context in
                let this = Unmanaged<Thread>.fromOpaque(context!).takeRetainedValue()
                this.body()
                return nil
            }, box)
        if rc == 0 { pthread_detach(thread) }
    }
}

// MARK: - HTTP

final class StallHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let monitor: NIOStallMonitor?
    /// The head of the request being read (the channel's own loop only touches it).
    private let pending: NIOLoopBoundBox<HTTPRequestHead?>

    init(monitor: NIOStallMonitor?, eventLoop: any EventLoop) {
        self.monitor = monitor
        self.pending = NIOLoopBoundBox(nil, eventLoop: eventLoop)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): pending.value = head
        case .body: break
        case .end:
            guard let head = pending.value else { return }
            pending.value = nil
            respond(context: context, head: head)
        }
    }

    /// Runs the handler the path names, inside the channel read of the request's end.
    private func respond(context: ChannelHandlerContext, head: HTTPRequestHead) {
        let (path, milliseconds) = Self.route(head.uri)
        if path == "/hello" {
            Self.send(context: context, head: head, path: path, body: "hello")
            return
        }
        // CPU stalls in other kinds of loop work: an `execute` task, a scheduled task, a future's callback.
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let later: @Sendable (String) -> Void = { kind in
            Self.send(
                context: bound.value, head: head, path: path,
                body: Self.timed(kind) { stallOnCPU(milliseconds: milliseconds) })
        }
        switch path {
        case "/task":
            context.eventLoop.execute { later("task") }
            return
        case "/scheduled":
            context.eventLoop.scheduleTask(in: .milliseconds(1)) { later("scheduled") }
            return
        case "/future":
            let promise = context.eventLoop.makePromise(of: Void.self)
            promise.futureResult.whenSuccess { later("future") }
            context.eventLoop.execute { promise.succeed(()) }
            return
        default: break
        }
        var body: String
        switch path {
        case "/cpu": body = Self.timed("cpu") { stallOnCPU(milliseconds: milliseconds) }
        case "/sleep": body = Self.timed("sleep") { stallInSleep(milliseconds: milliseconds) }
        case "/lock": body = Self.timed("lock") { stallOnLock(milliseconds: milliseconds) }
        case "/traced-cpu", "/traced-sleep":
            body = Self.tracer.withSpan("GET \(path)", ofKind: .server) { span in
                span.attributes["http.request.method"] = "GET"
                span.attributes["http.route"] = path
                return path == "/traced-cpu"
                    ? Self.timed("cpu") { stallOnCPU(milliseconds: milliseconds) }
                    : Self.timed("sleep") { stallInSleep(milliseconds: milliseconds) }
            }
        case "/stats":
            let statistics = monitor?.statistics
            body =
                "{\"wakeups\":\(monitor?.watchdogWakeups ?? 0),\"stalls\":\(statistics?.stalls ?? 0),"
                + "\"interruptions\":\(interruptions.load(ordering: .relaxed))}"
        default: body = "hello from \(ThreadName.current())"
        }
        Self.send(context: context, head: head, path: path, body: body)
    }

    private static func send(context: ChannelHandlerContext, head: HTTPRequestHead, path: String, body: String) {
        let body = body + "\n"
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: String(body.utf8.count))
        headers.add(name: "Content-Type", value: path == "/hello" ? "text/plain" : "application/json")
        let keepAlive = head.isKeepAlive
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        let head = HTTPServerResponsePart.head(HTTPResponseHead(version: head.version, status: .ok, headers: headers))
        context.write(NIOAny(head)).whenFailure { _ in }
        var buffer = context.channel.allocator.buffer(capacity: body.utf8.count)
        buffer.writeString(body)
        context.write(NIOAny(HTTPServerResponsePart.body(.byteBuffer(buffer)))).whenFailure { _ in }
        let done = context.writeAndFlush(NIOAny(HTTPServerResponsePart.end(nil)))
        if !keepAlive {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
    }

    /// The tracer of /traced-*: alone, as a service without a tracing backend runs it.
    static let tracer = StallmonTracer()

    static func route(_ uri: String) -> (path: String, milliseconds: Int) {
        let parts = uri.split(separator: "?", maxSplits: 1)
        let path = parts.first.map(String.init) ?? "/"
        var milliseconds = 300
        if parts.count == 2 {
            for pair in parts[1].split(separator: "&") where pair.hasPrefix("ms=") {
                milliseconds = min(Int(pair.dropFirst(3)) ?? milliseconds, 60_000)
            }
        }
        return (path, milliseconds)
    }

    /// Runs a stalling handler; its answer says how long it took by its own clock and when it began.
    static func timed(_ handler: String, _ stall: () -> UInt64) -> String {
        let loop = ThreadName.current()
        let start = stallmon_now_ns()
        let nanoseconds = stall()
        return "{\"handler\":\"\(handler)\",\"truth_us\":\(nanoseconds / 1000),\"start_ns\":\(start),"
            + "\"loop\":\"\(loop)\"}"
    }
}

enum ThreadName {
    static func current() -> String {
        // The kernel's name of the thread (`comm`), which NIO sets to `NIO-ELT-<group>-#<n>`.
        let descriptor = open("/proc/thread-self/comm", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return "?" }
        defer { close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: 32)
        let count = read(descriptor, &bytes, bytes.count)
        guard count > 0 else { return "?" }
        return String(decoding: bytes[0..<count].prefix { $0 != UInt8(ascii: "\n") }, as: UTF8.self)
    }
}

// MARK: - Reports on standard output

/// With --print-reports: each stall report as one line on standard output, stamped when it reached
/// the sink, for the benchmark's detection latency.
struct PrintingSink: ReportSink {
    func emit(_ event: StallMonitorEvent) {
        let emitted = stallmon_now_ns()
        guard let report = event.report else { return }
        let name: String
        switch event.kind {
        case .stallDetected: name = "detected"
        case .stallEnded: name = "ended"
        default: return
        }
        FileHandleOutput.standardOutput(
            "report \(name) start_ns=\(report.startNanoseconds) duration_ns=\(Self.nanoseconds(report.duration)) "
                + "threshold_ns=\(Self.nanoseconds(report.threshold)) emitted_ns=\(emitted)\n")
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

// MARK: - io_uring denied

/// Makes `io_uring_setup(2)` (425 on x86_64 and arm64 alike) fail with ENOSYS from now on. Call it
/// before any other thread starts: valgrind has no seccomp(2), and prctl's filter applies to the
/// calling thread and those it starts.
enum IOUringDenial {
    static let ioUringSetup: UInt32 = 425

    static func install() {
        if let failure = SyscallDenial.install(denying: ioUringSetup, .thisThreadAndItsChildren) { fail(failure) }
    }
}

// MARK: - Main

nonisolated(unsafe) var signalSources: [any DispatchSourceSignal] = []

/// SIGTERM and SIGINT stop the monitor, so that every report is written, then exit. The handlers
/// run on a dispatch queue, not the main actor.
nonisolated func installStopHandlers(monitor: NIOStallMonitor?) {
    for signalNumber in [SIGTERM, SIGINT] {
        signal(signalNumber, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
        source.setEventHandler {
            monitor?.stop()
            exit(0)
        }
        source.resume()
        signalSources.append(source)
    }
}

let options = Options.parse(CommandLine.arguments)
if options.denyIOUring { IOUringDenial.install() }
pthread_mutex_init(&sharedMutex, nil)
signal(SIGPIPE, SIG_IGN)

let monitor: NIOStallMonitor?
let group: MultiThreadedEventLoopGroup
do {
    if options.monitor {
        var configuration = try StallMonitor.Configuration.fromEnvironment()
        if let threshold = options.thresholdMilliseconds {
            configuration.threshold = .milliseconds(threshold)
            configuration.sampleInterval = min(configuration.sampleInterval, configuration.threshold)
        }
        let created = try NIOStallMonitor(
            configuration: configuration, sinks: options.printReports ? [PrintingSink()] : nil)
        if options.tickDelegate {
            group = try created.makeEventLoopGroup(numberOfThreads: options.threads)
        } else {
            group = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
            try created.start(group)
        }
        monitor = created
    } else {
        group = MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
        monitor = nil
    }
} catch {
    fail("\(error)")
}

let bootstrap = ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.configureHTTPServerPipeline()
            try channel.pipeline.syncOperations.addHandler(StallHandler(monitor: monitor, eventLoop: channel.eventLoop))
        }
    }

let channel: any Channel
do {
    channel = try bootstrap.bind(host: "127.0.0.1", port: options.port).wait()
} catch {
    fail("cannot listen on 127.0.0.1:\(options.port): \(error)")
}

installStopHandlers(monitor: monitor)

FileHandleOutput.standardOutput("listening on \(channel.localAddress?.port ?? 0)\n")
try channel.closeFuture.wait()
