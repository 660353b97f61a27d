import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

extension Serial {
    /// The request fields through a real journald, and what `stallmon report` and `follow` make of
    /// them: with and without a request, grouped by route, escaped, and malformed ones named.
    @Suite
    struct RequestJournalTests {
        static func send(_ record: StallRecord, to journal: Journald, overrides: [String: String] = [:]) throws {
            try journal.send(Entries.fields(of: record, overriding: overrides))
        }

        @Test func requestFieldsRoundTripThroughJournald() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let records = [
                Entries.requestRecord(Entries.users),
                Entries.requestRecord(
                    StallRecord.Request(
                        operation: "HTTP GET route not found", method: "GET", path: "/users/ü\u{1b}[2J",
                        traceID: Entries.traceID)),
                Entries.requestRecord(nil),
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
                    == (try records.map { try StallRecord(journalFields: Entries.dictionary($0)).request }))
            #expect(read.map(\.fields) == records.map(\.fields))
        }

        @Test func reportAndFollowShowTheRequestEscapedAndGroupByRoute() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let evil = StallRecord.Request(
                operation: "evil", method: "GET",
                route: "/evil\u{1b}]0;owned\u{07}/" + String(repeating: "x", count: 200),
                traceID: String(repeating: "b", count: 32))
            try Self.send(Entries.requestRecord(Entries.users, milliseconds: 300), to: journal)
            try Self.send(Entries.requestRecord(Entries.users, milliseconds: 900), to: journal)
            try Self.send(
                Entries.requestRecord(evil, fingerprint: "00000000cafebabe", frame: "Evil.run() (Evil.swift:1)"),
                to: journal)
            try Self.send(
                Entries.requestRecord(
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
            #expect(users.contains(Entries.traceID))
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
            #expect(groups.first { $0.endpoint == "GET /users/:id" }?.traceID == Entries.traceID)
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
                    $0.hasSuffix("[00000000deadbeef] (GET /users/:id, trace \(Entries.traceID))")
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
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            try Self.send(Entries.requestRecord(Entries.users), to: journal)
            try Self.send(
                Entries.requestRecord(Entries.users), to: journal,
                overrides: ["STALL_TRACE_ID": "NOT-HEX"])
            try Self.send(
                Entries.requestRecord(Entries.users), to: journal,
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
