#if STALLMON_LINUX
import CStallCapture

#if canImport(Glibc)
import Glibc
#endif

/// The kernel's view of one thread of this process, read from `/proc/self/task/<tid>/`.
struct KernelThreadView: Sendable, Hashable {
    /// `R` running, `S` sleeping, `D` uninterruptible, `T` stopped, `t` traced, … (`?` unknown).
    var state: Character = "?"
    /// The system call the thread is in, `nil` when it runs in user space or it cannot be read.
    var syscall: String?
    /// The kernel function the thread waits in, `nil` when running or hidden.
    var waitChannel: String?
}

/// Reads `/proc/self/task/<tid>/…` with plain system calls: it runs on the watchdog thread for every
/// sample, so it avoids Foundation and keeps allocations to the strings it returns.
struct ThreadInspector: Sendable {
    let threadID: pid_t
    private let directory: String

    init(threadID: pid_t) {
        self.threadID = threadID
        self.directory = "/proc/self/task/\(threadID)/"
    }

    func view() -> KernelThreadView {
        var view = KernelThreadView()
        if let stat = Self.read(directory + "stat"), let close = stat.lastIndex(of: UInt8(ascii: ")")) {
            // "tid (comm) S ...": comm may hold spaces and parentheses, so parse after the last ')'.
            let stateIndex = stat.index(close, offsetBy: 2)
            if stateIndex < stat.endIndex {
                view.state = Character(Unicode.Scalar(stat[stateIndex]))
            }
        }
        view.syscall = syscall()
        if let wchan = Self.read(directory + "wchan") {
            let text = String(decoding: wchan, as: UTF8.self).trimmingCharacters(in: "\n")
            if !text.isEmpty, text != "0" { view.waitChannel = text }
        }
        return view
    }

    /// The signal mask of the thread (`SigBlk`), or `nil` when it cannot be read.
    /// The system call the thread is blocked in, `nil` when it runs or waits outside one.
    func syscall() -> String? {
        guard let syscall = Self.read(directory + "syscall") else { return nil }
        // "running", "-1 sp pc" (blocked, not in a call) or "nr arg1 … arg6 sp pc".
        let first = syscall.split(separator: UInt8(ascii: " ")).first.map { String(decoding: $0, as: UTF8.self) }
        guard let first, let number = Int(first.trimmingCharacters(in: "\n")), number >= 0 else { return nil }
        return SyscallNames.name(number)
    }

    func blockedSignals() -> UInt64? {
        guard let status = Self.read(directory + "status") else { return nil }
        return Self.hexField("SigBlk:", in: status)
    }

    /// Whether the thread blocks `signal`.
    func blocks(_ signal: Int32) -> Bool {
        guard let mask = blockedSignals(), signal > 0, signal <= 64 else { return false }
        return mask & (1 << UInt64(signal - 1)) != 0
    }

    /// The thread's name (`comm`).
    func name() -> String? {
        Self.read(directory + "comm").map { String(decoding: $0, as: UTF8.self).trimmingCharacters(in: "\n") }
    }

    /// The pid of a tracer (debugger, strace) attached to this process, 0 when none.
    static func tracerPID() -> Int {
        guard let status = read("/proc/self/status") else { return 0 }
        return field("TracerPid:", in: status).flatMap { Int($0) } ?? 0
    }

    static func hexField(_ name: String, in text: [UInt8]) -> UInt64? {
        field(name, in: text).flatMap { UInt64($0, radix: 16) }
    }

    /// The value after `name` on its line of a `/proc/*/status` file.
    private static func field(_ name: String, in text: [UInt8]) -> String? {
        guard let range = firstRange(of: Array(name.utf8), in: text) else { return nil }
        let value = text[range.upperBound...].drop { $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: " ") }
            .prefix { $0 != UInt8(ascii: "\n") }
        return String(decoding: value, as: UTF8.self)
    }

    private static func firstRange(of needle: [UInt8], in haystack: [UInt8]) -> Range<Int>? {
        guard needle.count <= haystack.count else { return nil }
        var index = 0
        while index + needle.count <= haystack.count {
            if haystack[index] == needle[0], Array(haystack[index..<index + needle.count]) == needle {
                return index..<index + needle.count
            }
            index += 1
        }
        return nil
    }

    /// Reads a small file in one go (proc files are generated per read).
    static func read(_ path: String) -> [UInt8]? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        var used = 0
        while used < buffer.count {
            let count = buffer.withUnsafeMutableBytes { bytes in
                Glibc.read(descriptor, bytes.baseAddress! + used, bytes.count - used)
            }
            if count < 0, errno == EINTR { continue }
            if count <= 0 { break }
            used += count
        }
        return used > 0 ? Array(buffer[0..<used]) : nil
    }
}

extension String {
    fileprivate func trimmingCharacters(in characters: String) -> String {
        var result = Substring(self)
        while let last = result.last, characters.contains(last) { result.removeLast() }
        while let first = result.first, characters.contains(first) { result.removeFirst() }
        return String(result)
    }
}

/// How long the calling thread has waited for a CPU while runnable: the second field of
/// `/proc/thread-self/schedstat`. A thread whose wakeup comes late because the machine is busy has
/// waited on a run queue; one whose process was stopped has not. Opened and read on the thread it
/// measures, and only there; a read is one `pread` and no allocation.
final class RunQueueClock: @unchecked Sendable {
    private var descriptor: Int32 = -1

    func open() {
        descriptor = Glibc.open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)
    }

    func close() {
        if descriptor >= 0 { _ = Glibc.close(descriptor) }
        descriptor = -1
    }

    /// Nanoseconds spent runnable but not running so far; `nil` when the kernel does not say.
    func waited() -> UInt64? { Self.runQueueWait(schedstat: descriptor) }

    /// The second field of an open `schedstat` file ("<on-cpu ns> <run-queue ns> <timeslices>"):
    /// nanoseconds runnable but not running. One `pread`, no allocation.
    static func runQueueWait(schedstat descriptor: Int32) -> UInt64? {
        guard descriptor >= 0 else { return nil }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 64) { buffer -> UInt64? in
            let count = pread(descriptor, buffer.baseAddress, buffer.count, 0)
            guard count > 0 else { return nil }
            var field = 0
            var value: UInt64 = 0
            for byte in buffer[0..<count] {
                if byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\n") {
                    if field == 1 { return value }
                    field += 1
                    value = 0
                } else if byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                    value = value &* 10 &+ UInt64(byte - UInt8(ascii: "0"))
                }
            }
            return field == 1 ? value : nil
        }
    }
}
#endif  // STALLMON_LINUX
