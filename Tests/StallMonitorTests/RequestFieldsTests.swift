import Foundation
import StallCollector
import StallJournal
import Testing

/// The request a stall served (`STALL_REQUEST_*`, `STALL_TRACE_ID`, `STALL_SPAN_ID`): written and
/// read back through the one schema, held to its bounds, and never taken on trust.
struct RequestFieldsTests {
    static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let spanID = "00f067aa0ba902b7"

    /// An ended stall of `identifier` serving `request`, as the monitor writes it.
    static func record(
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

    static func dictionary(_ record: StallRecord) -> [String: String] {
        var fields: [String: String] = [:]
        for field in record.fields { fields[field.name] = field.value }
        return fields
    }

    static let users = StallRecord.Request(
        operation: "GET /users/:id", method: "GET", route: "/users/:id", path: "/users/42", traceID: traceID,
        spanID: spanID)

    @Test func requestFieldsRoundTripThroughTheSchema() throws {
        let fields = Self.dictionary(Self.record(Self.users))
        #expect(fields["STALL_REQUEST_OPERATION"] == "GET /users/:id")
        #expect(fields["STALL_REQUEST_METHOD"] == "GET")
        #expect(fields["STALL_REQUEST_ROUTE"] == "/users/:id")
        #expect(fields["STALL_REQUEST_PATH"] == nil, "the path is written only when the route is unknown")
        #expect(fields["STALL_TRACE_ID"] == Self.traceID)
        #expect(fields["STALL_SPAN_ID"] == Self.spanID)
        let read = try StallRecord(journalFields: fields)
        var expected = Self.users
        expected.path = ""
        #expect(read.request == expected)
        #expect(read.request?.endpoint == "GET /users/:id")

        let grpc = StallRecord.Request(operation: "Greeter/SayHello", rpcMethod: "helloworld.Greeter/SayHello")
        #expect(try StallRecord(journalFields: Self.dictionary(Self.record(grpc))).request == grpc)
        let unrouted = StallRecord.Request(operation: "HTTP GET route not found", method: "GET", path: "/users/42")
        #expect(try StallRecord(journalFields: Self.dictionary(Self.record(unrouted))).request == unrouted)
        #expect(unrouted.endpoint == "GET /users/42")

        // Outside any request: no field, and no request read back.
        let plain = Self.dictionary(Self.record(nil))
        #expect(!plain.keys.contains { $0.hasPrefix("STALL_REQUEST_") || $0 == "STALL_TRACE_ID" })
        #expect(try StallRecord(journalFields: plain).request == nil)
    }

    /// Why `fields` with `field` set to `value` is not a stall record; `nil` when it is one.
    static func decodingError(_ fields: [String: String], _ field: String, _ value: String) -> JournalDecodingError? {
        var fields = fields
        fields[field] = value
        do {
            _ = try StallRecord(journalFields: fields)
            return nil
        } catch {
            return error
        }
    }

    @Test func badRequestValuesNameTheirField() {
        let fields = Self.dictionary(Self.record(Self.users))
        let cases: [(String, String)] = [
            ("STALL_TRACE_ID", Self.traceID.uppercased()),
            ("STALL_TRACE_ID", String(Self.traceID.dropLast())),
            ("STALL_TRACE_ID", "not-a-trace-id-but-32-characters"),
            ("STALL_SPAN_ID", Self.spanID + "0"),
            ("STALL_SPAN_ID", "00f067aa0ba902bZ"),
            ("STALL_REQUEST_ROUTE", "/" + String(repeating: "r", count: 256)),
            ("STALL_REQUEST_PATH", "/" + String(repeating: "p", count: 256)),
            ("STALL_REQUEST_OPERATION", String(repeating: "o", count: 257)),
            ("STALL_REQUEST_RPC_METHOD", String(repeating: "m", count: 257)),
            ("STALL_REQUEST_METHOD", String(repeating: "M", count: 65)),
        ]
        for (field, value) in cases {
            let error = Self.decodingError(fields, field, value)
            #expect(error?.field == field, "\(field)=\(value.prefix(40)): \(String(describing: error))")
            #expect(error?.value == value)
        }
        // At their bounds they are accepted.
        for (field, value) in [
            ("STALL_REQUEST_ROUTE", "/" + String(repeating: "r", count: 255)),
            ("STALL_REQUEST_METHOD", String(repeating: "M", count: 64)),
        ] {
            #expect(
                Self.decodingError(fields, field, value) == nil)
        }
    }

    @Test func theWriterHoldsRequestValuesToTheirBounds() throws {
        let long = StallRecord.Request(
            operation: String(repeating: "o", count: 1000), method: String(repeating: "M", count: 100),
            route: "/" + String(repeating: "r", count: 1000), traceID: "XYZ", spanID: Self.spanID.uppercased())
        let fields = Self.dictionary(Self.record(long))
        #expect(fields["STALL_REQUEST_ROUTE"]?.utf8.count == FieldLimits.nameBytes)
        #expect(fields["STALL_REQUEST_METHOD"]?.utf8.count == FieldLimits.keywordBytes)
        #expect(fields["STALL_TRACE_ID"] == nil && fields["STALL_SPAN_ID"] == nil, "left out, not cut")
        #expect(try StallRecord(journalFields: fields).request?.route.hasSuffix(FieldLimits.truncationMarker) == true)
    }

    @Test func requestsGroupByEndpointAndNameTheLongestStallsTrace() throws {
        func observation(_ request: StallRecord.Request?, milliseconds: UInt64) -> StallObservation {
            StallObservation(
                record: Self.record(request, milliseconds: milliseconds), unit: "api.service",
                realtimeMicroseconds: 1)
        }
        var other = Self.users
        other.traceID = String(repeating: "a", count: 32)
        let stalls = [
            observation(Self.users, milliseconds: 300), observation(other, milliseconds: 900),
            observation(nil, milliseconds: 500),
        ]
        let byFingerprint = StallGroup.group(stalls)
        #expect(byFingerprint.count == 1)
        #expect(byFingerprint.first?.endpoint == "GET /users/:id")
        #expect(byFingerprint.first?.traceID == other.traceID, "the trace of the longest stall")
        let byRoute = StallGroup.group(stalls, by: .route)
        #expect(byRoute.map(\.endpoint) == ["GET /users/:id", nil])
        #expect(byRoute.map(\.count) == [2, 1])
    }
}

extension Serial {
    /// The request fields through a real journald, and what `stallmon report` and `follow` make of
    /// them: with and without a request, grouped by route, escaped, and malformed ones named.
    @Suite
    struct RequestJournalTests {
        static func send(_ record: StallRecord, to journal: JournalNamespace, overrides: [String: String] = [:]) throws
        {
            var fields = record.fields.map { ($0.name, $0.value) }
            for (name, value) in overrides {
                if let index = fields.firstIndex(where: { $0.0 == name }) {
                    fields[index].1 = value
                } else {
                    fields.append((name, value))
                }
            }
            try journal.send(fields)
        }

        @Test func requestFieldsRoundTripThroughJournald() throws {
            let journal = JournalNamespace()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let records = [
                RequestFieldsTests.record(RequestFieldsTests.users),
                RequestFieldsTests.record(
                    StallRecord.Request(
                        operation: "HTTP GET route not found", method: "GET", path: "/users/ü\u{1b}[2J",
                        traceID: RequestFieldsTests.traceID)),
                RequestFieldsTests.record(nil),
            ]
            for record in records { try Self.send(record, to: journal) }
            try #require(journal.waitForEntries(records.count, messageIDs: [MessageID.stallEnded]))
            let reader = try JournalReader(namespace: journal.name)
            try reader.addMatch("MESSAGE_ID", MessageID.stallEnded)
            try reader.seekHead()
            var read: [StallRecord] = []
            while let entry = try reader.next() { read.append(try StallRecord(journalFields: entry.fields)) }
            #expect(
                read.map(\.request)
                    == (try records.map { try StallRecord(journalFields: RequestFieldsTests.dictionary($0)).request }))
            #expect(read.map(\.fields) == records.map(\.fields))
        }

        @Test func reportAndFollowShowTheRequestEscapedAndGroupByRoute() throws {
            let journal = JournalNamespace()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let evil = StallRecord.Request(
                operation: "evil", method: "GET",
                route: "/evil\u{1b}]0;owned\u{07}/" + String(repeating: "x", count: 200),
                traceID: String(repeating: "b", count: 32))
            try Self.send(RequestFieldsTests.record(RequestFieldsTests.users, milliseconds: 300), to: journal)
            try Self.send(RequestFieldsTests.record(RequestFieldsTests.users, milliseconds: 900), to: journal)
            try Self.send(
                RequestFieldsTests.record(evil, fingerprint: "00000000cafebabe", frame: "Evil.run() (Evil.swift:1)"),
                to: journal)
            try Self.send(
                RequestFieldsTests.record(
                    nil, fingerprint: "0000000000c0ffee", frame: "Cache.refresh() (Cache.swift:12)"),
                to: journal)
            try #require(journal.waitForEntries(4, messageIDs: [MessageID.stallEnded]))

            let table = try Executable.stallmon.run(["report", "--namespace", journal.name])
            #expect(table.status == 0, "\(table.errors)")
            let lines = table.output.split(separator: "\n").map(String.init)
            #expect(lines.count == 4)
            #expect(lines.first?.contains("REQUEST") == true && lines.first?.contains("TRACE") == true)
            let users = try #require(lines.first { $0.contains("00000000deadbeef") })
            #expect(users.contains("GET /users/:id"))
            #expect(users.contains(RequestFieldsTests.traceID))
            let cache = try #require(lines.first { $0.contains("0000000000c0ffee") })
            #expect(cache.contains(" -  "), "no request: \(cache)")
            #expect(!table.output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 })
            #expect(table.output.contains("GET /evil\\x1b]0;owned\\x07/xxx"))
            #expect(lines.allSatisfy { $0.unicodeScalars.count <= 420 }, "cells are cut")

            let byRoute = try Executable.stallmon.run(["report", "--namespace", journal.name, "--by", "route"])
            #expect(byRoute.status == 0, "\(byRoute.errors)")
            let routeLines = byRoute.output.split(separator: "\n").map(String.init)
            #expect(routeLines.first?.hasPrefix("UNIT") == true && routeLines.first?.contains("ENDPOINT") == true)
            #expect(routeLines.count == 4)
            let route = try #require(routeLines.first { $0.contains("GET /users/:id") })
            #expect(route.contains("   2 ") && route.contains("900 ms"), "\(route)")
            #expect(routeLines.contains { $0.contains("(no request)") && $0.contains("Cache.refresh()") })

            let json = try Executable.stallmon.run(["report", "--namespace", journal.name, "--by", "route", "--json"])
            #expect(json.status == 0, "\(json.errors)")
            let groups = try JSONDecoder().decode([StallGroup].self, from: Data(json.output.utf8))
            #expect(groups.first { $0.endpoint == "GET /users/:id" }?.traceID == RequestFieldsTests.traceID)
            #expect(groups.contains { $0.endpoint == nil && $0.traceID == nil })
            #expect(!json.output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 })

            let refused = try Executable.stallmon.run(
                ["report", "--namespace", journal.name, "--by", "route", "--folded"])
            #expect(refused.status == 64)

            // follow: the request after the fingerprint; none where the stall served none.
            let follow = try Executable.stallmon.start(["follow", "--namespace", journal.name, "--lines", "4"])
            defer { if follow.process.isRunning { _ = follow.terminate() } }
            #expect(follow.waitForOutput { output, _ in output.split(separator: "\n").count >= 4 })
            let result = follow.terminate()
            #expect(result.status == 0, "\(result.errors)")
            let followed = result.output.split(separator: "\n").map(String.init)
            #expect(
                followed.contains {
                    $0.hasSuffix("[00000000deadbeef] (GET /users/:id, trace \(RequestFieldsTests.traceID))")
                }, "\(followed)")
            #expect(followed.contains { $0.hasSuffix("[0000000000c0ffee]") })
            #expect(followed.contains { $0.contains("(GET /evil\\x1b]0;owned\\x07/") && $0.contains("…, trace bbbb") })

            let lines2 = try Executable.stallmon.start([
                "follow", "--namespace", journal.name, "--lines", "1", "--json",
            ])
            defer { if lines2.process.isRunning { _ = lines2.terminate() } }
            #expect(lines2.waitForOutput { output, _ in output.contains("\n") })
            let object =
                try JSONSerialization.jsonObject(
                    with: Data((lines2.terminate().output.split(separator: "\n").first ?? "").utf8))
                as? [String: String]
            #expect(object?["MESSAGE"]?.contains("Cache.refresh()") == true)
            #expect(object?["STALL_TRACE_ID"] == nil)
        }

        @Test func aMalformedRequestIsNamedAndTheEntrySkipped() throws {
            let journal = JournalNamespace()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            try Self.send(RequestFieldsTests.record(RequestFieldsTests.users), to: journal)
            try Self.send(
                RequestFieldsTests.record(RequestFieldsTests.users), to: journal,
                overrides: ["STALL_TRACE_ID": "NOT-HEX"])
            try Self.send(
                RequestFieldsTests.record(RequestFieldsTests.users), to: journal,
                overrides: ["STALL_REQUEST_ROUTE": "/" + String(repeating: "r", count: 5000)])
            try #require(journal.waitForEntries(3, messageIDs: [MessageID.stallEnded]))
            let report = try Executable.stallmon.run(["report", "--namespace", journal.name, "--by", "route"])
            #expect(report.status == 65)
            #expect(report.errors.contains(#"field STALL_TRACE_ID="NOT-HEX": not 32 lowercase hex digits"#))
            #expect(report.errors.contains("field STALL_REQUEST_ROUTE=\"/rrr"))
            #expect(report.errors.contains("5001 bytes long, longer than the 256 allowed"))
            #expect(report.output.contains("GET /users/:id"), "the well-formed stall still counts")
        }
    }
}
