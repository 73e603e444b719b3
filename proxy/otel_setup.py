"""OpenTelemetry providers for one app: traces to none | console | OTLP/HTTP, metrics to a
Prometheus registry (served at /metrics) and/or OTLP. Per app, never global, so several apps
(and tests) in one process keep their telemetry apart."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

from brim.middleware.services.instruments import Spread, Telemetry
from brim.middleware.settings import TelemetryConfig

METER = "brim"  # the meter's name (its instrumentation scope)


@dataclass
class Providers:
    telemetry: Telemetry
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    registry: CollectorRegistry | None

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


class PrometheusReader(PrometheusMetricReader):
    """The Prometheus reader, with brim's own histograms (`Spread`s) added to what it collects,
    as the meter's histograms of those names would be (one instrumentation scope, `METER`)."""

    def __init__(self, resource: Resource, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.resource = resource
        self.spreads: Sequence[Spread] = ()

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        if self.spreads:
            metrics_data = with_spreads(metrics_data, self.spreads, self.resource)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)


def with_spreads(data: MetricsData, spreads: Sequence[Spread], resource: Resource) -> MetricsData:
    """`data` with the histograms of `spreads` (those with points) in brim's scope."""
    now = time.time_ns()
    metrics = [metric for spread in spreads if (metric := spread_metric(spread, now))]
    if not metrics:
        return data
    resources = list(data.resource_metrics) or [ResourceMetrics(resource, [], "")]
    first = resources[0]
    scopes = list(first.scope_metrics)
    for i, scope in enumerate(scopes):
        if scope.scope.name == METER:
            scopes[i] = replace(scope, metrics=[*scope.metrics, *metrics])
            break
    else:
        scopes.append(ScopeMetrics(InstrumentationScope(METER), metrics, ""))
    resources[0] = replace(first, scope_metrics=scopes)
    return MetricsData(resources)


def spread_metric(spread: Spread, now_ns: int) -> Metric | None:
    points = [
        HistogramDataPoint(
            attributes=point.attributes,
            start_time_unix_nano=point.started_ns,
            time_unix_nano=now_ns,
            count=point.count,
            sum=point.sum,
            bucket_counts=point.buckets,
            explicit_bounds=spread.bounds,
            min=point.min,
            max=point.max,
        )
        for point in spread.points()
    ]
    if not points:
        return None
    data = Histogram(points, AggregationTemporality.CUMULATIVE)
    return Metric(spread.name, spread.description, spread.unit, data)


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
    prometheus = None
    if config.prometheus:
        registry = CollectorRegistry()
        # Without the `otel_scope_*` labels on every series: every metric here is brim's own.
        prometheus = PrometheusReader(resource, registry=registry, scope_info_enabled=False)
        readers.append(prometheus)
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
        meter=meter_provider.get_meter(METER),
        capture_content=config.capture_content,
        # Kept here and read by the Prometheus reader, unless OTLP needs the meter's own.
        local_histograms=not config.otlp_metrics,
    )
    if prometheus is not None:
        prometheus.spreads = telemetry.spreads()
    return Providers(telemetry, tracer_provider, meter_provider, registry)
