"""OpenTelemetry providers for one app: traces to none | console | OTLP/HTTP, metrics to a
Prometheus registry (served at /metrics) and/or OTLP. Per app, never global, so several apps
(and tests) in one process keep their telemetry apart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from middleware.settings import TelemetryConfig
from middleware.telemetry import Telemetry


@dataclass
class Providers:
    telemetry: Telemetry
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    registry: CollectorRegistry | None

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def build_providers(
    config: TelemetryConfig, extra_span_processors: Sequence[SpanProcessor] = ()
) -> Providers:
    resource = Resource.create({"service.name": config.service_name})
    tracer_provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(config.sample_ratio))
    )
    if config.traces == "console":
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif config.traces == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=f"{config.otlp_endpoint.rstrip('/')}/v1/traces")
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in extra_span_processors:
        tracer_provider.add_span_processor(processor)

    readers: list[MetricReader] = []
    registry = None
    if config.prometheus:
        registry = CollectorRegistry()
        readers.append(PrometheusMetricReader(registry=registry))
    if config.otlp_metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        metric_exporter = OTLPMetricExporter(
            endpoint=f"{config.otlp_endpoint.rstrip('/')}/v1/metrics"
        )
        readers.append(
            PeriodicExportingMetricReader(
                metric_exporter, export_interval_millis=config.otlp_metrics_interval_s * 1000
            )
        )
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    exporting = config.traces != "none" or bool(extra_span_processors)
    telemetry = Telemetry(
        # With nowhere to send spans, a no-op tracer makes them free instead of merely unsent.
        tracer=tracer_provider.get_tracer("brim") if exporting else trace.NoOpTracer(),
        meter=meter_provider.get_meter("brim"),
        capture_content=config.capture_content,
    )
    return Providers(telemetry, tracer_provider, meter_provider, registry)
