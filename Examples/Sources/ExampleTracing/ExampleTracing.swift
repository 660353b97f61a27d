import Foundation
import InMemoryTracing
import Instrumentation
import StallMonitorTracing
import Tracing

/// EXAMPLE_TRACING: the tracer the services bootstrap, so that stalls name their requests.
///
///   (unset)   none: the framework's TracingMiddleware is not added either
///   stallmon  `StallmonTracer()` alone, as a service without a tracing backend runs it
///   memory    `StallmonTracer(wrapping: InMemoryTracer())`: the service's finished spans, with
///             their `stall` events, are served as JSON at GET /spans
public enum ExampleTracing {
    public static let mode = ProcessInfo.processInfo.environment["EXAMPLE_TRACING"]

    nonisolated(unsafe) private static var memory: InMemoryTracer?

    /// Bootstraps the tracer EXAMPLE_TRACING names; returns whether there is one (then the service
    /// adds its framework's TracingMiddleware).
    public static func bootstrap() -> Bool {
        switch mode {
        case "stallmon":
            InstrumentationSystem.bootstrap(StallmonTracer())
            return true
        case "memory":
            let tracer = InMemoryTracer()
            memory = tracer
            InstrumentationSystem.bootstrap(StallmonTracer(wrapping: tracer))
            return true
        default:
            return false
        }
    }

    /// The finished spans as JSON (EXAMPLE_TRACING=memory): operation, attributes, events.
    public static func finishedSpansJSON() -> String {
        let spans = (memory?.finishedSpans ?? []).map { span -> [String: Any] in
            [
                "operation": span.operationName,
                "attributes": strings(span.attributes),
                "events": span.events.map { ["name": $0.name, "attributes": strings($0.attributes)] },
            ]
        }
        let data = (try? JSONSerialization.data(withJSONObject: spans, options: [.sortedKeys])) ?? Data("[]".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    private static func strings(_ attributes: SpanAttributes) -> [String: String] {
        var result: [String: String] = [:]
        attributes.forEach { name, value in result[name] = "\(value)" }
        return result
    }
}
