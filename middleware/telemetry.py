"""The instruments brim reports through (OpenTelemetry API), and the in-process status board
(summed over every process and instance by `middleware.shared` when they share a Redis)."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Tracer


@dataclass
class Telemetry:
    tracer: Tracer
    meter: Meter
    capture_content: bool = False

    def __post_init__(self) -> None:
        meter = self.meter
        self.requests = meter.create_counter(
            "brim.requests", unit="{request}", description="Requests by route, model and outcome"
        )
        self.prevented = meter.create_counter(
            "brim.overflows.prevented", unit="{request}", description="Compressed by the guard"
        )
        self.survived = meter.create_counter(
            "brim.overflows.survived", unit="{request}", description="Succeeded after a retry"
        )
        self.retries = meter.create_counter("brim.retries", unit="{retry}")
        self.tokens_removed = meter.create_counter(
            "brim.tokens.removed", unit="{token}", description="Input tokens removed, by policy"
        )
        self.restores = meter.create_counter(
            "brim.restores",
            unit="{restore}",
            description="brim_restore calls answered, by whether the key was still available",
        )
        self.restores_offered = meter.create_counter(
            "brim.restores.offered", unit="{request}", description="Requests offered brim_restore"
        )
        self.added_latency = meter.create_histogram(
            "brim.latency.added", unit="ms", description="Time spent in brim, not the provider"
        )
        self.upstream_latency = meter.create_histogram(
            "brim.latency.upstream", unit="ms", description="Time waiting for the provider"
        )
        self.connections_closed = meter.create_counter(
            "brim.connections.closed",
            unit="{connection}",
            description="Client connections brim closed: header_timeout, body_timeout, "
            "max_connections",
        )
        self.shed = meter.create_counter(
            "brim.requests.shed",
            unit="{request}",
            description="Requests answered 503 at once: max_in_flight, max_body_buffer_mb",
        )
        self.rate_limited = meter.create_counter(
            "brim.requests.rate_limited",
            unit="{request}",
            description="Requests answered 429 by requests_per_minute or tokens_per_minute",
        )

    def watch_load(self, connections: Callable[[], int], in_flight: Callable[[], int]) -> None:
        """Gauges of open client connections and requests being handled."""
        for name, read, unit in (
            ("brim.connections.open", connections, "{connection}"),
            ("brim.requests.in_flight", in_flight, "{request}"),
        ):

            def observe(
                options: CallbackOptions, read: Callable[[], int] = read
            ) -> Iterable[Observation]:
                return [Observation(read())]

            self.meter.create_observable_gauge(name, callbacks=[observe], unit=unit)

    def watch_learned_limits(self, learned: Callable[[], Mapping[str, int]]) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(window, {"model": model}) for model, window in learned().items()]

        self.meter.create_observable_gauge(
            "brim.limits.learned",
            callbacks=[observe],
            unit="{token}",
            description="Context windows learned from providers' overflow errors",
        )


RECENT_EVENTS = 50  # overflow events the status board keeps (the shared list keeps as many)
MODEL_LABELS = 200  # distinct model labels, beyond the configured models, before "other"
OTHER_MODELS = "other"


class ModelLabels:
    """The label a model id gets in metrics and on the status board: its own, or "other".

    Model ids are client input: every distinct one would otherwise be a new time series in
    every metric and a new status-board entry, forever. The configured models (`[models]`) are
    labelled always; any other id gets its own label, first come, while fewer than `cap` have
    been given out, and "other" after that. Ids the limits registry does not know (`known`
    false: made-up or mistyped names) may take only half of the `cap`, so a flood of them cannot
    crowd real models out. So there are at most len(configured) + cap + 1 labels.
    """

    def __init__(self, configured: Iterable[str] = (), *, cap: int = MODEL_LABELS) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"cap must be a non-negative integer, not {cap!r}")
        self.cap = cap
        self.unknown_cap = cap // 2
        self._labels: set[str] = set(configured)
        self._given = 0  # labels given out first come, to known or unknown ids
        self._unknown = 0  # of which to ids the registry does not know

    def __call__(self, model: str, *, known: bool = True) -> str:
        """The label of `model` (called on the event loop only: no lock needed)."""
        if model in self._labels:
            return model
        if self._given >= self.cap or (not known and self._unknown >= self.unknown_cap):
            return OTHER_MODELS
        self._labels.add(model)
        self._given += 1
        self._unknown += not known
        return model

    def __len__(self) -> int:
        return len(self._labels)


@dataclass
class StatusBoard:
    """Totals, recent overflow events and per-model usage since start (for /admin/status).
    Per-model usage is kept by `labels` (one entry per label, so bounded)."""

    started_at: float = field(default_factory=time.time)
    totals: Counter[str] = field(default_factory=Counter)
    models: dict[str, Counter[str]] = field(default_factory=dict)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    labels: ModelLabels = field(default_factory=ModelLabels)
    events: int = 0  # overflow events recorded since start (`recent` holds the last of them)

    def event(self, event: dict[str, Any]) -> None:
        """Record an overflow event (no message bodies: what the audit log writes)."""
        self.recent.append(event)
        self.events += 1

    def events_since(self, seen: int) -> list[dict[str, Any]]:
        """The events recorded after the first `seen` (as many of them as `recent` still
        holds), oldest first."""
        newer = min(self.events - seen, len(self.recent))
        return list(self.recent)[len(self.recent) - newer :] if newer > 0 else []

    def record(
        self, model: str, outcome: str, tokens_in: int, tokens_out: int, *, known: bool = True
    ) -> str:
        """Count a request under its model's label, and return the label (for metrics)."""
        self.totals["requests"] += 1
        self.totals[outcome] += 1
        label = self.labels(model, known=known)
        usage = self.models.setdefault(label, Counter())
        usage["requests"] += 1
        usage[outcome] += 1
        usage["tokens_in"] += tokens_in
        usage["tokens_out"] += tokens_out
        return label

    def record_restores(self, label: str, *, offered: bool, found: int, missing: int) -> None:
        """Count a request's restore offer and the calls it answered, under `label` (from
        `record`): totals and per model, as `restore_offered`, `restored`, `restore_missing`."""
        usage = self.models.setdefault(label, Counter())
        for name, count in (
            ("restore_offered", int(offered)),
            ("restored", found),
            ("restore_missing", missing),
        ):
            if count:
                self.totals[name] += count
                usage[name] += count

    def snapshot(self) -> dict[str, Any]:
        return {
            "uptime_s": round(time.time() - self.started_at, 1),
            "totals": dict(self.totals),
            "models": {model: dict(usage) for model, usage in self.models.items()},
            "recent_events": list(self.recent),
        }
