#if STALLMON_LINUX
/// Where the kernel had a thread waiting, as one sample saw it.
struct KernelWait: Hashable {
    var syscall: String?
    var waitChannel: String?
}

/// The kernel's view of a stalled thread over one stall, tallied so that the report names the state
/// and the wait seen most often. The view costs three /proc reads, more than the stack itself: it
/// is read with the first sample and then every 100 ms.
struct KernelViewTally {
    private var states: [Character: Int] = [:]
    private var waits: [KernelWait: Int] = [:]
    /// The latest view read, whatever it was counted for.
    private(set) var latest = KernelThreadView()
    private var viewedAt: UInt64 = 0

    /// Reads the thread's view when none was read in the last 100 ms, and counts it.
    /// - Returns: The view, when it was read.
    mutating func look(at inspector: ThreadInspector, now: UInt64) -> KernelThreadView? {
        guard viewedAt == 0 || now - viewedAt >= 100_000_000 else { return nil }
        let view = inspector.view()
        viewedAt = now
        latest = view
        states[view.state, default: 0] += 1
        waits[KernelWait(syscall: view.syscall, waitChannel: view.waitChannel), default: 0] += 1
        return view
    }

    /// Takes back a view counted for a sample that turned out not to count (the loop was idle).
    mutating func forget(_ view: KernelThreadView) {
        states[view.state, default: 1] -= 1
        waits[KernelWait(syscall: view.syscall, waitChannel: view.waitChannel), default: 1] -= 1
    }

    /// The state seen in most samples; ties go to the more telling one (R before D before S).
    var dominantState: Character { Self.dominantState(states) }

    /// The latest view, with the system call and wait channel seen in most samples (a thread that
    /// loops over short sleeps is "in poll" even if the last sample caught it between two).
    var dominantWait: KernelThreadView { Self.dominantWait(waits, fallback: latest) }

    static func dominantWait(_ waits: [KernelWait: Int], fallback: KernelThreadView) -> KernelThreadView {
        guard
            let wait = waits.filter({ $0.value > 0 }).max(by: { lhs, rhs in
                lhs.value != rhs.value ? lhs.value < rhs.value : (lhs.key.syscall == nil && rhs.key.syscall != nil)
            })?.key
        else { return fallback }
        var view = fallback
        view.syscall = wait.syscall
        view.waitChannel = wait.waitChannel
        return view
    }

    static func dominantState(_ states: [Character: Int]) -> Character {
        let preference: [Character] = ["R", "D", "S", "T", "t", "Z"]
        func rank(_ state: Character) -> Int { preference.firstIndex(of: state) ?? preference.count }
        return states.filter { $0.value > 0 }.max { lhs, rhs in
            lhs.value != rhs.value ? lhs.value < rhs.value : rank(lhs.key) > rank(rhs.key)
        }?.key ?? "?"
    }
}
#endif  // STALLMON_LINUX
