import Foundation
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

/// The request a stall served (`STALL_REQUEST_*`, `STALL_TRACE_ID`, `STALL_SPAN_ID`): written and
/// read back through the one schema, held to its bounds, and never taken on trust.
struct RequestFieldsTests {
    static let traceID = Entries.traceID
    static let spanID = Entries.spanID

    /// An ended stall of `identifier` serving `request`, as the monitor writes it.
    static func record(
        _ request: StallRecord.Request?, identifier: String = "api", fingerprint: String = "00000000deadbeef",
        milliseconds: UInt64 = 400, frame: String = "UserStore.load(id:) (UserStore.swift:57)"
    ) -> StallRecord {
        Entries.requestRecord(
            request, identifier: identifier, fingerprint: fingerprint, milliseconds: milliseconds, frame: frame)
    }

    static func dictionary(_ record: StallRecord) -> [String: String] { Entries.dictionary(record) }

    static let users = Entries.users

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
