import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A thread of another process, found by its kernel name, whose wakeups a test counts: a thread
/// cannot wake without a context switch.
package struct NamedThread {
    package let pid: pid_t
    package let tid: Int

    /// The thread of `pid` whose kernel name is `name`, or `nil`.
    package init?(named name: String, in pid: pid_t) {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        guard
            let tid = tasks.compactMap(Int.init).first(where: { tid in
                let comm = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8)
                return comm?.trimmingCharacters(in: .newlines) == name
            })
        else { return nil }
        self.pid = pid
        self.tid = tid
    }

    /// Voluntary plus involuntary context switches so far; `nil` when the status cannot be read.
    package var contextSwitches: Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/status", encoding: .utf8) else {
            return nil
        }
        let counts = status.split(separator: "\n").filter { $0.contains("ctxt_switches") }.compactMap {
            $0.split(separator: "\t").last.flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        }
        return counts.count == 2 ? counts.reduce(0, +) : nil
    }

    /// The context switches the thread makes over the next `microseconds`.
    package func wakeups(over microseconds: UInt32) -> Int? {
        guard let before = contextSwitches else { return nil }
        usleep(microseconds)
        return contextSwitches.map { $0 - before }
    }
}
