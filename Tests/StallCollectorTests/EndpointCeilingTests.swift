import Foundation
import StallCollector
import StallConfiguration
import StallJournal
import StallmonTestSupport
import Testing

/// The endpoint ceiling: a user's endpoints over all its units stay within
/// `max_endpoints_per_user`, and the metrics and the state are made again only for the units a
/// stall changed, with the same result as a full rendering.
struct EndpointCeilingTests {
    static let minute: UInt64 = 60_000_000

    @Test func aUsersEndpointsOverAllItsUnitsStayWithinItsBudgetAndGiveWayOnceIdle() {
        var configuration = CollectorConfiguration()
        configuration.maximumEndpointsPerUser = 30
        configuration.windows = [.seconds(600)]
        var aggregator = StallAggregator(configuration: configuration)
        var time: UInt64 = 1_800_000_000_000_000
        func ingest(_ identifier: String, _ route: String, uid: String? = "1000", unit: String? = nil) {
            time += 1000
            aggregator.ingest(
                CollectorRouteTests.entry(
                    CollectorRouteTests.route(route), unit: unit, identifier: identifier, uid: uid, time: time,
                    cursor: "\(time)"))
        }
        func labeled(owner: String) -> Int {
            aggregator.state.units.values.filter { $0.owner == owner }.reduce(0) {
                $0 + $1.endpoints.keys.filter { $0 != Endpoint.other }.count
            }
        }
        for identifier in 0..<10 {
            for route in 0..<22 { ingest("tool-\(identifier)", "/r\(route)") }
        }
        #expect(labeled(owner: "1000") == 30)
        // 10 × 22 stalls: 30 in series of their own, the rest under each unit's (other endpoints).
        #expect(aggregator.state.foldedEndpointStalls == 220 - 30)
        #expect(aggregator.state.units["(tool-9) (uid 1000)"]?.endpoints[Endpoint.other]?.stalls == 22)
        // Another user, and a system unit, have budgets of their own.
        ingest("tool-0", "/mine", uid: "1001")
        ingest("api", "/users/:id", uid: nil, unit: "api.service")
        #expect(aggregator.state.units["(tool-0) (uid 1001)"]?.endpoints["GET /mine"]?.stalls == 1)
        #expect(aggregator.state.units["api.service"]?.endpoints["GET /users/:id"]?.stalls == 1)
        // Once the user's endpoints have not stalled for the longest window, a new one takes the
        // place of its least recent, in whichever of its units that is.
        time += 11 * Self.minute
        ingest("tool-9", "/new")
        #expect(labeled(owner: "1000") == 30)
        #expect(aggregator.state.units["(tool-9) (uid 1000)"]?.endpoints["GET /new"]?.stalls == 1)
        #expect(aggregator.state.units["(tool-0) (uid 1000)"]?.endpoints["GET /r0"] == nil)
        #expect(aggregator.state.evictedEndpoints == 1)

        // The budget is rebuilt from a saved state.
        var restored = StallAggregator(state: aggregator.state, configuration: configuration)
        time += 1000
        restored.ingest(
            CollectorRouteTests.entry(
                CollectorRouteTests.route("/after"), unit: nil, identifier: "tool-8", uid: "1000", time: time,
                cursor: "\(time)"))
        #expect(restored.state.units["(tool-8) (uid 1000)"]?.endpoints["GET /after"]?.stalls == 1)
        #expect(restored.state.evictedEndpoints == 2, "a restored budget is full: the new endpoint takes a place")
        #expect(
            restored.state.units.values.filter { $0.owner == "1000" }.reduce(0) {
                $0 + $1.endpoints.keys.filter { $0 != Endpoint.other }.count
            } == 30)
    }

    /// Random stalls of several users' units, system units, routes, fingerprints, hosts and
    /// suppressions, with series that give way and a reload with new histogram bounds: after each
    /// batch, the cached metrics equal a full rendering and the cached state decodes to the state.
    @Test func metricsAndStateMadeOnlyForChangedUnitsEqualAFullRendering() throws {
        var configuration = CollectorConfiguration()
        configuration.maximumUnits = 4
        configuration.maximumUsers = 3
        configuration.maximumEndpointsPerUnit = 3
        configuration.maximumEndpointsPerUser = 5
        configuration.maximumFingerprintsPerUnit = 3
        configuration.windows = [.seconds(60), .seconds(600)]
        var aggregator = StallAggregator(configuration: configuration)
        let renderer = PrometheusTextfile.Renderer()
        let encoder = StateStore.Encoder()
        var generator = SystemRandomNumberGenerator()
        var time: UInt64 = 1_800_000_000_000_000
        for batch in 0..<60 {
            for _ in 0..<Int.random(in: 1...20, using: &generator) {
                time += UInt64.random(in: 1000...(batch % 7 == 6 ? 20 * Self.minute : Self.minute), using: &generator)
                let user = Int.random(in: 0...5, using: &generator)
                let system = user == 5
                var entry = CollectorRouteTests.entry(
                    Bool.random(using: &generator)
                        ? CollectorRouteTests.route("/r\(Int.random(in: 0...8, using: &generator))") : nil,
                    unit: system ? "api-\(Int.random(in: 0...2, using: &generator)).service" : nil,
                    identifier: "tool-\(Int.random(in: 0...6, using: &generator))",
                    uid: system ? nil : "\(1000 + user)",
                    milliseconds: UInt64.random(in: 250...40_000, using: &generator), time: time,
                    cursor: "\(time)")
                entry.fields["STALL_FINGERPRINT"] = Entries.fingerprint(Int.random(in: 0...6, using: &generator))
                entry.fields["_MACHINE_ID"] = String(
                    repeating: "\(Int.random(in: 1...3, using: &generator))", count: 32)
                aggregator.ingest(entry)
            }
            if batch == 30 {
                configuration.histogramBuckets = [.milliseconds(300), .milliseconds(3000)]
                aggregator.apply(configuration)
            }
            let full = PrometheusTextfile.render(
                aggregator.state, windows: configuration.windows, now: time, aggregator: aggregator)
            let cached = renderer.render(
                aggregator.state, changed: aggregator.takeChangedUnits(for: .metrics), windows: configuration.windows,
                now: time, aggregator: aggregator)
            #expect(cached == full, "batch \(batch)")
            let state = aggregator.snapshot()
            let data = try encoder.encode(state, changed: aggregator.takeChangedUnits(for: .state))
            #expect(try JSONDecoder().decode(CollectorState.self, from: data) == state, "batch \(batch)")
        }
        #expect(aggregator.state.evictedSeries > 0 && aggregator.state.evictedEndpoints > 0)
    }
}
