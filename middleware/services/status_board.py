"""The in-process status board behind `/admin/status` and the dashboard: totals, per-model usage,
recent overflow events and a time series per (model, client) — summed over every process and
instance by `middleware.services.shared` when they share a Redis."""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("brim.telemetry")


RECENT_EVENTS = 50  # overflow events the status board keeps (the shared list keeps as many)
MODEL_LABELS = 200  # distinct model labels, beyond the configured models, before "other"
OTHER_MODELS = "other"
CLIENT_LABELS = 20  # distinct client labels (a `[clients]` rule's name, or a User-Agent's product)
SERIES_BUCKET_S = 60  # seconds per point of the status board's time series
SERIES_POINTS = 120  # points kept per series: two hours at a minute a point
SERIES_MAX = 32  # (model, client) series kept; more fold into ("other", "other")
# What each point of a series holds, in this order (`Series`).
SERIES_FIELDS = (
    "t",  # the bucket's start, wall-clock seconds (a multiple of the bucket size)
    "requests",
    "usage_sum",  # sum over the requests of tokens sent ÷ context window
    "usage_max",  # the highest of those
    "demand_max",  # the highest tokens received ÷ context window (over 1: it could not fit)
    "prevented",  # compressed by the guard before it overflowed
    "survived",  # succeeded after the provider's own overflow error and a retry
    "refused",  # could not be made to fit: answered 400
    "blocked",  # refused by the loop guard (429)
)
OVERFLOWS = ("prevented", "survived", "refused", "blocked")  # what a request can count as
_T, _REQUESTS, _USAGE_SUM, _USAGE_MAX, _DEMAND_MAX = range(5)
_MAXED = frozenset({_USAGE_MAX, _DEMAND_MAX})  # merged by max; the rest by sum (but `t`)
_FIRST_COUNT = len(SERIES_FIELDS) - len(OVERFLOWS)


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

    def configure(self, configured: Iterable[str]) -> None:
        """Label these (newly configured) ids always, too."""
        self._labels.update(configured)

    def __len__(self) -> int:
        return len(self._labels)


def client_product(user_agent: str) -> str:
    """A User-Agent's product, the label a client without a `[clients]` rule gets:
    `claude-cli/2.0.1 (external, cli)` → `claude-cli`; `-` when there is none."""
    product = _PRODUCTS.get(user_agent)
    if product is None:
        product = _product(user_agent)
        if len(user_agent) <= USER_AGENT_CACHED:
            if len(_PRODUCTS) >= PRODUCTS_CACHED:
                _PRODUCTS.clear()
            _PRODUCTS[user_agent] = product
    return product


def _product(user_agent: str) -> str:
    product = user_agent.split("/", 1)[0].split(" ", 1)[0].strip().lower()[:40]
    return "".join(c for c in product if c.isalnum() or c in "._-") or "-"


# client_product's answers by User-Agent (a client sends the same one on every request).
PRODUCTS_CACHED = 256
USER_AGENT_CACHED = 512  # characters: longer ones are not kept
_PRODUCTS: dict[str, str] = {}


class Series:
    """Context usage and overflow counts over time, per (model label, client label): a ring of
    at most `points` points per series, each a `bucket_s`-second bucket with a request in it
    (`SERIES_FIELDS`). At most `most` series: once `most` − 1 pairs have one, any other pair
    counts under ("other", "other"). Recording is one dict look-up and a few list updates; a
    point is allocated once per bucket and series."""

    def __init__(
        self,
        *,
        bucket_s: int = SERIES_BUCKET_S,
        points: int = SERIES_POINTS,
        most: int = SERIES_MAX,
        timer: Callable[[], float] = time.time,
    ) -> None:
        if bucket_s < 1 or points < 1 or most < 1:
            raise ValueError("bucket_s, points and most must be at least 1")
        self.bucket_s = bucket_s
        self.points = points
        self.most = most
        self._timer = timer
        self._series: dict[tuple[str, str], deque[list[float]]] = {}

    def add(
        self,
        model: str,
        client: str,
        *,
        usage: float | None,
        demand: float | None,
        overflows: Iterable[str] = (),
    ) -> None:
        """Count one request: its usage (tokens sent ÷ window) and demand (tokens received ÷
        window) where known, and what it counts as (`OVERFLOWS`)."""
        key = (model, client)
        ring = self._series.get(key)
        if ring is None and len(self._series) >= self.most - 1:
            key = (OTHER_MODELS, OTHER_MODELS)  # the last one is for ("other", "other")
            ring = self._series.get(key)
        if ring is None:
            ring = self._series[key] = deque(maxlen=self.points)
        start = float(int(self._timer() // self.bucket_s) * self.bucket_s)
        if not ring or ring[-1][_T] != start:
            ring.append([start] + [0.0] * (len(SERIES_FIELDS) - 1))
        point = ring[-1]
        point[_REQUESTS] += 1
        if usage is not None:
            point[_USAGE_SUM] += usage
            if usage > point[_USAGE_MAX]:
                point[_USAGE_MAX] = usage
        if demand is not None and demand > point[_DEMAND_MAX]:
            point[_DEMAND_MAX] = demand
        for overflow in overflows:
            point[_FIRST_COUNT + OVERFLOWS.index(overflow)] += 1

    def __len__(self) -> int:
        return len(self._series)

    def snapshot(self) -> dict[str, Any]:
        """`{"bucket_s", "fields", "series": [{"model", "client", "points": [[…], …]}]}`, the
        points oldest first, as `SERIES_FIELDS` name them (ratios rounded to 4 places)."""
        return {
            "bucket_s": self.bucket_s,
            "fields": list(SERIES_FIELDS),
            "series": [
                {"model": model, "client": client, "points": [_rounded(p) for p in ring]}
                for (model, client), ring in self._series.items()
            ],
        }


def _rounded(point: Sequence[float]) -> list[float | int]:
    return [
        round(value, 4) if i in (_USAGE_SUM, *_MAXED) else int(value)
        for i, value in enumerate(point)
    ]


def merge_series(snapshots: Iterable[Mapping[str, Any]], *, points: int) -> dict[str, Any]:
    """Several instances' `Series.snapshot()`s as one: points of one (model, client) and bucket
    summed (the peaks: the highest), the newest `points` kept per series. Snapshots of another
    bucket size than the first, and malformed entries, are left out."""
    bucket_s: int | None = None
    merged: dict[tuple[str, str], dict[float, list[float]]] = {}
    width = len(SERIES_FIELDS)
    for snapshot in snapshots:
        size = snapshot.get("bucket_s")
        if not isinstance(size, int) or (bucket_s is not None and size != bucket_s):
            continue
        bucket_s = size
        for series in snapshot.get("series") or ():
            if not isinstance(series, dict):
                continue
            key = (str(series.get("model")), str(series.get("client")))
            buckets = merged.setdefault(key, {})
            for point in series.get("points") or ():
                if not _is_point(point, width):
                    continue
                held = buckets.get(point[_T])
                if held is None:
                    buckets[point[_T]] = list(point)
                    continue
                for i in range(1, width):
                    held[i] = max(held[i], point[i]) if i in _MAXED else held[i] + point[i]
    return {
        "bucket_s": bucket_s or SERIES_BUCKET_S,
        "fields": list(SERIES_FIELDS),
        "series": [
            {
                "model": model,
                "client": client,
                "points": [_rounded(buckets[t]) for t in sorted(buckets)[-points:]],
            }
            for (model, client), buckets in merged.items()
        ],
    }


def _is_point(value: Any, width: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == width
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


@dataclass
class StatusBoard:
    """Totals, recent overflow events, per-model usage, tokens removed per policy and the time
    series (`Series`) since start (for /admin/status). Per-model usage is kept by `labels`
    (one entry per label, so bounded); clients by `client_labels`."""

    started_at: float = field(default_factory=time.time)
    # Plain int-defaulting dicts, not Counters: `Counter[k] += 1` is a Python-level
    # `__missing__`-aware call, about four times the cost, and these are counted per request.
    totals: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    models: dict[str, defaultdict[str, int]] = field(default_factory=dict)
    removed: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))  # by policy
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    labels: ModelLabels = field(default_factory=ModelLabels)
    client_labels: ModelLabels = field(default_factory=lambda: ModelLabels(cap=CLIENT_LABELS))
    # The models providers' replies say answered (`gen_ai.response.model`): their own labels,
    # so that what providers send cannot take the labels of the models clients ask for.
    response_labels: ModelLabels = field(default_factory=ModelLabels)
    series: Series = field(default_factory=Series)
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
        self,
        model: str,
        outcome: str,
        tokens_in: int,
        tokens_out: int,
        *,
        known: bool = True,
        client: str = "-",
        window: int | None = None,
        overflows: Sequence[str] = (),
        removed: Mapping[str, int] | None = None,
    ) -> str:
        """Count a request under its model's label, and return the label (for metrics).
        `client` is its `[clients]` rule or User-Agent product (`client_product`), `window` its
        model's context window where resolved, `overflows` what it counts as (`OVERFLOWS`),
        `removed` the input tokens each policy took out of it."""
        totals = self.totals
        totals["requests"] += 1
        totals[outcome] += 1
        label = self.labels(model, known=known)
        usage = self.models.get(label)
        if usage is None:
            usage = self.models[label] = defaultdict(int)
        usage["requests"] += 1
        usage[outcome] += 1
        usage["tokens_in"] += tokens_in
        usage["tokens_out"] += tokens_out
        for overflow in overflows:
            if overflow != outcome:  # "refused" and "blocked" are outcomes too: counted once
                totals[overflow] += 1
                usage[overflow] += 1
        if removed:
            for policy, tokens in removed.items():
                self.removed[policy] += tokens
        self.series.add(
            label,
            self.client_labels(client),
            usage=tokens_out / window if window else None,
            demand=tokens_in / window if window else None,
            overflows=overflows,
        )
        return label

    def record_restores(self, label: str, *, offered: bool, found: int, missing: int) -> None:
        """Count a request's restore offer and the calls it answered, under `label` (from
        `record`): totals and per model, as `restore_offered`, `restored`, `restore_missing`."""
        usage = self.models.get(label)
        if usage is None:
            usage = self.models[label] = defaultdict(int)
        if not (offered or found or missing):
            return
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
            "tokens_removed": dict(self.removed),
            "series": self.series.snapshot(),
            "recent_events": list(self.recent),
        }
