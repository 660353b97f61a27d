import Foundation
import StallCollector
import StallConfiguration
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Serial {
    /// stallmond on a real journald: `nobody` floods stalls of made-up routes while a system unit
    /// stalls in its own route; the metrics keep the bound and the unit's series, across a
    /// restart, and a state with impossible endpoint counts is refused with 69.
    @Suite
    struct CollectorRouteEndToEndTests {
        static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"

        static func stall(_ identifier: String, route: String, fingerprint: Int) -> [(String, String)] {
            var fields = Entries.stallFields(
                identifier: identifier, fingerprint: Entries.fingerprint(fingerprint))
            fields += [
                ("STALL_REQUEST_OPERATION", "GET \(route)"), ("STALL_REQUEST_METHOD", "GET"),
                ("STALL_REQUEST_ROUTE", route), ("STALL_TRACE_ID", Self.traceID),
            ]
            return fields
        }

        @Test func aFloodOfRoutesStaysWithinTheBoundAndKeepsASystemUnitsEndpoints() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let unit = "stallmon-routes-\(getpid()).service"
            defer { JournalWriters.removeSystemUnit(unit) }
            let flood = (0..<200).map { Self.stall("api", route: "/flood/\($0)", fingerprint: 1) }
            try JournalWriters.send(flood, to: journal.socketPath, as: .nobody)
            try JournalWriters.send(
                [Self.stall("api", route: "/users/:id", fingerprint: 2)], to: journal.socketPath,
                as: .systemUnit(unit))
            try #require(journal.waitForEntries(201, messageIDs: [MessageID.stallEnded], timeout: 30))
            let scratch = try Serial.HostileWriterTests.Daemon(journal: try #require(journal.directory))
            defer { scratch.remove() }
            let service = #"stallmon_endpoint_stalls_total{unit="\#(unit)",endpoint="GET /users/:id"}"#
            let other = #"stallmon_endpoint_stalls_total{unit="(api) (uid 65534)",endpoint="(other endpoints)"}"#
            for run in ["first start", "restart"] {
                try? FileManager.default.removeItem(atPath: scratch.metrics)
                let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
                defer { if daemon.process.isRunning { _ = daemon.terminate() } }
                #expect(scratch.wait(service, toBe: 1), "\(run): \(scratch.text)")
                #expect(scratch.wait(other, toBe: 180), "\(run): \(scratch.text)")
                let series = scratch.text.split(separator: "\n").filter {
                    $0.hasPrefix(#"stallmon_endpoint_stalls_total{unit="(api) (uid 65534)""#)
                }
                #expect(series.count == 21, "\(run): \(series.count) series")
                #expect(scratch.value(#"stallmond_folded_stalls_total{what="endpoint"}"#) == 180)
                #expect(!scratch.text.contains("/flood/150"))
                if run == "first start" {
                    #expect(
                        daemon.waitForOutput { _, errors in
                            errors.contains("folded: endpoint") && errors.contains("max_endpoints_per_unit")
                        }, "\(daemon.errorsSoFar)")
                }
                #expect(daemon.terminate().status == 0)
            }

            // The saved state holds the endpoints; one with impossible counts is refused.
            let saved = try String(contentsOfFile: scratch.state, encoding: .utf8)
            let state = try JSONDecoder().decode(CollectorState.self, from: Data(saved.utf8))
            #expect(state.units[unit]?.endpoints["GET /users/:id"]?.stalls == 1)
            #expect(state.units["(api) (uid 65534)"]?.endpoints.count == 21)
            let damaged = saved.replacingOccurrences(
                of: #""foldedEndpointStalls":180"#, with: #""foldedEndpointStalls":-180"#)
            #expect(damaged != saved)
            try damaged.write(toFile: scratch.state, atomically: true, encoding: .utf8)
            let refused = try Executable.stallmond.run(["--config", scratch.configuration], timeout: 20)
            #expect(refused.status == 69)
            #expect(refused.errors.contains("foldedEndpointStalls is -180, below zero"), "\(refused.errors)")
        }

        /// The endpoint ceiling of one user: `nobody` stalls in 22 routes under each of 50 identifiers
        /// (1,100 endpoints, every unit within `max_endpoints_per_unit`'s reach). Its units together
        /// keep `max_endpoints_per_user` (100) endpoint series; the rest count under each unit's
        /// `(other endpoints)`, and a system unit's route keeps its own series.
        @Test func aUsersRoutesOverManyIdentifiersStayWithinItsBudgetOnTheHost() throws {
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning(), "cannot start journald for namespace \(journal.name)")
            let unit = "stallmon-ceiling-\(getpid()).service"
            defer { JournalWriters.removeSystemUnit(unit) }
            let flood = (0..<50).flatMap { identifier in
                (0..<22).map { Self.stall("api-\(identifier)", route: "/r\($0)", fingerprint: 1) }
            }
            try JournalWriters.send(flood, to: journal.socketPath, as: .nobody)
            try JournalWriters.send(
                [Self.stall("api", route: "/users/:id", fingerprint: 2)], to: journal.socketPath,
                as: .systemUnit(unit))
            try #require(journal.waitForEntries(1101, messageIDs: [MessageID.stallEnded], timeout: 60))
            let scratch = try Serial.HostileWriterTests.Daemon(journal: try #require(journal.directory))
            defer { scratch.remove() }
            let daemon = try Executable.stallmond.start(["--config", scratch.configuration])
            defer { if daemon.process.isRunning { _ = daemon.terminate() } }
            let service = #"stallmon_endpoint_stalls_total{unit="\#(unit)",endpoint="GET /users/:id"}"#
            #expect(scratch.wait(service, toBe: 1), "\(scratch.text)")
            #expect(scratch.wait(#"stallmond_folded_stalls_total{what="endpoint"}"#, toBe: 1000), "\(scratch.text)")
            let users = scratch.text.split(separator: "\n").filter {
                $0.hasPrefix("stallmon_endpoint_stalls_total{") && $0.contains(" (uid 65534)\"")
            }
            let own = users.filter { !$0.contains(#"endpoint="(other endpoints)""#) }
            #expect(own.count == CollectorConfiguration().maximumEndpointsPerUser, "\(own.count) endpoint series")
            #expect(users.count - own.count == 50, "one (other endpoints) series per unit")
            let total = own.compactMap { $0.split(separator: " ").last.flatMap { Int($0) } }.reduce(0, +)
            #expect(total == 100, "each of its endpoint series counts one stall")
            #expect(
                daemon.waitForOutput { _, errors in errors.contains("max_endpoints_per_user") }, "\(daemon.errorsSoFar)"
            )
            #expect(daemon.terminate().status == 0)
        }
    }
}
