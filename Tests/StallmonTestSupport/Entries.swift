import Foundation
import StallJournal

/// Journal entries as the monitor writes them, for the collector's and the CLI's tests.
package enum Entries {
    /// A stall of `unit` (or of user `uid`, outside any unit) as the collector reads it.
    package static func entry(
        _ event: StallRecord.Event = .ended, unit: String? = "foo.service", uid: String? = nil,
        fingerprint: String = "aaaaaaaaaaaaaaaa",
        milliseconds: UInt64 = 300,
        stallID: String = UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased(),
        time: UInt64 = 1_000_000_000,
        cursor: String = "c"
    ) -> JournalEntry {
        let record = StallRecord(
            event: event, message: "main run loop stalled", stallID: stallID, durationMicroseconds: milliseconds * 1000,
            thresholdMicroseconds: 250_000, activity: "after-waiting", runLoopMode: "kCFRunLoopDefaultMode",
            callout: "timer",
            loop: "main", threadID: 7, threadState: "R", threadSyscall: "", threadWaitChannel: "", cpuMicroseconds: 1,
            samples: 3, samplesUnanswered: 0, stackSamples: 3, fingerprint: fingerprint,
            frame: "Foo.bar() (Foo.swift:\(fingerprint.count))",
            backtrace: "#0 Foo.bar()", priority: 4, syslogIdentifier: "foo")
        var fields: [String: String] = [:]
        fields["_SYSTEMD_UNIT"] = unit
        fields["_UID"] = uid
        for field in record.fields { fields[field.name] = field.value }
        return JournalEntry(fields: fields, cursor: cursor, realtimeMicroseconds: time)
    }

    /// A well-formed ended-stall entry, then `overrides` (any value, any length).
    package static func stallFields(
        identifier: String, fingerprint: String, frame: String = "Service.refresh() (Service.swift:42)",
        overrides: [String: String] = [:]
    ) -> [(String, String)] {
        let record = StallRecord(
            event: .ended, message: "main run loop stalled 400 ms in timer callout at \(frame)",
            stallID: (0..<4).map { _ in String(format: "%08x", UInt32.random(in: 0...UInt32.max)) }.joined(),
            durationMicroseconds: 400_000, thresholdMicroseconds: 250_000, activity: "after-waiting",
            runLoopMode: "kCFRunLoopDefaultMode", callout: "timer", loop: "main", threadID: 4242, threadState: "R",
            threadSyscall: "", threadWaitChannel: "", cpuMicroseconds: 390_000, samples: 20, samplesUnanswered: 0,
            stackSamples: 19, fingerprint: fingerprint, frame: frame, backtrace: "#0 \(frame)", priority: 4,
            syslogIdentifier: identifier)
        return fields(of: record, overriding: overrides)
    }

    /// `record`'s journal fields in order, each of `overrides` replacing the field of its name or
    /// added after them.
    package static func fields(of record: StallRecord, overriding overrides: [String: String]) -> [(String, String)] {
        var fields = record.fields.map { ($0.name, $0.value) }
        for (name, value) in overrides {
            if let index = fields.firstIndex(where: { $0.0 == name }) {
                fields[index].1 = value
            } else {
                fields.append((name, value))
            }
        }
        return fields
    }

    /// A distinct fingerprint for each `index`.
    package static func fingerprint(_ index: Int) -> String { String(format: "%016llx", UInt64(index) &* 0x9e37_79b9) }

    /// An ended stall of `unit` (or of `identifier`, written by `uid` outside any unit) serving `request`.
    package static func requestEntry(
        _ request: StallRecord.Request?, unit: String? = "api.service", identifier: String = "api",
        uid: String? = nil, milliseconds: UInt64 = 300, time: UInt64, cursor: String
    ) -> JournalEntry {
        var entry = Entries.entry(unit: unit, uid: uid, milliseconds: milliseconds, time: time, cursor: cursor)
        entry.fields["SYSLOG_IDENTIFIER"] = identifier
        var record = try! StallRecord(journalFields: entry.fields)
        record.request = request
        for field in record.fields { entry.fields[field.name] = field.value }
        return entry
    }

    /// A request with `route`, as a framework's TracingMiddleware names it once the handler returned.
    package static func route(_ route: String, method: String = "GET") -> StallRecord.Request {
        StallRecord.Request(operation: "\(method) \(route)", method: method, route: route)
    }

    /// An ended stall of `identifier` serving `request`, as the monitor writes it.
    package static func requestRecord(
        _ request: StallRecord.Request?, identifier: String = "api", fingerprint: String = "00000000deadbeef",
        milliseconds: UInt64 = 400, frame: String = "UserStore.load(id:) (UserStore.swift:57)"
    ) -> StallRecord {
        var record = StallRecord(
            event: .ended, message: "cooperative pool stalled \(milliseconds) ms at \(frame)",
            stallID: (0..<4).map { _ in String(format: "%08x", UInt32.random(in: 0...UInt32.max)) }.joined(),
            durationMicroseconds: milliseconds * 1000, thresholdMicroseconds: 100_000, activity: "pool-job",
            runLoopMode: "none", callout: "unknown", loop: "cooperative-pool", threadID: 4242, threadState: "R",
            threadSyscall: "", threadWaitChannel: "", cpuMicroseconds: 390_000, samples: 20, samplesUnanswered: 0,
            stackSamples: 19, fingerprint: fingerprint, frame: frame, backtrace: "#0 \(frame)", priority: 4,
            syslogIdentifier: identifier)
        record.request = request
        return record
    }

    /// A W3C trace and span ID, as a `traceparent` header carries them.
    package static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
    package static let spanID = "00f067aa0ba902b7"

    /// A request on a route, with its path, trace and span.
    package static let users = StallRecord.Request(
        operation: "GET /users/:id", method: "GET", route: "/users/:id", path: "/users/42", traceID: traceID,
        spanID: spanID)

    /// A record's fields as the journal gives them back.
    package static func dictionary(_ record: StallRecord) -> [String: String] {
        var fields: [String: String] = [:]
        for field in record.fields { fields[field.name] = field.value }
        return fields
    }
}
