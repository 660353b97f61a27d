import CStallWatch
import Foundation
import Logging
import StallCollector
import StallJournal
import StallMonitor

/// The tick watcher's second thread (`stallmond-stacks`): it takes the stacks of each stall the
/// scan detected and writes the stall's entries, in the order the scan found them, so that the
/// scan itself never waits for a stack. A look at a thread on the CPU waits for a perf sample (up
/// to half the threshold, at most 100 ms); done by the scan, that wait would delay the detection of
/// every other loop's stall by as much.
///
/// A stall is looked at when it is detected (the detected entry's stack) and then every half
/// threshold while it lasts, at most ``maximumLooks`` times; its ended entry shows the heaviest
/// of those stacks and all of them in `STALL_STACKS`, as a linked monitor's does, so a stall that
/// moves on from where it was first seen says where its time went.
final class ExternalStallReporter: @unchecked Sendable {
    /// What one scan hands over: its events, each with the thread as the scan saw it (`detected`),
    /// the stalls still open after it, and the processes no longer watched.
    struct Batch {
        var events: [(event: ExternalStallTracker.Event, view: ExternalStall.ThreadView?)]
        var openStallIDs: Set<String>
        var unwatched: Set<Int32>
        /// Whether its detected stalls get a stack; not when the queue was full.
        var takesStacks = true
    }

    /// At most this many batches wait; past it, a detected stall is written at once without a
    /// stack (the reason says why), so that a flood of stalls cannot grow the queue without bound
    /// or put their entries minutes late.
    static let queueLimit = 64

    /// The tick watcher's program, for a look at one thread's entry; it lives as long as stallmond.
    private let handle: OpaquePointer
    private let threshold: Duration
    private let logger: Logger
    private let writer = JournalWriter()
    private let condition = NSCondition()
    /// At most this many looks at one stall.
    static let maximumLooks = 64

    /// Guarded by `condition`.
    private var queue: [Batch] = []
    /// Confined to the reporter's thread: the looks at each stall in progress, by stall ID, and
    /// when the next look is due (CLOCK_MONOTONIC).
    private var looks: [String: Looks] = [:]
    private var nextLook: UInt64?

    /// The looks at one stall: its detected event, the stacks seen (addresses, in the order first
    /// seen, with their counts), how many looks gave none, and whether it is still worth a look.
    private struct Looks {
        var event: ExternalStallTracker.Event
        var stacks: [(stack: [UInt], count: Int)] = []
        /// How each of `stacks` was taken, `kernel` or `perf`.
        var sources: [String] = []
        var taken = 0
        var unanswered = 0
        var lastReason = ""
        var over = false

        mutating func add(_ look: Look) {
            taken += 1
            guard !look.addresses.isEmpty else {
                unanswered += 1
                lastReason = look.reason
                return
            }
            if let index = stacks.firstIndex(where: { $0.stack == look.addresses }) {
                stacks[index].count += 1
            } else {
                stacks.append((look.addresses, 1))
                sources.append(look.source)
            }
        }
    }

    /// One look: the stack's addresses and how it was taken, or none and why.
    private struct Look {
        var addresses: [UInt] = []
        var source = ""
        var reason = ""
    }
    /// Confined to the reporter's thread: the threads of the stalls in progress as seen when each
    /// was detected, by stall ID; a symbolicator per watched process that stalled.
    private var views: [String: ExternalStall.ThreadView] = [:]
    private var symbolicators: [Int32: Symbolicator] = [:]

    init(handle: OpaquePointer, threshold: Duration, logger: Logger) {
        self.handle = handle
        self.threshold = threshold
        self.logger = logger
    }

    func start() {
        let thread = Thread { [self] in run() }
        thread.name = "stallmond-stacks"
        thread.start()
    }

    /// Queues a scan's batch; called by the scan thread. A batch over the limit keeps its events,
    /// less the stacks of its detected stalls.
    func submit(_ batch: Batch) {
        condition.lock()
        var batch = batch
        if queue.count >= Self.queueLimit {
            batch.takesStacks = false
            for index in batch.events.indices {
                batch.events[index].view?.noStackReason =
                    "stallmond was still taking the stacks of \(queue.count) earlier scans' stalls"
            }
        }
        queue.append(batch)
        condition.signal()
        condition.unlock()
    }

    private func run() -> Never {
        while true {
            condition.lock()
            while queue.isEmpty {
                guard let due = nextLook else {
                    condition.wait()
                    continue
                }
                let now = stallwatch_now_ns()
                guard due > now else { break }
                _ = condition.wait(until: Date(timeIntervalSinceNow: Double(due - now) / 1e9))
            }
            let batch = queue.isEmpty ? nil : queue.removeFirst()
            condition.unlock()
            if let batch { handle(batch) }
            lookAgainIfDue()
        }
    }

    /// Looks again at every stall in progress whose thread is still inside the tick that stalled.
    private func lookAgainIfDue() {
        guard let due = nextLook, stallwatch_now_ns() >= due else { return }
        for stallID in Array(looks.keys) where !looks[stallID]!.over {
            let event = looks[stallID]!.event
            let look = self.look(at: event)
            if look.addresses.isEmpty && look.reason == Self.endedReason {
                looks[stallID]!.over = true  // its ended entry is on its way
            } else {
                looks[stallID]!.add(look)
                if looks[stallID]!.taken >= Self.maximumLooks { looks[stallID]!.over = true }
            }
        }
        scheduleLook()
    }

    private func scheduleLook() {
        nextLook = looks.values.contains { !$0.over } ? stallwatch_now_ns() + UInt64(threshold.nanoseconds / 2) : nil
    }

    private func handle(_ batch: Batch) {
        for (event, seen) in batch.events {
            let view: ExternalStall.ThreadView
            switch event.kind {
            case .detected:
                var detected = seen ?? ExternalStall.ThreadView(pid: event.pid, tid: event.tid)
                var first = Looks(event: event)
                if batch.takesStacks {
                    first.add(look(at: event))
                    looks[event.stallID] = first
                } else {
                    first.lastReason = detected.noStackReason
                }
                describe(first, in: &detected)
                view = detected
                views[event.stallID] = view
            case .ended:
                var ended =
                    views.removeValue(forKey: event.stallID) ?? ExternalStall.ThreadView(pid: event.pid, tid: event.tid)
                if let all = looks.removeValue(forKey: event.stallID) { describe(all, in: &ended) }
                view = ended
            }
            write(ExternalStall(event: event, view: view, threshold: threshold))
        }
        if views.count > batch.openStallIDs.count {
            views = views.filter { batch.openStallIDs.contains($0.key) }
            looks = looks.filter { batch.openStallIDs.contains($0.key) }
        }
        for pid in batch.unwatched {
            symbolicators[pid] = nil
            stallwatch_forget_process(pid)
        }
        if nextLook == nil { scheduleLook() }
    }

    /// Puts what the looks saw in `view`: the heaviest stack (by fingerprint, as a linked
    /// monitor's reporter ranks its samples) and every stack with its count.
    private func describe(_ looks: Looks, in view: inout ExternalStall.ThreadView) {
        view.samples = looks.taken
        view.unansweredSamples = looks.unanswered
        guard !looks.stacks.isEmpty else {
            view.stack = []
            if !looks.lastReason.isEmpty { view.noStackReason = looks.lastReason }
            return
        }
        let symbolicator = symbolicator(for: looks.event.pid)
        let (frames, samples, index) = SampledStack.heaviest(looks.stacks, symbolicator: symbolicator)
        view.stack = frames
        view.stackSamples = samples
        view.stackSource = index.map { looks.sources[$0] } ?? ""
        view.sampledStacks = SampledStack.symbolicate(looks.stacks, symbolicator: symbolicator)
    }

    private func write(_ stall: ExternalStall) {
        do {
            try writer.send(stall.fields)
        } catch {
            logger.warning("cannot write an external stall report: \(error)")
        }
    }

    /// Whether the stall's thread is still inside the tick that stalled: its entry in the
    /// program's map still has that tick's start, and no wait or exit since. A stack taken while
    /// this holds, before and after, is the stall's; one taken after the tick ended would show the
    /// loop's next wait or its next tick's work, under this stall's name.
    private func isStillStalled(_ event: ExternalStallTracker.Event) -> Bool {
        var tick = stallwatch_tick()
        guard stallwatch_tick_of(handle, UInt32(bitPattern: event.tid), &tick) == 0 else { return false }
        return tick.tick_start_ns == event.start && tick.wait_start_ns < tick.tick_start_ns && tick.exit_ns == 0
    }

    static let endedReason = "the stall ended before stallmond took its stack"

    /// One look at a stalled thread's stack: blocked in a system call, unwound in place
    /// (CStallWatch's `stallwatch_unwind_blocked*`, `kernel`); running, from a perf event on it
    /// (`stallwatch_sample_running`, `perf`), waiting at most half the threshold (at most 100 ms)
    /// for the thread to run a millisecond: on a crowded machine a running thread waits for a CPU
    /// too. No stack, and why, when neither gives one, or when the stall ended before or while its
    /// stack was taken.
    private func look(at event: ExternalStallTracker.Event) -> Look {
        let (pid, tid) = (event.pid, event.tid)
        guard isStillStalled(event) else { return Look(reason: Self.endedReason) }
        var addresses = [UInt64](repeating: 0, count: 128)
        guard let before = ProcessDirectory.threadSyscallView(pid: pid, tid: tid) else {
            let timeout = Int32(min(threshold / 2, .milliseconds(100)).milliseconds)
            let count = Int(stallwatch_sample_running(pid, tid, max(timeout, 1), &addresses, Int32(addresses.count)))
            guard count > 0 else {
                return Look(reason: "on the CPU, and no sample came from a perf event on the thread")
            }
            guard isStillStalled(event) else { return Look(reason: Self.endedReason) }
            return Look(addresses: addresses.prefix(count).map { UInt($0) }, source: "perf")
        }
        // Every register where the kernel gives them (its registers at the call, which the syscall
        // file's sp and pc must match): the walk then goes on through frame-pointer frames.
        var registers = stallwatch_user_registers()
        let count =
            if stallwatch_blocked_registers(handle, UInt32(bitPattern: tid), &registers) == 0,
                registers.pc == before.programCounter, registers.dwarf.7 == before.stackPointer
            {
                Int(stallwatch_unwind_blocked_registers(pid, tid, &registers, &addresses, Int32(addresses.count)))
            } else {
                Int(
                    stallwatch_unwind_blocked(
                        pid, tid, before.stackPointer, before.programCounter, &addresses, Int32(addresses.count)))
            }
        guard count > 0 else { return Look(reason: "the blocked thread's stack could not be read") }
        guard ProcessDirectory.threadSyscallView(pid: pid, tid: tid) == before, isStillStalled(event) else {
            return Look(reason: "the thread left its system call while its stack was read")
        }
        return Look(addresses: addresses.prefix(count).map { UInt($0) }, source: "kernel")
    }

    private func symbolicator(for pid: Int32) -> Symbolicator {
        let symbolicator = symbolicators[pid] ?? Symbolicator(pid: pid)
        symbolicators[pid] = symbolicator
        return symbolicator
    }
}
