import StallJournal

/// What stallmond's metrics name the request of a stall by: `endpoint="GET /users/:id"`.
///
/// Only what the service's code defines makes the label, so that its values are as few as the
/// service's routes: the route's template (`STALL_REQUEST_ROUTE`, after the HTTP method), else the
/// gRPC method (`STALL_REQUEST_RPC_METHOD`), else the span's name (`STALL_REQUEST_OPERATION`) of a
/// span without a path (a service's own `withSpan`). Never the URL path (`STALL_REQUEST_PATH`): it
/// carries IDs (`/users/42`), as many values as there are requests. A request with a path but no
/// route (its span's name is then a placeholder), or known only by its HTTP method or its trace,
/// counts as ``unrouted``. Each unit has at most `max_endpoints_per_unit` of them (``StallAggregator``).
package enum Endpoint {
    /// The label of a stall in a request whose route, gRPC method and span name are all unknown.
    package static let unrouted = "(unrouted)"
    /// The label that stalls past a unit's endpoint limit count under.
    package static let other = "(other endpoints)"
    /// The longest label the schema allows: a method, a space and a route.
    package static let maximumBytes = FieldLimits.keywordBytes + 1 + FieldLimits.nameBytes

    /// The label of `request`: `nil` for a stall outside any request, which no endpoint counts.
    package static func label(of request: StallRecord.Request?) -> String? {
        guard let request else { return nil }
        if !request.route.isEmpty {
            return request.method.isEmpty ? request.route : "\(request.method) \(request.route)"
        }
        if !request.rpcMethod.isEmpty { return request.rpcMethod }
        // A span with a path but no route is a server's request whose route was not known when it
        // stalled: its name then says only that (Hummingbird's "HTTP GET route not found").
        if !request.operation.isEmpty, request.path.isEmpty { return request.operation }
        return unrouted
    }
}
