"""The instruments brim reports through (OpenTelemetry API), and the in-process status board."""

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
        self.added_latency = meter.create_histogram(
            "brim.latency.added", unit="ms", description="Time spent in brim, not the provider"
        )
        self.upstream_latency = meter.create_histogram(
            "brim.latency.upstream", unit="ms", description="Time waiting for the provider"
        )

    def watch_learned_limits(self, learned: Callable[[], Mapping[str, int]]) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(window, {"model": model}) for model, window in learned().items()]

        self.meter.create_observable_gauge(
            "brim.limits.learned",
            callbacks=[observe],
            unit="{token}",
            description="Context windows learned from providers' overflow errors",
        )


@dataclass
class StatusBoard:
    """Totals, recent overflow events and per-model usage since start (for /admin/status)."""

    started_at: float = field(default_factory=time.time)
    totals: Counter[str] = field(default_factory=Counter)
    models: dict[str, Counter[str]] = field(default_factory=dict)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=50))

    def record(self, model: str, outcome: str, tokens_in: int, tokens_out: int) -> None:
        self.totals["requests"] += 1
        self.totals[outcome] += 1
        usage = self.models.setdefault(model, Counter())
        usage["requests"] += 1
        usage[outcome] += 1
        usage["tokens_in"] += tokens_in
        usage["tokens_out"] += tokens_out

    def snapshot(self) -> dict[str, Any]:
        return {
            "uptime_s": round(time.time() - self.started_at, 1),
            "totals": dict(self.totals),
            "models": {model: dict(usage) for model, usage in self.models.items()},
            "recent_events": list(self.recent),
        }
