"""brim's own counters and histograms (`Tally`, `Spread`), and their series bound once
(`bind`), export what the OpenTelemetry SDK's synchronous instruments of the same names would."""

from __future__ import annotations

import random

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from brim.middleware.services.instruments import LATENCY_BOUNDS, Spread, Tally, bind
from brim.middleware.settings import TelemetryConfig
from brim.proxy.otel_setup import build_providers

# across every bucket, on the boundaries and just beside them, and past the last one (seconds)
LATENCIES = [0.0, 0.0003, 0.00499, 0.005, 0.005000001, 0.01, 0.074, 9.999, 10.0, 10.0005, 123.456]
LATENCIES += [random.Random(7).random() * 3 for _ in range(200)]
Samples = dict[str, list[tuple[str, tuple[tuple[str, str], ...], float]]]


def exposition(local: bool, bound: bool = False) -> Samples:
    """/metrics after the same counts and latencies, through brim's instruments (`bound`: their
    series bound once, by `bind`) or the SDK's."""
    providers = build_providers(TelemetryConfig())
    telemetry = providers.telemetry
    meter = telemetry.meter
    described = {"unit": "{request}", "description": "Requests by route, model and outcome"}
    if local:
        assert isinstance(telemetry.added_latency, Spread)  # what the Prometheus reader adds
        latency = telemetry.added_latency
        counter = Tally(meter, "brim.counted", **described)
    else:
        latency = meter.create_histogram(
            "brim.latency.added",
            unit="s",
            description=telemetry.added_latency.description,
            explicit_bucket_boundaries_advisory=LATENCY_BOUNDS,
        )
        counter = meter.create_counter("brim.counted", **described)
    for i, value in enumerate(LATENCIES):
        labels = {"route": "openai", "model": f"m{i % 2}", "outcome": "ok"}
        labels = labels if i % 3 else dict(reversed(labels.items()))
        if bound:
            bind(latency, {"model": f"m{i % 3}"})(value)
        else:
            latency.record(value, {"model": f"m{i % 3}"})
        if bound and isinstance(counter, Tally):
            counter.bind(labels)(i % 4)
        else:
            counter.add(i % 4, labels)
    for amount in (-1.0, float("nan"), float("inf")):  # refused, by all
        if bound:
            bind(latency, {"model": "m0"})(amount)
            bind(latency, {"model": "never"})(amount)  # and no series made for it
        else:
            latency.record(amount, {"model": "m0"})
            latency.record(amount, {"model": "never"})
        if bound and isinstance(counter, Tally):
            counter.bind(labels)(amount)
        else:
            counter.add(amount, labels)
    assert providers.registry is not None
    text = generate_latest(providers.registry).decode()
    return {
        family.name: sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples
        )
        for family in text_string_to_metric_families(text)
        if family.name != "target_info"
    }


def test_local_counters_and_histograms_read_as_the_sdks_would() -> None:
    local = exposition(local=True)
    assert set(local) == {"brim_counted", "brim_latency_added_seconds"}
    assert len(local["brim_latency_added_seconds"]) == 3 * (16 + 2)  # buckets, count, sum
    assert local == exposition(local=False)
    assert exposition(local=True, bound=True) == local
    assert exposition(local=False, bound=True) == local
