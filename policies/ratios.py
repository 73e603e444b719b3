"""Each model's token ratio: how many tokens its provider counts per token of brim's encoding,
learned from the input counts the provider states in its replies.

brim counts offline with tiktoken (`policies.tokens`). For OpenAI's models that is the
provider's own count; for the others it is an estimate — Claude is counted as o200k_base times a
prior factor (`claude_token_factor`), Gemini and any other model as o200k_base itself. Every
reply that carries usage says what the provider counted for the request brim sent, so
`TokenRatios` learns, per upstream and model, the provider's count ÷ brim's own count of that
request in its encoding (before any factor), and brim scales its counts by what it learned:

- a reply is evidence only where brim counted the request (`MIN_EVIDENCE` tokens or more: a
  tiny request is mostly the provider's fixed overhead) and its ratio lies within `BOUNDS`
  (an upstream that reports absurd usage teaches nothing); a reply under `FULL_EVIDENCE`
  tokens counts for less;
- the estimate moves by an exponentially weighted average in log space (`SMOOTHING` for a full
  reply), each reply clipped to `STEP` times the current value first, and stays within
  `BOUNDS` — so five replies of a steady ratio take it to within a few per cent of it, and no
  one reply moves it by more than √`STEP`;
- it is kept per (upstream, normalised model id): one upstream's replies scale only the counts
  of requests sent to that upstream; a ratio not heard of for `TTL_S` is forgotten;
- requests are counted at it rounded to `GRAIN`: a ratio that settled moves by less with each
  reply, and a session's counts (and what `policies.carry` kept of them) stay put meanwhile.

Models brim counts exactly learn about 1.0, and stay there: the ratio is always taken against
brim's count in its encoding, never against a count already scaled by it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TLRUCache

BOUNDS = (0.5, 3.0)  # a learned ratio stays within; a reply outside is no evidence
MIN_EVIDENCE = 256  # tokens brim counted, below which a reply teaches nothing
FULL_EVIDENCE = 4_096  # tokens at which a reply counts fully (fewer: proportionally less)
SMOOTHING = 0.5  # a full reply's weight in the running estimate (in log space)
STEP = 1.5  # a reply's ratio is clipped to within this factor of the current value
TTL_S = 7 * 24 * 3600.0  # a ratio not updated for this long is forgotten
RATIOS_MAX = 4_096  # (upstream, model) pairs kept; the least recently updated go first
GRAIN = 2  # decimals of the ratio requests are counted at

Key = tuple[str, str]  # (upstream name, normalised model id)


@dataclass(frozen=True, slots=True)
class Ratio:
    """What was learned of one upstream's model: `value` (the provider's count ÷ brim's), from
    how many `replies`, last `updated` at this wall-clock time (`time.time()`)."""

    value: float
    replies: int
    updated: float

    def valid(self, now: float) -> bool:
        """Whether this could have been learned by `TokenRatios` and is not forgotten: a ratio
        within `BOUNDS`, at least one reply, updated within `TTL_S` and not in the future
        (beyond a minute of clock skew). A ratio read from elsewhere is checked so."""
        low, high = BOUNDS
        return (
            math.isfinite(self.value)
            and low <= self.value <= high
            and self.replies >= 1
            and math.isfinite(self.updated)
            and now - TTL_S < self.updated <= now + 60
        )


def evidence(counted: int, reported: int) -> float | None:
    """The ratio one reply shows — the provider's `reported` input tokens ÷ brim's `counted`
    tokens of the request, in brim's encoding — or None where it is no evidence: brim counted
    fewer than `MIN_EVIDENCE` tokens, or the ratio lies outside `BOUNDS`."""
    if counted < MIN_EVIDENCE or reported <= 0:
        return None
    ratio = reported / counted
    low, high = BOUNDS
    return ratio if low <= ratio <= high else None


def may_be_evidence(bound: int, reported: int) -> bool:
    """Whether a reply of `reported` input tokens, for a request brim's count of which is at
    most `bound` (`TokenCounter.upper_bound`: no tokenizing), can be `evidence` at all — so
    that a request that cannot teach anything is not counted to find out."""
    low, high = BOUNDS
    return bound >= MIN_EVIDENCE and reported >= MIN_EVIDENCE * low and reported <= bound * high


def updated(current: float, shown: float, counted: int) -> float:
    """The running estimate after a reply that showed ratio `shown` for `counted` tokens."""
    low, high = BOUNDS
    clipped = min(max(shown, current / STEP), current * STEP)
    weight = SMOOTHING * min(1.0, counted / FULL_EVIDENCE)
    moved = math.exp(math.log(current) + weight * (math.log(clipped) - math.log(current)))
    return min(max(moved, low), high)


def _until(key: Key, ratio: Ratio, now: float) -> float:
    return ratio.updated + TTL_S


class TokenRatios:
    """The learned ratios of this process (and, through `middleware.services.shared`, of every brim
    on the same Redis). Looking up does no I/O; thread-safe enough for its use: each operation is
    one dictionary read or write on the event loop."""

    def __init__(self, *, timer: Callable[[], float] = time.time) -> None:
        self._timer = timer
        self._held: TLRUCache[Key, Ratio] = TLRUCache(maxsize=RATIOS_MAX, ttu=_until, timer=timer)

    def ratio(self, upstream: str, model: str, prior: float) -> float:
        """The ratio to count `model`'s requests to `upstream` with: the learned one (to
        `GRAIN`), else `prior` (the tokenizer's own factor)."""
        held = self._held.get((upstream, model))
        return prior if held is None else round(held.value, GRAIN)

    def get(self, upstream: str, model: str) -> Ratio | None:
        return self._held.get((upstream, model))

    def observe(
        self, upstream: str, model: str, prior: float, counted: int, reported: int
    ) -> Ratio | None:
        """Learn from one reply: the provider counted `reported` input tokens for a request
        brim counted `counted` tokens of (in its encoding). Returns the new ratio, or None if
        the reply was no evidence (`evidence`)."""
        shown = evidence(counted, reported)
        if shown is None:
            return None
        key = (upstream, model)
        held = self._held.get(key)
        current = prior if held is None else held.value
        learned = Ratio(
            updated(min(max(current, BOUNDS[0]), BOUNDS[1]), shown, counted),
            1 if held is None else held.replies + 1,
            self._timer(),
        )
        self._held[key] = learned
        return learned

    def adopt(self, upstream: str, model: str, ratio: Ratio) -> bool:
        """Keep a ratio learned elsewhere if it is valid and newer than the one held (the
        later learning wins). Returns whether it was kept."""
        key = (upstream, model)
        held = self._held.get(key)
        if not ratio.valid(self._timer()) or (held is not None and held.updated >= ratio.updated):
            return False
        self._held[key] = ratio
        return True

    def learned(self) -> dict[Key, Ratio]:
        """Every ratio held and not forgotten."""
        return dict(self._held.items())
