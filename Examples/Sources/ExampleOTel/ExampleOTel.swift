import Instrumentation
import OTel
import ServiceLifecycle
import StallMonitorTracing

/// EXAMPLE_TRACING=otel: swift-otel's tracing backend, exporting over OTLP (its OTEL_* variables
/// say where and how), wrapped in `StallmonTracer`, as a service traced with OpenTelemetry adopts it.
public enum ExampleOTel {
    /// Bootstraps the tracer, when EXAMPLE_TRACING is `otel`, and returns the backend's service,
    /// which must run beside the application's (it exports the spans).
    public static func bootstrap(_ mode: String?) throws -> (any Service)? {
        guard mode == "otel" else { return nil }
        var configuration = OTel.Configuration.default
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(StallmonTracer(wrapping: backend.factory))
        return backend.service
    }
}
