/// The benchmark's command line.
struct Options: Sendable {
    var rounds = 5
    var scale = 1.0
    var json = false
    /// `nil`: count instructions when valgrind is installed, unless the run is a quick one.
    var callgrind: Bool?
    var quick = false
    /// Whether only the collector's cost per journal entry is measured.
    var collectorOnly = false
    /// Whether only what `StallmonTracer` adds to a span and the pool hook to a job is measured.
    var tracingOnly = false
    /// Whether only what a report costs each sink is measured.
    var sinksOnly = false
    /// Whether the children run their loop with CFRunLoopRun() rather than RunLoop.main.run().
    var cfRunLoop = false
    /// Whether the SwiftNIO benchmark runs (wrk against StallmonNIOServer), and whether only it does.
    var nio = true
    var nioOnly = false
    /// Whether the Hummingbird benchmark runs (wrk against Examples' HummingbirdFixture), from which
    /// executable (`nil`: the Examples package's build), and whether only it does.
    var hummingbird = true
    var hummingbirdPath: String?
    var hummingbirdOnly = false
    /// Whether the part watched from outside runs (the Hummingbird fixture without stallmon under
    /// stallmond's BPF tick watcher), and whether only it does.
    var external = true
    var externalOnly = false

    static let usage = """
        USAGE: stallmon-bench [--rounds N] [--scale X] [--quick] [--json] [--callgrind | --no-callgrind]
                              [--cf-run-loop] [--no-nio | --nio-only]
                              [--hummingbird PATH | --no-hummingbird | --hummingbird-only]
                              [--no-external | --external-only]

        Measures stallmon's cost against an unmonitored loop, a no-op observer and the blog design.
        Each workload runs in a fresh child process; the variants alternate in every round.

        OPTIONS:
          --rounds N       Rounds of unmonitored, noop-observer, stallmon, blog (default 5).
          --scale X        Multiplies pass counts, durations and stall counts (default 1).
          --quick          A smoke run for CI: one round at scale 0.05, no instruction counts.
          --json           Prints the figures as one JSON object; the table goes to standard error.
          --callgrind      Counts instructions per busy pass under valgrind (default when installed).
          --no-callgrind   Skips the instruction counts.
          --collector-only Measures the collector's and the flame graph's cost per journal entry alone.
          --sinks-only     Measures what a report costs each sink (journal, JSON and text lines, a
                           Logger) alone.
          --cf-run-loop    Runs the loops with CFRunLoopRun() instead of RunLoop.main.run(), which
                           leaves and re-enters the loop after every source it handles.
          --no-nio         Skips the SwiftNIO benchmark (wrk against StallmonNIOServer, which must
                           be built next to stallmon-bench: swift build -c release --product
                           StallmonNIOServer).
          --nio-only       Runs the SwiftNIO benchmark alone.
          --hummingbird PATH
                           The HummingbirdFixture executable of the Hummingbird benchmark (default:
                           Examples/.build/release/HummingbirdFixture, else .../debug/..., under the
                           current directory or the repository; skipped with a note when absent).
          --no-hummingbird Skips the Hummingbird benchmark.
          --hummingbird-only
                           Runs the Hummingbird benchmark alone.
          --no-external    Skips the part watched from outside: the HummingbirdFixture without stallmon
                           under stallmond's BPF tick watcher (stallmond and stallmond-daemon built
                           next to stallmon-bench; root; skipped with a note when it cannot run).
          --external-only  Runs the part watched from outside alone.
          -h, --help       Shows this help.
        """

    struct UsageError: Error, CustomStringConvertible {
        var description: String
    }

    init(_ arguments: [String]) throws(UsageError) {
        var iterator = arguments.makeIterator()
        var explicitRounds: Int?
        var explicitScale: Double?
        while let argument = iterator.next() {
            switch argument {
            case "--rounds":
                guard let value = iterator.next().flatMap({ Int($0) }), value >= 1 else {
                    throw UsageError(description: "--rounds takes a whole number of at least 1")
                }
                explicitRounds = value
            case "--scale":
                guard let value = iterator.next().flatMap({ Double($0) }), value > 0, value <= 10 else {
                    throw UsageError(description: "--scale takes a number above 0 and at most 10")
                }
                explicitScale = value
            case "--quick": quick = true
            case "--json": json = true
            case "--collector-only": collectorOnly = true
            case "--tracing-only": tracingOnly = true
            case "--sinks-only": sinksOnly = true
            case "--callgrind": callgrind = true
            case "--no-callgrind": callgrind = false
            case "--cf-run-loop": cfRunLoop = true
            case "--no-nio": nio = false
            case "--nio-only": nioOnly = true
            case "--hummingbird":
                guard let value = iterator.next() else { throw UsageError(description: "--hummingbird takes a path") }
                hummingbirdPath = value
            case "--no-hummingbird": hummingbird = false
            case "--hummingbird-only": hummingbirdOnly = true
            case "--no-external": external = false
            case "--external-only": externalOnly = true
            default: throw UsageError(description: "unknown argument '\(argument)'")
            }
        }
        if nioOnly && !nio { throw UsageError(description: "--nio-only and --no-nio exclude each other") }
        if hummingbirdOnly && !hummingbird {
            throw UsageError(description: "--hummingbird-only and --no-hummingbird exclude each other")
        }
        if hummingbirdOnly && nioOnly {
            throw UsageError(description: "--hummingbird-only and --nio-only exclude each other")
        }
        if externalOnly && !external {
            throw UsageError(description: "--external-only and --no-external exclude each other")
        }
        if externalOnly && (nioOnly || hummingbirdOnly) {
            throw UsageError(description: "--external-only excludes --nio-only and --hummingbird-only")
        }
        if quick {
            rounds = 1
            scale = 0.05
            callgrind = callgrind ?? false
        }
        rounds = explicitRounds ?? rounds
        scale = explicitScale ?? scale
    }
}
