"""The metrics of several workers merged: what any worker's /metrics reports is what one process
that had seen every worker's requests would report."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from brim.middleware.settings import TelemetryConfig
from brim.proxy.multiproc import WorkerMetrics, forget_worker, prepare_directory
from brim.proxy.otel_setup import Providers, build_providers


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and labels (the per-process instance id aside).
    A bucket's bound is read as the number it is: the merge writes it as Go does
    (`1.048576e+06`), OpenTelemetry's exporter as Python does (`1048576.0`)."""
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            labels = tuple(
                sorted(
                    (k, repr(float(v)) if k == "le" else v)
                    for k, v in sample.labels.items()
                    if k != "service_instance_id"
                )
            )
            found[(sample.name, labels)] = sample.value
    return found


def traffic(
    providers: Providers,
    requests: list[tuple[str, str, float]],
    learned: dict[str, int] | None = None,
) -> None:
    """Record requests (model, outcome, latency in s) on `providers`, as brim's pipeline does,
    and (once per provider) the windows it has `learned`."""
    telemetry = providers.telemetry
    for model, outcome, latency in requests:
        labels = {"route": "openai.chat", "model": model, "outcome": outcome}
        telemetry.requests.add(1, labels)
        telemetry.added_latency.record(latency, {"model": model})
        telemetry.tokens_removed.add(int(latency * 1000) * 10, {"policy": "evict"})
        genai = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        telemetry.operation_duration.record(latency * 100, genai)
        for kind, tokens in (("input", 4000 * latency), ("output", 90)):
            telemetry.token_usage.record(int(tokens), {**genai, "gen_ai.token.type": kind})
    if learned is not None:
        telemetry.watch_learned_limits(lambda: learned)


def test_merged_metrics_are_those_of_one_process_that_saw_everything(tmp_path: Path) -> None:
    first_requests = [("gpt-4o", "ok", 0.003), ("gpt-4o", "ok", 0.012), ("claude", "refused", 0.08)]
    second_requests = [("gpt-4o", "ok", 0.007), ("claude", "ok", 0.6), ("gpt-4o", "error", 0.0002)]
    config = TelemetryConfig()
    first, second, whole = build_providers(config), build_providers(config), build_providers(config)
    traffic(first, first_requests, {"claude": 9000})
    traffic(second, second_requests, {"claude": 8000, "gpt-4o": 100000})
    traffic(whole, first_requests + second_requests, {"claude": 8000, "gpt-4o": 100000})
    prepare_directory(tmp_path)
    assert first.registry and second.registry and whole.registry
    one = WorkerMetrics(tmp_path, "101-0", first.registry)
    two = WorkerMetrics(tmp_path, "102-1", second.registry)
    two.publish()

    merged = samples(one.exposition())
    expected = samples(generate_latest(whole.registry))
    assert merged == expected  # counters, histogram buckets, sums and counts; the smaller window
    assert (
        merged[
            (
                "brim_requests_total",
                (
                    ("model", "gpt-4o"),
                    ("outcome", "ok"),
                    ("route", "openai.chat"),
                ),
            )
        ]
        == 3
    )
    durations = (
        "gen_ai_client_operation_duration_seconds_count",
        (("gen_ai_operation_name", "chat"), ("gen_ai_request_model", "claude")),
    )
    assert merged[durations] == 2
    assert samples(two.exposition()) == expected  # whichever worker answers
    one.close()
    two.close()


def test_totals_never_go_down_between_scrapes_and_a_dead_worker_still_counts(
    tmp_path: Path,
) -> None:
    config = TelemetryConfig()
    first, second = build_providers(config), build_providers(config)
    prepare_directory(tmp_path)
    assert first.registry and second.registry
    one = WorkerMetrics(tmp_path, "201-0", first.registry)
    two = WorkerMetrics(tmp_path, "202-1", second.registry)
    learned = {"claude": 9000}
    traffic(second, [("claude", "ok", 1.0)] * 4, learned)
    two.publish()

    def total(text: bytes) -> float:
        return sum(v for (name, _), v in samples(text).items() if name == "brim_requests_total")

    def learned_window(text: bytes) -> list[float]:
        return [v for (name, _), v in samples(text).items() if name == "brim_limits_learned"]

    traffic(first, [("claude", "ok", 1.0)] * 2)
    assert total(one.exposition()) == 6
    traffic(second, [("claude", "ok", 1.0)] * 3)  # not written yet: the scrape says 6 still
    assert total(one.exposition()) == 6
    assert total(two.exposition()) == 9  # the worker answering writes its own first
    assert total(one.exposition()) == 9  # and no later scrape reports less
    assert learned_window(one.exposition()) == [9000]

    two.close()  # the second worker is gone: its requests still count, its gauges do not
    forget_worker(tmp_path, "202-1")
    assert total(one.exposition()) == 9
    assert learned_window(one.exposition()) == []
    one.close()


def test_an_earlier_runs_files_are_cleared(tmp_path: Path) -> None:
    config = TelemetryConfig()
    earlier = build_providers(config)
    assert earlier.registry
    traffic(earlier, [("gpt-4o", "ok", 1.0)])
    WorkerMetrics(tmp_path, "301-0", earlier.registry).close()
    (tmp_path / "notes.txt").write_text("not ours")
    prepare_directory(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]
