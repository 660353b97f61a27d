import StallJournal

/// How `report` and `follow` show the request a stall served. Every part of it is text from the
/// journal that any local user may have written: shown escaped (``DisplayText``) and cut.
enum RequestText {
    /// The widest an endpoint is shown, in characters; longer ones end in `…`. The JSON outputs
    /// carry the whole (bounded) values.
    static let endpointLimit = 96

    /// `GET /users/:id`, escaped and cut; empty when the request names none.
    static func endpoint(_ endpoint: String?) -> String {
        DisplayText.cell(endpoint ?? "", limit: endpointLimit)
    }

    /// What `follow` adds to a stall's line: ` (GET /users/:id, trace 4bf92f3577b34da6a3ce929d0e0e4736)`,
    /// either part alone, or nothing outside any request. The trace ID is whole, to be looked up.
    static func suffix(_ request: StallRecord.Request?) -> String {
        guard let request else { return "" }
        // A trace ID read back is always 32 lowercase hex digits (the schema refuses others).
        let parts = [endpoint(request.endpoint), request.traceID.isEmpty ? "" : "trace \(request.traceID)"]
            .filter { !$0.isEmpty }
        return parts.isEmpty ? "" : " (\(parts.joined(separator: ", ")))"
    }
}
