"""Prometheus metrics of several worker processes, served whole by each of them.

Under `brim serve --workers N` a scrape of `/metrics` reaches one worker, whichever the kernel
hands the connection to. So that every scrape reports the counts of every worker, each worker
writes its own metrics — collected from its OpenTelemetry `PrometheusMetricReader`, so the names
and labels are those of a single brim — into prometheus_client's multiprocess files in one
directory (`PROMETHEUS_MULTIPROC_DIR`, as prometheus_client's own multiprocess mode uses it), and
`/metrics` merges the files of all workers with prometheus_client's `MultiProcessCollector`:
counters and histograms summed over the workers, gauges the smallest value among the live ones.

A worker writes its figures every `PUBLISH_INTERVAL_S`, when it is scraped (just before it reads
the others') and when it stops. So a scrape sees the other workers' counts as of at most
`PUBLISH_INTERVAL_S` ago, and the totals never go down from one scrape to the next, whichever
worker answers: each worker's file only grows, and the worker that answers writes its own first.
A worker that dies keeps its file, so its counts stay in the totals (less what it counted after
its last write); its gauges go (`forget_worker`).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

PUBLISH_INTERVAL_S = 1.0
# How the gauges of several workers merge (prometheus_client's mode names): the smallest value
# among the live workers. brim's gauges are `brim_limits_learned` (a smaller learned window is
# the one a worker compresses to) and `target_info` (1).
GAUGE_MODE = "livemin"
# The per-process OpenTelemetry resource attribute: left out of `target_info`, which then is one
# series for the whole group (as Prometheus joins on it) instead of one per worker ever started.
PER_PROCESS_LABELS = frozenset({"service_instance_id"})
# Samples the merge recomputes (`_count`) or that cannot be summed (`_created`).
SKIPPED_SUFFIXES = ("_created", "_count", "_gcount", "_gsum")
# (prometheus_client's multiprocess module and mmap_dict carry no type hints: hence the ignores)


@dataclass(frozen=True)
class MetricsShare:
    """Where a worker writes its metrics (`directory`) and under which name (`token`)."""

    directory: Path
    token: str


def prepare_directory(directory: Path) -> None:
    """Make `directory` if needed and remove the metric files of an earlier run from it (as
    prometheus_client asks of its multiprocess directory): they would count again."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)


def forget_worker(directory: Path, token: str) -> None:
    """A worker is gone: drop its gauges (its counters and histograms stay in the totals)."""
    for path in directory.glob(f"gauge_live*_{token}.db"):
        path.unlink(missing_ok=True)


class WorkerMetrics:
    """One worker's share of the metrics in `directory`, under `token` (unique per worker
    process for the directory's lifetime, without `_`), read from `source` (the registry of the
    worker's `PrometheusMetricReader`). Thread-safe: `publish` and `exposition` run in threads."""

    def __init__(self, directory: Path, token: str, source: CollectorRegistry) -> None:
        if "_" in token:
            raise ValueError(f"a worker token must not contain '_': {token!r}")
        self.directory = directory
        self.token = token
        self.source = source
        self._files: dict[str, MmapedDict] = {}
        self._lock = threading.Lock()
        self._merged = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(self._merged, path=str(directory))  # type: ignore[no-untyped-call]

    def publish(self) -> None:
        """Write this worker's current figures to its files."""
        with self._lock:
            for family in self.source.collect():
                self._write(family)

    def exposition(self) -> bytes:
        """The merged metrics of every worker, in Prometheus' text format (this worker's own
        figures written first, so they are current)."""
        self.publish()
        return generate_latest(self._merged)

    def close(self) -> None:
        """Write the last figures and close the files (the worker is stopping)."""
        self.publish()
        with self._lock:
            for file in self._files.values():
                file.close()  # type: ignore[no-untyped-call]
            self._files.clear()

    def _file(self, kind: str) -> MmapedDict:
        name = f"gauge_{GAUGE_MODE}" if kind == "gauge" else kind
        file = self._files.get(name)
        if file is None:
            path = self.directory / f"{name}_{self.token}.db"
            file = self._files[name] = MmapedDict(str(path))  # type: ignore[no-untyped-call]
        return file

    def _write(self, family: Metric) -> None:
        if family.type == "counter":
            kind = "counter"
        elif family.type == "histogram":
            kind = "histogram"
        elif family.type in ("gauge", "info"):  # OpenTelemetry's target_info is an info metric
            kind = "gauge"
        else:
            return  # OpenTelemetry's reader makes no other kind
        file = self._file(kind)
        buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, str, float]]] = defaultdict(
            list
        )
        for sample in family.samples:
            if sample.name.endswith(SKIPPED_SUFFIXES):
                continue
            labels = {k: v for k, v in sample.labels.items() if k not in PER_PROCESS_LABELS}
            if kind == "histogram" and sample.name.endswith("_bucket"):
                le = labels.pop("le")
                buckets[tuple(sorted(labels.items()))].append((float(le), le, sample.value))
                continue
            key = mmap_key(
                family.name, sample.name, list(labels), list(labels.values()), family.documentation
            )
            file.write_value(key, sample.value, 0.0)  # type: ignore[no-untyped-call]
        # The merge sums each bucket over the workers and makes them cumulative again: so each
        # bucket is written as its own count, not the reader's cumulative one.
        for labels_key, points in buckets.items():
            below = 0.0
            for _, le, cumulative in sorted(points):
                labels = {**dict(labels_key), "le": le}
                key = mmap_key(
                    family.name,
                    f"{family.name}_bucket",
                    list(labels),
                    list(labels.values()),
                    family.documentation,
                )
                file.write_value(key, cumulative - below, 0.0)  # type: ignore[no-untyped-call]
                below = cumulative
