extension StallRecord {
    /// The request a stall happened in: what the span of swift-distributed-tracing around the
    /// stalled work said when the stall was reported. Every part is optional: a span says what its
    /// framework sets (Hummingbird sets the route only when the handler returns, so a stall inside
    /// the handler has the path).
    public struct Request: Sendable, Hashable {
        /// The span's name (`STALL_REQUEST_OPERATION`), e.g. `GET /users/:id` or `HTTP GET route not found`.
        public var operation: String
        /// `http.request.method` (`STALL_REQUEST_METHOD`).
        public var method: String
        /// `http.route` (`STALL_REQUEST_ROUTE`), the route's template.
        public var route: String
        /// `url.path` (`STALL_REQUEST_PATH`), written only when the route is unknown.
        public var path: String
        /// `rpc.method` (`STALL_REQUEST_RPC_METHOD`), for gRPC: `package.Service/Method`.
        public var rpcMethod: String
        /// The W3C trace ID (`STALL_TRACE_ID`): 32 lowercase hex digits, not all zero; or empty.
        public var traceID: String
        /// The W3C span ID of the span the stall happened in (`STALL_SPAN_ID`): 16 lowercase hex
        /// digits, not all zero; or empty.
        public var spanID: String

        public init(
            operation: String = "", method: String = "", route: String = "", path: String = "",
            rpcMethod: String = "", traceID: String = "", spanID: String = ""
        ) {
            self.operation = operation
            self.method = method
            self.route = route
            self.path = path
            self.rpcMethod = rpcMethod
            self.traceID = traceID
            self.spanID = spanID
        }

        /// Whether nothing is known: such a request is not written.
        public var isEmpty: Bool {
            operation.isEmpty && method.isEmpty && route.isEmpty && path.isEmpty && rpcMethod.isEmpty
                && traceID.isEmpty && spanID.isEmpty
        }

        /// What a reader groups by: the route, else the gRPC method, else the path, else the operation;
        /// with the HTTP method in front where there is one (`GET /users/:id`). Empty when none is known.
        public var endpoint: String {
            guard let target = [route, rpcMethod, path].first(where: { !$0.isEmpty }) else { return operation }
            return method.isEmpty ? target : "\(method) \(target)"
        }

        /// The fields as written: each value held to its bound; an empty part, and the path where
        /// the route is known, are left out. A trace or span ID that is not well-formed (or all zero,
        /// which W3C Trace Context calls invalid) is left out rather than cut.
        var fields: [JournalField] {
            guard !isEmpty else { return [] }
            var fields: [JournalField] = []
            func add(_ name: String, _ value: String, _ bytes: Int) {
                if !value.isEmpty { fields.append(JournalField(name, FieldLimits.clamp(value, toBytes: bytes))) }
            }
            add(Field.requestOperation, operation, FieldLimits.nameBytes)
            add(Field.requestMethod, method, FieldLimits.keywordBytes)
            add(Field.requestRoute, route, FieldLimits.nameBytes)
            if route.isEmpty { add(Field.requestPath, path, FieldLimits.nameBytes) }
            add(Field.requestRPCMethod, rpcMethod, FieldLimits.nameBytes)
            if FieldLimits.isTraceContextID(traceID, digits: FieldLimits.traceIDDigits) {
                fields.append(JournalField(Field.traceID, traceID))
            }
            if FieldLimits.isTraceContextID(spanID, digits: FieldLimits.spanIDDigits) {
                fields.append(JournalField(Field.spanID, spanID))
            }
            return fields
        }

        /// Reads the request fields of an entry: `nil` when it has none.
        init?(_ reader: FieldReader) throws(JournalDecodingError) {
            operation = try reader.optionalString(Field.requestOperation, maximumBytes: FieldLimits.nameBytes) ?? ""
            method = try reader.optionalString(Field.requestMethod, maximumBytes: FieldLimits.keywordBytes) ?? ""
            route = try reader.optionalString(Field.requestRoute, maximumBytes: FieldLimits.nameBytes) ?? ""
            path = try reader.optionalString(Field.requestPath, maximumBytes: FieldLimits.nameBytes) ?? ""
            rpcMethod = try reader.optionalString(Field.requestRPCMethod, maximumBytes: FieldLimits.nameBytes) ?? ""
            traceID = try reader.optionalTraceContextID(Field.traceID, digits: FieldLimits.traceIDDigits) ?? ""
            spanID = try reader.optionalTraceContextID(Field.spanID, digits: FieldLimits.spanIDDigits) ?? ""
            if isEmpty { return nil }
        }
    }
}
