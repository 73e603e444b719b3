"""The instruments brim reports through (OpenTelemetry API): counters, histograms and gauges,
kept in-process (`Tally`, `Spread`) where every worker's must be summed. The status board is
`middleware.services.status_board`."""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
from opentelemetry.semconv._incubating.metrics.gen_ai_metrics import (
    GEN_AI_CLIENT_OPERATION_DURATION,
    GEN_AI_CLIENT_TOKEN_USAGE,
)
from opentelemetry.trace import Tracer
from opentelemetry.util.types import AttributeValue

log = logging.getLogger("brim.telemetry")

Attributes = tuple[tuple[str, AttributeValue], ...]


class _Series:
    """Values kept per attribute set in this process, for the metric readers to collect: a cell
    (a list of numbers) per series, found by the attributes in the order given, the same
    attributes in another order being the same series. Written on the event loop; readers may
    collect from another thread (they read `_series`, which is replaced, never changed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cells: dict[Attributes, list[float]] = {}
        self._distinct: dict[frozenset[tuple[str, AttributeValue]], list[float]] = {}
        self._series: list[tuple[dict[str, AttributeValue], list[float]]] = []

    def _cell_for(
        self, amount: float, attributes: Mapping[str, AttributeValue] | None
    ) -> list[float] | None:
        """The cell of `attributes`; None (with a warning) for an amount OpenTelemetry refuses:
        a negative or non-finite one."""
        if not 0 <= amount < math.inf:
            log.warning("%s: %r is not a non-negative finite amount, ignored", self.name, amount)
            return None
        key = tuple(attributes.items()) if attributes else ()
        cell = self._cells.get(key)
        if cell is None:
            distinct = frozenset(key)
            cell = self._distinct.get(distinct)
            if cell is None:
                cell = self._distinct[distinct] = self._empty()
                self._series = [*self._series, (dict(key), cell)]
            self._cells[key] = cell
        return cell

    def _empty(self) -> list[float]:
        raise NotImplementedError

    def _count(self, cell: list[float], amount: float) -> None:
        raise NotImplementedError

    def bind(self, attributes: Mapping[str, AttributeValue]) -> Bound:
        """This instrument's series of `attributes`, to count into without finding it again."""
        return Bound(self, attributes)


class Bound:
    """One series of a `Tally` or `Spread` (`_Series.bind`), called with an amount as the
    instrument's `add` or `record` would be: the series is found once, on the first amount
    counted (so it appears then, as with the instrument), and never again."""

    __slots__ = ("_attributes", "_cell", "_series")

    def __init__(self, series: _Series, attributes: Mapping[str, AttributeValue]) -> None:
        self._series = series
        self._attributes = dict(attributes)
        self._cell: list[float] | None = None

    def __call__(self, amount: float) -> None:
        cell = self._cell
        if cell is None or not 0 <= amount < math.inf:
            cell = self._series._cell_for(amount, self._attributes)
            if cell is None:  # refused, with a warning
                return
            self._cell = cell
        self._series._count(cell, amount)


def bind(
    instrument: Histogram | _Series, attributes: Mapping[str, AttributeValue]
) -> Callable[[float], None]:
    """`instrument.add` or `.record` under `attributes`, as a function of the amount: a
    `Bound` series of brim's own instruments, else the SDK instrument's call."""
    if isinstance(instrument, _Series):
        return instrument.bind(attributes)
    fixed = dict(attributes)

    def record(amount: float) -> None:
        instrument.record(amount, fixed)

    return record


class Tally(_Series):
    """A counter kept in this process and read by the metric readers when they collect (an
    OpenTelemetry observable counter of `name`): it exports what a synchronous `Counter` of that
    name would, but `add` is a dict look-up and an addition, where a synchronous counter's cleans,
    copies and hashes its attributes and takes a lock on every call. Called on the event loop;
    the readers may collect from another thread (they read a snapshot)."""

    def __init__(self, meter: Meter, name: str, *, unit: str = "", description: str = "") -> None:
        super().__init__(name)  # each cell: [sum]
        meter.create_observable_counter(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def add(self, amount: float, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """Count `amount` under `attributes` (as `Counter.add`: a negative or non-finite amount
        is refused with a warning)."""
        cell = self._cell_for(amount, attributes)
        if cell is not None:
            cell[0] += amount

    def _count(self, cell: list[float], amount: float) -> None:
        cell[0] += amount

    def _empty(self) -> list[float]:
        return [0]

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(cell[0], attributes) for attributes, cell in self._series]


# OpenTelemetry's default bucket boundaries for an explicit-bucket histogram.
DEFAULT_BOUNDS = (0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000)
# brim's latencies, in seconds: the default boundaries, read as milliseconds.
LATENCY_BOUNDS = (
    0.0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0
)  # fmt: skip
# The boundaries the GenAI semantic conventions give for `gen_ai.client.token.usage` and for
# `gen_ai.client.operation.duration` (seconds).
TOKEN_BOUNDS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864
)  # fmt: skip
DURATION_BOUNDS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SpreadPoint:
    """One series of a `Spread` as it stands: what an explicit-bucket histogram data point
    holds (`buckets[i]` counts the values in (bounds[i-1], bounds[i]], the last above all)."""

    attributes: dict[str, AttributeValue]
    started_ns: int
    count: int
    sum: float
    buckets: list[int]
    min: float
    max: float


class Spread(_Series):
    """A histogram kept in this process: explicit buckets (`bounds`), sum, min and max per
    attribute set, exactly as OpenTelemetry's default histogram aggregation keeps them, for a
    fraction of the cost of a synchronous histogram's `record`. It reaches no reader by itself:
    `proxy.otel_setup` adds its `points` to what the Prometheus reader collects (and keeps a
    synchronous histogram where another reader needs one: see `Telemetry.local_histograms`)."""

    def __init__(
        self,
        name: str,
        *,
        unit: str = "",
        description: str = "",
        bounds: Sequence[float] = DEFAULT_BOUNDS,
    ) -> None:
        super().__init__(name)  # each cell: [count, sum, min, max, started_ns, *buckets]
        self.unit = unit
        self.description = description
        self.bounds = tuple(float(bound) for bound in bounds)
        self._lock = threading.Lock()  # readers may collect from another thread

    def record(self, amount: float, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """Record `amount` under `attributes` (as `Histogram.record`: a negative or non-finite
        amount is refused with a warning)."""
        cell = self._cell_for(amount, attributes)
        if cell is not None:
            self._count(cell, amount)

    def _count(self, cell: list[float], amount: float) -> None:
        bucket = _FIRST_BUCKET + bisect_left(self.bounds, amount)
        with self._lock:
            cell[0] += 1
            cell[1] += amount
            if amount < cell[2]:
                cell[2] = amount
            if amount > cell[3]:
                cell[3] = amount
            cell[bucket] += 1

    def _empty(self) -> list[float]:
        return [0, 0, math.inf, -math.inf, time.time_ns(), *[0] * (len(self.bounds) + 1)]

    def points(self) -> list[SpreadPoint]:
        """Every series recorded so far, as it stands (since the start: cumulative)."""
        points = []
        for attributes, cell in self._series:
            with self._lock:
                held = list(cell)
            points.append(
                SpreadPoint(
                    attributes,
                    int(held[4]),
                    int(held[0]),
                    held[1],
                    [int(n) for n in held[_FIRST_BUCKET:]],
                    held[2],
                    held[3],
                )
            )
        return points


_FIRST_BUCKET = 5


@dataclass
class Telemetry:
    """What brim reports through. `local_histograms`: the histograms are `Spread`s, kept here
    and handed to the Prometheus reader (`proxy.otel_setup`), not the meter's own histograms
    (which every other reader gets)."""

    tracer: Tracer
    meter: Meter
    capture_content: bool = False
    local_histograms: bool = False

    def __post_init__(self) -> None:
        meter = self.meter
        self.requests = Tally(
            meter,
            "brim.requests",
            unit="{request}",
            description="Requests by route, model and outcome",
        )
        self.prevented = Tally(
            meter,
            "brim.overflows.prevented",
            unit="{request}",
            description="Compressed by the guard",
        )
        self.survived = Tally(
            meter,
            "brim.overflows.survived",
            unit="{request}",
            description="Succeeded after a retry",
        )
        self.retries = Tally(meter, "brim.retries", unit="{retry}")
        self.tokens_removed = Tally(
            meter,
            "brim.tokens.removed",
            unit="{token}",
            description="Input tokens removed, by policy",
        )
        self.restores = Tally(
            meter,
            "brim.restores",
            unit="{restore}",
            description="brim_restore calls answered, by whether the key was still available",
        )
        self.restores_offered = Tally(
            meter,
            "brim.restores.offered",
            unit="{request}",
            description="Requests offered brim_restore",
        )
        self.shared_rejected = Tally(
            meter,
            "brim.shared.records.rejected",
            unit="{record}",
            description="Records of shared state (Redis, or the files of a --workers group) read "
            "and not used, by record (restore, summary, learned, forgotten, status, event) and "
            "reason (malformed, mismatch: a restore original not hashing to its key, implausible: "
            "a learned fact outside the registry's bounds)",
        )
        self.added_latency = self._histogram(
            "brim.latency.added", "s", "Time spent in brim, not the provider", LATENCY_BOUNDS
        )
        self.upstream_latency = self._histogram(
            "brim.latency.upstream", "s", "Time waiting for the provider", LATENCY_BOUNDS
        )
        # The GenAI conventions' client metrics (brim is the provider's client), for the
        # dashboards made for them: the tokens of each request, and how long it took.
        self.token_usage = self._histogram(
            GEN_AI_CLIENT_TOKEN_USAGE,
            "{token}",
            "Number of input and output tokens used",
            TOKEN_BOUNDS,
        )
        self.operation_duration = self._histogram(
            GEN_AI_CLIENT_OPERATION_DURATION, "s", "GenAI operation duration", DURATION_BOUNDS
        )
        self.connections_closed = Tally(
            meter,
            "brim.connections.closed",
            unit="{connection}",
            description="Client connections brim closed: header_timeout, body_timeout, "
            "max_connections",
        )
        self.shed = Tally(
            meter,
            "brim.requests.shed",
            unit="{request}",
            description="Requests answered 503 at once: max_in_flight, max_body_buffer_mb",
        )
        self.rate_limited = Tally(
            meter,
            "brim.requests.rate_limited",
            unit="{request}",
            description="Requests answered 429 by requests_per_minute or tokens_per_minute",
        )
        self.learned_refused = Tally(
            meter,
            "brim.learned.refused",
            unit="{fact}",
            description="Facts a provider's overflow error stated that brim did not learn, by "
            "kind (window, output_counts) and reason: unproven (brim's own count of the request "
            "does not bear the error out) or implausible (outside the registry's bounds)",
        )

    def _histogram(
        self, name: str, unit: str, description: str, bounds: Sequence[float]
    ) -> Histogram | Spread:
        if self.local_histograms:
            return Spread(name, unit=unit, description=description, bounds=bounds)
        return self.meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=[float(bound) for bound in bounds],  # as `Spread`
        )

    def spreads(self) -> list[Spread]:
        """The histograms kept here (`local_histograms`), for the reader to collect."""
        histograms = (
            self.added_latency,
            self.upstream_latency,
            self.token_usage,
            self.operation_duration,
        )
        return [h for h in histograms if isinstance(h, Spread)]

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
