import Instrumentation
import Logging
import OTel
import ServiceLifecycle
import StallMonitorTracing

/// EXAMPLE_TRACING=otel: swift-otel's tracing backend, exporting over OTLP (its OTEL_* variables
/// say where and how), wrapped in `StallmonTracer`, as a service traced with OpenTelemetry adopts it;
/// and its logging backend, through which the monitor's `LoggerSink` exports each report as an OTLP
/// log record linked to the trace it stalled.
public enum ExampleOTel {
    /// What the service runs beside the application, and where stall reports are logged.
    public struct Backends: Sendable {
        /// The exporters, which must run beside the application's service.
        public var services: [any Service]
        /// swift-otel's log handlers: a `Logger` made with them exports OTLP log records.
        public var logHandlers: @Sendable (String) -> any LogHandler
    }

    /// Bootstraps the tracer, when EXAMPLE_TRACING is `otel`, and makes the logging backend.
    public static func bootstrap(_ mode: String?) throws -> Backends? {
        guard mode == "otel" else { return nil }
        var configuration = OTel.Configuration.default
        configuration.metrics.enabled = false
        let tracing = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(StallmonTracer(wrapping: tracing.factory))
        let logging = try OTel.makeLoggingBackend(configuration: configuration)
        return Backends(services: [tracing.service, logging.service], logHandlers: logging.factory)
    }
}
