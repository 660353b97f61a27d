// What the example services print and read: JSON lines on standard output (the tests read the
// bound port from them), the port from the environment, and the milliseconds a request asks for.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum ServiceOutput {
    /// Prints one JSON object on a line of its own and flushes it (standard output is a pipe under test).
    public static func line(_ fields: [String: any Sendable]) {
        guard JSONSerialization.isValidJSONObject(fields),
            let data = try? JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
        else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }

    /// `{"event":"listening","port":N}`: the service accepts connections on `port`.
    public static func listening(port: Int) {
        line(["event": "listening", "port": port])
    }
}

public enum ServiceEnvironment {
    /// The port to listen on, from `PORT` (default 8080; 0 picks a free one, printed once bound).
    public static var port: Int {
        ProcessInfo.processInfo.environment["PORT"].flatMap(Int.init) ?? 8080
    }

    /// `EXAMPLE_NIO_TAKEOVER`: `before` or `after` installs NIO's singleton event loops as Swift
    /// Concurrency's global executor before or after stallmon starts; anything else, not at all.
    public static var nioTakeover: String? {
        let value = ProcessInfo.processInfo.environment["EXAMPLE_NIO_TAKEOVER"]
        return value == "before" || value == "after" ? value : nil
    }

    /// `EXAMPLE_STALLMON=off` runs the service without stallmon: the same binary, unmonitored (the
    /// benchmark compares the two).
    public static var stallmon: Bool {
        ProcessInfo.processInfo.environment["EXAMPLE_STALLMON"] != "off"
    }

    /// `EXAMPLE_DENY_IO_URING=1` makes io_uring_setup(2) fail (``IOUringDenial``), for valgrind.
    public static var denyIOUring: Bool {
        ProcessInfo.processInfo.environment["EXAMPLE_DENY_IO_URING"] == "1"
    }

    /// `EXAMPLE_MAIN_RUN_LOOP=1` has the main thread run RunLoop.main rather than dispatch_main()
    /// (``MainRunLoop``), for the unmonitored service under valgrind.
    public static var mainRunLoop: Bool {
        ProcessInfo.processInfo.environment["EXAMPLE_MAIN_RUN_LOOP"] == "1"
    }

    /// `EXAMPLE_PRINT_REPORTS=1` sends the monitor's reports to standard output, one line each,
    /// instead of the journal.
    public static var printReports: Bool {
        ProcessInfo.processInfo.environment["EXAMPLE_PRINT_REPORTS"] == "1"
    }

    /// `EXAMPLE_SINK`: where the monitor's default sinks send reports (`journal`, `json`, `text`,
    /// `logger`), set in code as a service would (`configuration.sink`); unset, `STALLMON_SINK` or
    /// the monitor's choice.
    public static var sink: String? {
        ProcessInfo.processInfo.environment["EXAMPLE_SINK"]
    }

    /// `EXAMPLE_STDERR_CHATTER=N`: a line of the service's own on standard error every N ms
    /// (``StandardErrorChatter``), so that a test sees the reports' lines beside others.
    public static var standardErrorChatter: Int? {
        ProcessInfo.processInfo.environment["EXAMPLE_STDERR_CHATTER"].flatMap(Int.init).flatMap { $0 > 0 ? $0 : nil }
    }

    /// The `ms` a stalling route asks for: 1 to 10,000, else 100.
    public static func milliseconds(_ value: Int?) -> Int {
        guard let value, (1...10_000).contains(value) else { return 100 }
        return value
    }
}
