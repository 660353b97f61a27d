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

/// Reads `/proc/self/task/<tid>/…` through CStallCapture's thread view (`stallcapture_threadview.h`),
/// which reads and parses the files the C sampler reads too; only what C does not parse (`stat`'s
/// state, `wchan`, `comm`) is parsed here. It runs on the watchdog thread for every sample, so it
/// avoids Foundation and keeps allocations to the strings it returns.
struct ThreadInspector: Sendable {
    let threadID: pid_t

    init(threadID: pid_t) {
        self.threadID = threadID
    }

    func view() -> KernelThreadView {
        var view = KernelThreadView()
        if let stat = read("stat"), let close = stat.lastIndex(of: UInt8(ascii: ")")) {
            // "tid (comm) S ...": comm may hold spaces and parentheses, so parse after the last ')'.
            let stateIndex = stat.index(close, offsetBy: 2)
            if stateIndex < stat.endIndex {
                view.state = Character(Unicode.Scalar(stat[stateIndex]))
            }
        }
        view.syscall = syscall()
        if let wchan = read("wchan") {
            let text = String(decoding: wchan, as: UTF8.self).trimmingCharacters(in: "\n")
            if !text.isEmpty, text != "0" { view.waitChannel = text }
        }
        return view
    }

    /// The system call the thread is blocked in, `nil` when it runs or waits outside one.
    func syscall() -> String? {
        var view = stallmon_syscall_view()
        stallmon_read_syscall(threadID, &view)
        guard view.state == 0 else { return nil }
        return SyscallNames.name(view.number)
    }

    /// The signal mask of the thread (`SigBlk`), or `nil` when it cannot be read.
    func blockedSignals() -> UInt64? {
        Self.statusField("SigBlk", base: 16, of: threadID)
    }

    /// Whether the thread blocks `signal`.
    func blocks(_ signal: Int32) -> Bool {
        guard let mask = blockedSignals(), signal > 0, signal <= 64 else { return false }
        return mask & (1 << UInt64(signal - 1)) != 0
    }

    /// The thread's name (`comm`).
    func name() -> String? {
        read("comm").map { String(decoding: $0, as: UTF8.self).trimmingCharacters(in: "\n") }
    }

    /// The pid of a tracer (debugger, strace) attached to this process, 0 when none.
    static func tracerPID() -> Int {
        statusField("TracerPid", base: 10, of: pid_t(STALLMON_WHOLE_PROCESS)).map { Int($0) } ?? 0
    }

    /// Field `name` of the `status` file of `thread` (a thread ID, or `STALLMON_WHOLE_PROCESS`).
    private static func statusField(_ name: String, base: Int32, of thread: pid_t) -> UInt64? {
        var value: UInt64 = 0
        return stallmon_read_status_field(thread, name, base, &value) == 1 ? value : nil
    }

    /// Reads one of the thread's small files in one go (proc files are generated per read).
    private func read(_ name: String) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { characters in
                stallmon_thread_file_read(threadID, name, characters.baseAddress!, characters.count)
            }
        }
        return count > 0 ? Array(buffer[0..<count]) : nil
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
        descriptor = stallmon_thread_file_open(pid_t(STALLMON_THREAD_SELF), "schedstat")
    }

    func close() {
        if descriptor >= 0 { _ = Glibc.close(descriptor) }
        descriptor = -1
    }

    /// Nanoseconds spent runnable but not running so far; `nil` when the kernel does not say.
    func waited() -> UInt64? { Self.runQueueWait(schedstat: descriptor) }

    /// The run-queue field of an open `schedstat` file: nanoseconds runnable but not running. One
    /// `pread`, no allocation.
    static func runQueueWait(schedstat descriptor: Int32) -> UInt64? {
        var schedstat = stallmon_schedstat()
        return stallmon_pread_schedstat(descriptor, &schedstat) == 0 ? schedstat.wait_ns : nil
    }
}
#endif  // STALLMON_LINUX
