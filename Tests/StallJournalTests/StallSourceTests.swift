import StallJournal
import Testing

/// `STALL_SOURCE`: who saw a stall, written and read back through the schema.
struct StallSourceTests {
    static func record(source: StallRecord.Source) -> StallRecord {
        var record = StallRecord(
            event: .ended,
            message: "event loop epoll-loop of legacy-server (PID 4211) stalled 250 ms, seen from outside",
            stallID: String(repeating: "ab", count: 16), durationMicroseconds: 250_142, thresholdMicroseconds: 100_000,
            activity: "event-loop-cycle", runLoopMode: "", callout: "unknown", loop: "epoll-loop", threadID: 4213,
            threadState: "S", threadSyscall: "clock_nanosleep", threadWaitChannel: "hrtimer_nanosleep",
            cpuMicroseconds: 72, samples: 1, samplesUnanswered: 0, stackSamples: 1, fingerprint: "0123456789abcdef",
            frame: "run (main.c:59)", backtrace: "#0 run (main.c:59)", priority: 4, syslogIdentifier: "legacy-server")
        record.stackSource = "kernel"
        record.source = source
        return record
    }

    static func dictionary(_ record: StallRecord) -> [String: String] {
        Dictionary(record.fields.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
    }

    @Test func anExternalStallRoundTripsWithItsSource() throws {
        let record = Self.record(source: .external)
        #expect(record.fields.filter { $0.name == "STALL_SOURCE" }.map(\.value) == ["external"])
        let read = try StallRecord(journalFields: Self.dictionary(record))
        #expect(read.source == .external)
        #expect(read == record)
        #expect(read.fields == record.fields)
    }

    @Test func aLinkedMonitorsStallHasNoSourceFieldAndReadsAsTheMonitors() throws {
        let record = Self.record(source: .monitor)
        #expect(record.source == .monitor)
        #expect(!record.fields.contains { $0.name == StallRecord.Field.source })
        let read = try StallRecord(journalFields: Self.dictionary(record))
        #expect(read.source == .monitor)
        #expect(read.fields == record.fields)
        // `monitor` is never written, but means what no field means.
        var explicit = Self.dictionary(record)
        explicit["STALL_SOURCE"] = "monitor"
        #expect(try StallRecord(journalFields: explicit) == record)
    }

    @Test func anUnknownOrOverlongSourceIsRefusedNamingTheField() {
        var fields = Self.dictionary(Self.record(source: .external))
        for value in ["inside", "External", "", "external\u{1b}[2J"] {
            fields["STALL_SOURCE"] = value
            #expect(
                throws: JournalDecodingError(
                    field: "STALL_SOURCE", value: value,
                    reason: "not a known source (external; absent for the monitor in the process)")
            ) {
                try StallRecord(journalFields: fields)
            }
        }
        fields["STALL_SOURCE"] = String(repeating: "x", count: 100)
        #expect {
            try StallRecord(journalFields: fields)
        } throws: { error in
            let error = error as? JournalDecodingError
            return error?.field == "STALL_SOURCE" && error?.reason.contains("longer than") == true
        }
    }
}
