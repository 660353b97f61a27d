import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// EXAMPLE_STDERR_CHATTER: a thread of the service that writes a line of its own to standard error
/// every few milliseconds, one `write` each (`example chatter <n> <padding>`), as a service's own
/// logging does beside stallmon's reports.
public enum StandardErrorChatter {
    /// Starts the thread when `interval` (milliseconds) is set.
    public static func start(every interval: Int?) {
        guard let interval else { return }
        let thread = Thread {
            let padding = String(repeating: "x", count: 200)
            var count = 0
            while true {
                let line = Array("example chatter \(count) \(padding)\n".utf8)
                _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
                count += 1
                usleep(useconds_t(interval * 1000))
            }
        }
        thread.name = "example-chatter"
        thread.start()
    }
}
