/// One loop thread of a process stallmond watches from outside, as the tick watcher's BPF program
/// last recorded it. Times are CLOCK_MONOTONIC nanoseconds.
package struct LoopTick: Sendable, Hashable {
    package var pid: Int32
    package var tid: Int32
    /// When the thread's latest wait returned (0: never yet).
    package var tickStart: UInt64
    /// When its latest wait began; the thread waits while this is at or after ``tickStart``.
    package var waitStart: UInt64
    /// The latest tick that ended at or past the threshold (0, 0: none).
    package var longTickStart: UInt64
    package var longTickEnd: UInt64
    /// The thread's CPU time when its current tick began, and the CPU time the latest long tick took.
    package var tickStartCPU: UInt64
    package var longTickCPU: UInt64
    /// The thread ended inside its latest long tick, which the exit ended.
    package var exited: Bool

    package init(
        pid: Int32, tid: Int32, tickStart: UInt64, waitStart: UInt64, longTickStart: UInt64, longTickEnd: UInt64,
        tickStartCPU: UInt64 = 0, longTickCPU: UInt64 = 0, exited: Bool = false
    ) {
        self.pid = pid
        self.tid = tid
        self.tickStart = tickStart
        self.waitStart = waitStart
        self.longTickStart = longTickStart
        self.longTickEnd = longTickEnd
        self.tickStartCPU = tickStartCPU
        self.longTickCPU = longTickCPU
        self.exited = exited
    }

    /// Whether the thread is inside a tick: out of its wait, and alive.
    package var isInTick: Bool { tickStart > waitStart && !exited }
}

/// Turns successive scans of the loops into stall events: `detected` once a tick has lasted the
/// threshold, `ended` once with the tick's whole duration, as the kernel timed it. A tick that
/// began and ended between two scans (a scan late by more than the threshold) is reported ended
/// only. Scans see the long ticks that ended since the previous one, whatever came after them:
/// the program keeps the latest, and two cannot end within one scan interval (an eighth of the
/// threshold) unless the scanner is that late.
package struct ExternalStallTracker: Sendable {
    package struct Event: Sendable, Hashable {
        package enum Kind: Sendable { case detected, ended }
        package var kind: Kind
        package var pid: Int32
        package var tid: Int32
        package var stallID: String
        /// When the tick began.
        package var start: UInt64
        /// How long the tick has lasted (`detected`) or lasted (`ended`).
        package var duration: UInt64
        /// `ended`: the CPU time the tick took; `detected`: the thread's CPU time when it began
        /// (what it has taken so far is the thread's CPU time now less this).
        package var cpu: UInt64
        /// `ended`: the thread's exit ended the tick (the service was killed or ended while it stalled).
        package var threadExited = false
    }

    private var open: [Int32: (start: UInt64, stallID: String)] = [:]
    /// The long tick last accounted for, per thread: its start.
    private var accounted: [Int32: UInt64] = [:]
    private let makeStallID: @Sendable () -> String

    package init(makeStallID: @escaping @Sendable () -> String = ExternalStallTracker.randomStallID) {
        self.makeStallID = makeStallID
    }

    /// The IDs of the stalls detected and not ended yet.
    package var openStallIDs: Set<String> { Set(open.values.map(\.stallID)) }

    /// The events of one scan of every loop thread, `ticks`, at `now`. Threads missing from
    /// `ticks` are forgotten, with any stall of theirs (a thread that ends inside a tick was not
    /// seen to end it).
    package mutating func update(_ ticks: some Collection<LoopTick>, now: UInt64, threshold: UInt64) -> [Event] {
        var events: [Event] = []
        for tick in ticks {
            if let ended = accountLongTick(tick) { events.append(ended) }
            if let stall = open[tick.tid], stall.start != tick.tickStart || !tick.isInTick {
                open[tick.tid] = nil  // ended below the threshold: only a reused TID can do that
            }
            if tick.isInTick, now >= tick.tickStart, now - tick.tickStart >= threshold, open[tick.tid] == nil,
                accounted[tick.tid] != tick.tickStart
            {
                let stallID = makeStallID()
                open[tick.tid] = (tick.tickStart, stallID)
                events.append(
                    Event(
                        kind: .detected, pid: tick.pid, tid: tick.tid, stallID: stallID, start: tick.tickStart,
                        duration: now - tick.tickStart, cpu: tick.tickStartCPU))
            }
        }
        // Every thread of `ticks` is in `accounted` now: more there means some are gone. A scan
        // allocates nothing more while the threads stay the same.
        if accounted.count > ticks.count {
            let seen = Set(ticks.map(\.tid))
            open = open.filter { seen.contains($0.key) }
            accounted = accounted.filter { seen.contains($0.key) }
        }
        return events
    }

    /// How many stalls are detected and not ended yet.
    package var openStallCount: Int { open.count }

    /// The `ended` event of a long tick not accounted for yet; the first sight of a thread only
    /// takes note of its latest long tick.
    private mutating func accountLongTick(_ tick: LoopTick) -> Event? {
        guard let previous = accounted[tick.tid] else {
            // A thread that ended inside a long tick is reported whenever it is first seen.
            accounted[tick.tid] = tick.exited ? 0 : tick.longTickStart
            return tick.exited ? accountLongTick(tick) : nil
        }
        guard tick.longTickStart != 0, tick.longTickStart != previous, tick.longTickEnd >= tick.longTickStart else {
            return nil
        }
        accounted[tick.tid] = tick.longTickStart
        let stallID: String
        if let stall = open[tick.tid], stall.start == tick.longTickStart {
            stallID = stall.stallID
            open[tick.tid] = nil
        } else {
            stallID = makeStallID()
        }
        return Event(
            kind: .ended, pid: tick.pid, tid: tick.tid, stallID: stallID, start: tick.longTickStart,
            duration: tick.longTickEnd - tick.longTickStart, cpu: tick.longTickCPU, threadExited: tick.exited)
    }

    /// 32 random hexadecimal digits, as a linked monitor's stall IDs.
    package static func randomStallID() -> String {
        var generator = SystemRandomNumberGenerator()
        return [generator.next() as UInt64, generator.next() as UInt64].map { value in
            let hex = String(value, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }.joined()
    }
}
