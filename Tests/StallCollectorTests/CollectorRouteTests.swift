import Foundation
import StallCollector
import StallConfiguration
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// stallmond's stalls per endpoint: named by route, gRPC method or span name (never the URL path),
/// at most `max_endpoints_per_unit` a unit, the rest folded and counted, kept across restarts.
struct CollectorRouteTests {
    static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"

    /// An ended stall of `unit` (or of `identifier`, written by `uid` outside any unit) serving `request`.
    static func entry(
        _ request: StallRecord.Request?, unit: String? = "api.service", identifier: String = "api",
        uid: String? = nil, milliseconds: UInt64 = 300, time: UInt64, cursor: String
    ) -> JournalEntry {
        Entries.requestEntry(
            request, unit: unit, identifier: identifier, uid: uid, milliseconds: milliseconds, time: time,
            cursor: cursor)
    }

    static func route(_ route: String, method: String = "GET") -> StallRecord.Request {
        Entries.route(route, method: method)
    }

    static func render(_ aggregator: StallAggregator, now: UInt64) -> String {
        PrometheusTextfile.render(aggregator.state, windows: [.seconds(300)], now: now, aggregator: aggregator)
    }

    @Test func endpointsAreNamedByRouteRPCMethodOrSpanNeverByPath() {
        typealias Request = StallRecord.Request
        #expect(Endpoint.label(of: nil) == nil)
        #expect(Endpoint.label(of: Self.route("/users/:id")) == "GET /users/:id")
        #expect(Endpoint.label(of: Request(route: "/health")) == "/health")
        #expect(
            Endpoint.label(of: Request(operation: "SayHello", rpcMethod: "helloworld.Greeter/SayHello"))
                == "helloworld.Greeter/SayHello")
        #expect(Endpoint.label(of: Request(operation: "refresh-cache")) == "refresh-cache")
        #expect(
            Endpoint.label(of: Request(operation: "HTTP GET route not found", method: "GET", path: "/users/42"))
                == Endpoint.unrouted)
        #expect(Endpoint.label(of: Request(method: "POST")) == Endpoint.unrouted)
        #expect(Endpoint.label(of: Request(traceID: Self.traceID)) == Endpoint.unrouted)
    }

    @Test func stallsInRequestsAreCountedPerUnitAndEndpoint() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        var time: UInt64 = 1_800_000_000_000_000
        func ingest(_ request: StallRecord.Request?, milliseconds: UInt64 = 300, unit: String = "api.service") {
            time += 1000
            aggregator.ingest(
                Self.entry(request, unit: unit, milliseconds: milliseconds, time: time, cursor: "\(time)"))
        }
        ingest(Self.route("/users/:id"), milliseconds: 300)
        ingest(Self.route("/users/:id"), milliseconds: 1200)
        ingest(StallRecord.Request(operation: "SayHello", rpcMethod: "helloworld.Greeter/SayHello"))
        ingest(StallRecord.Request(operation: "HTTP GET route not found", method: "GET", path: "/users/4242"))
        ingest(nil)
        ingest(Self.route("/users/:id"), unit: "other.service")
        let state = aggregator.snapshot()
        let api = state.units["api.service"]!
        #expect(api.stalls == 5)
        #expect(api.endpoints["GET /users/:id"]?.stalls == 2)
        #expect(api.endpoints["GET /users/:id"]?.totalMicroseconds == 1_500_000)
        #expect(api.endpoints.count == 3, "a stall outside any request counts in no endpoint")

        let text = Self.render(aggregator, now: time)
        #expect(text.contains(#"stallmon_endpoint_stalls_total{unit="api.service",endpoint="GET /users/:id"} 2"#))
        #expect(
            text.contains(#"stallmon_endpoint_stall_seconds_total{unit="api.service",endpoint="GET /users/:id"} 1.5"#))
        #expect(
            text.contains(
                #"stallmon_endpoint_stalls_total{unit="api.service",endpoint="helloworld.Greeter/SayHello"} 1"#))
        #expect(text.contains(#"stallmon_endpoint_stalls_total{unit="api.service",endpoint="(unrouted)"} 1"#))
        #expect(text.contains(#"stallmon_endpoint_stalls_total{unit="other.service",endpoint="GET /users/:id"} 1"#))
        #expect(!text.contains("4242"), "the URL path is never a label")
        #expect(text.contains(#"stallmond_folded_stalls_total{what="endpoint"} 0"#))
        #expect(text.contains(#"stallmond_evicted_series_total{what="endpoint"} 0"#))
        #expect(text.contains("# TYPE stallmon_endpoint_stalls_total counter"))
    }

    /// Past `max_endpoints_per_unit`, new endpoints count under `(other endpoints)` while the
    /// unit's endpoints all still stall, and take the place of the least recent one once it has
    /// not stalled for the longest window; no counter ever shrinks.
    @Test func endpointsPastTheBoundFoldAndGiveWayOnceIdle() {
        var configuration = CollectorConfiguration()
        configuration.windows = [.seconds(60)]
        configuration.maximumEndpointsPerUnit = 3
        var aggregator = StallAggregator(configuration: configuration)
        var time: UInt64 = 1_800_000_000_000_000
        var previous: [String: Int] = [:]
        func ingest(_ route: String) {
            time += 1_000_000
            aggregator.ingest(Self.entry(Self.route(route), time: time, cursor: "\(time)"))
            let endpoints = aggregator.state.units["api.service"]!.endpoints
            #expect(endpoints.filter { $0.key != Endpoint.other }.count <= 3)
            // Every stall in a request is counted once, under one series or another.
            #expect(endpoints.values.reduce(0) { $0 + $1.stalls } == aggregator.state.units["api.service"]!.stalls)
            let series = PrometheusTextfile.render(
                aggregator.state, windows: [.seconds(60)], now: time, aggregator: aggregator
            ).split(separator: "\n").filter { $0.hasPrefix("stallmon_endpoint_stalls_total{") }
            #expect(series.count <= 4)
            var total = 0
            for line in series { total += Int(line.split(separator: " ").last!)! }
            #expect(total >= previous.values.reduce(0, +), "counters never shrink")
            previous = ["all": total]
        }
        for index in 0..<5 { ingest("/r\(index)") }
        var state = aggregator.state
        #expect(Set(state.units["api.service"]!.endpoints.keys) == ["GET /r0", "GET /r1", "GET /r2", Endpoint.other])
        #expect(state.units["api.service"]!.endpoints[Endpoint.other]?.stalls == 2)
        #expect(state.foldedEndpointStalls == 2)
        let notes = aggregator.takeFoldNotes()
        #expect(notes.contains { $0.note.what == "endpoint" && $0.note.reason.contains("max_endpoints_per_unit") })

        ingest("/r1")
        ingest("/r2")
        time += 61_000_000
        ingest("/r9")  // /r0 has not stalled for 61 s: it gives way
        state = aggregator.state
        #expect(Set(state.units["api.service"]!.endpoints.keys) == ["GET /r9", "GET /r1", "GET /r2", Endpoint.other])
        #expect(state.units["api.service"]!.endpoints[Endpoint.other]?.stalls == 3)
        #expect(state.evictedEndpoints == 1)
        let text = Self.render(aggregator, now: time)
        #expect(text.contains(#"stallmond_folded_stalls_total{what="endpoint"} 2"#))
        #expect(text.contains(#"stallmond_evicted_series_total{what="endpoint"} 1"#))
        #expect(text.contains(#"stallmon_endpoint_stalls_total{unit="api.service",endpoint="(other endpoints)"} 3"#))
    }

    /// A user who writes a stall for each of 500 made-up routes under one identifier, and under 60
    /// identifiers, gets at most `max_endpoints_per_unit` endpoints in each of its series; a
    /// system unit's endpoints are untouched.
    @Test func aFloodOfRoutesFillsOnlyTheWritersOwnEndpoints() {
        var aggregator = StallAggregator(configuration: CollectorConfiguration())
        var time: UInt64 = 1_800_000_000_000_000
        aggregator.ingest(Self.entry(Self.route("/users/:id"), time: time, cursor: "s"))
        for index in 0..<500 {
            time += 1000
            aggregator.ingest(
                Self.entry(
                    Self.route("/flood/\(index)"), unit: nil, identifier: "api", uid: "65534", time: time,
                    cursor: "f\(index)"))
        }
        for index in 0..<60 {
            time += 1000
            aggregator.ingest(
                Self.entry(
                    Self.route("/spread/\(index)"), unit: nil, identifier: "tool-\(index)", uid: "65534", time: time,
                    cursor: "t\(index)"))
        }
        time += 1000
        aggregator.ingest(Self.entry(Self.route("/users/:id"), time: time, cursor: "s2"))
        let state = aggregator.snapshot()
        #expect(state.units["api.service"]?.endpoints["GET /users/:id"]?.stalls == 2)
        #expect(state.units["api.service"]?.endpoints.count == 1)
        let flood = state.units["(api) (uid 65534)"]!
        #expect(flood.endpoints.count == 21)
        #expect(flood.endpoints[Endpoint.other]?.stalls == 480)
        for (unit, stats) in state.units {
            #expect(stats.endpoints.filter { $0.key != Endpoint.other }.count <= 20, "\(unit)")
        }
        let text = Self.render(aggregator, now: time)
        let series = text.split(separator: "\n").filter { $0.hasPrefix("stallmon_endpoint_stalls_total{") }
        // 1 (the system unit) + 21 (the flooded identifier) + 50 users' series of 1 + (other units)'s 10 + 1.
        #expect(series.count <= 1 + 21 + 50 + 21, "\(series.count) series")
        #expect(text.contains(#"stallmon_endpoint_stalls_total{unit="api.service",endpoint="GET /users/:id"} 2"#))
    }

    /// The endpoints are part of `state.json`: saved, loaded as they were, rebuilt the same from
    /// a replay; a state without them (an earlier version's) loads with none, and impossible
    /// endpoint counts are refused with the reason.
    @Test func endpointsSurviveARestartAndDamagedOnesAreRefused() throws {
        var configuration = CollectorConfiguration()
        configuration.maximumEndpointsPerUnit = 2
        var entries: [JournalEntry] = []
        var time: UInt64 = 1_800_000_000_000_000
        for route in ["/a", "/b", "/c", "/a"] {
            time += 1000
            entries.append(Self.entry(Self.route(route), time: time, cursor: "c\(time)"))
        }
        var aggregator = StallAggregator(configuration: configuration)
        for entry in entries { aggregator.ingest(entry) }
        let directory = NSTemporaryDirectory() + "stallmond-routes-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = StateStore(directory: directory)
        try store.save(aggregator.snapshot())
        let loaded = try store.load()
        #expect(loaded == aggregator.state)
        #expect(loaded.units["api.service"]?.endpoints.keys.sorted() == ["(other endpoints)", "GET /a", "GET /b"])
        #expect(loaded.foldedEndpointStalls == 1)
        // After a restart the counts go on from where they were.
        var restarted = StallAggregator(state: loaded, configuration: configuration)
        time += 1000
        restarted.ingest(Self.entry(Self.route("/d"), time: time, cursor: "d"))
        #expect(restarted.state.units["api.service"]?.endpoints[Endpoint.other]?.stalls == 2)
        #expect(restarted.state.foldedEndpointStalls == 2)

        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: store.path)))
                as? [String: Any])
        func write(_ change: (inout [String: Any]) -> Void) throws {
            var document = json
            change(&document)
            try JSONSerialization.data(withJSONObject: document).write(to: URL(fileURLWithPath: store.path))
        }
        func editUnit(_ document: inout [String: Any], _ change: (inout [String: Any]) -> Void) {
            var units = document["units"] as! [String: Any]
            var unit = units["api.service"] as! [String: Any]
            change(&unit)
            units["api.service"] = unit
            document["units"] = units
        }
        // An earlier version's state: no endpoints, no endpoint counters.
        try write { document in
            document["foldedEndpointStalls"] = nil
            document["evictedEndpoints"] = nil
            editUnit(&document) { $0["endpoints"] = nil }
        }
        let earlier = try store.load()
        #expect(earlier.units["api.service"]?.endpoints.isEmpty == true)
        #expect(earlier.units["api.service"]?.stalls == 4)

        // A change that writes one endpoint of the unit, as a damaged file might have it.
        func endpoint(_ name: String, stalls: Int, total: Int, lastSeen: Int) -> (inout [String: Any]) -> Void {
            { document in
                editUnit(&document) { unit in
                    var endpoints = unit["endpoints"] as! [String: Any]
                    endpoints[name] = ["stalls": stalls, "totalMicroseconds": total, "lastSeenMicroseconds": lastSeen]
                    unit["endpoints"] = endpoints
                }
            }
        }
        let damaged: [(String, (inout [String: Any]) -> Void)] = [
            ("foldedEndpointStalls is -1, below zero", { $0["foldedEndpointStalls"] = -1 }),
            ("endpoints[GET /a].stalls is 99, outside 0...4", endpoint("GET /a", stalls: 99, total: 1, lastSeen: 1)),
            ("fewer than its endpoints' 7", endpoint("GET /z", stalls: 3, total: 1, lastSeen: 1)),
            ("is not an endpoint: 0 bytes", endpoint("", stalls: 0, total: 0, lastSeen: 0)),
            (
                "is not an endpoint: 400 bytes",
                endpoint(String(repeating: "e", count: 400), stalls: 0, total: 0, lastSeen: 0)
            ),
        ]
        for (reason, change) in damaged {
            try write(change)
            #expect {
                _ = try store.load()
            } throws: { error in
                "\(error)".contains("is damaged") && "\(error)".contains(reason)
            }
        }
    }

    @Test func maxEndpointsPerUnitIsAStrictKnob() throws {
        #expect(CollectorConfiguration().maximumEndpointsPerUnit == 20)
        let file = try CollectorConfiguration.parse(
            json: Data(#"{"max_endpoints_per_unit": 5}"#.utf8), source: "stallmond.json", environment: [:])
        #expect(file.maximumEndpointsPerUnit == 5)
        let variable = try CollectorConfiguration.parse(
            json: nil, source: "stallmond.json", environment: ["STALLMOND_MAX_ENDPOINTS_PER_UNIT": "1000"])
        #expect(variable.maximumEndpointsPerUnit == 1000)
        #expect(variable.summary.contains("max_endpoints_per_unit=1000"))
        for (value, reason) in [
            ("0", "must be between 1 and 1000"), ("1001", "must be between 1 and 1000"), ("2.5", ""), ("\"20\"", ""),
            ("1e10", ""),
        ] {
            #expect {
                _ = try CollectorConfiguration.parse(
                    json: Data(#"{"max_endpoints_per_unit": \#(value)}"#.utf8), source: "stallmond.json",
                    environment: [:])
            } throws: { error in
                let error = error as? ConfigurationError
                return error?.key == "max_endpoints_per_unit" && error?.source == "stallmond.json"
                    && (reason.isEmpty || error?.reason == reason)
            }
        }
        #expect {
            _ = try CollectorConfiguration.parse(
                json: nil, source: "stallmond.json", environment: ["STALLMOND_MAX_ENDPOINT_PER_UNIT": "5"])
        } throws: { error in
            "\(error)".contains("did you mean STALLMOND_MAX_ENDPOINTS_PER_UNIT?")
        }
    }
}
