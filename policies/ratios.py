"""Each model's token ratio: how many tokens its provider counts per token of brim's encoding,
learned from the input counts the provider states in its replies — per client.

brim counts offline with tiktoken (`policies.tokens`). For OpenAI's models that is the
provider's own count; for the others it is an estimate — Claude is counted as o200k_base times a
prior factor (`claude_token_factor`), Gemini and any other model as o200k_base itself. Every
reply that carries usage says what the provider counted for the request brim sent, so
`TokenRatios` learns, per owner (the client a request is from), upstream and model, the
provider's count ÷ brim's own count of that request in its encoding (before any factor):

- a reply is evidence only where brim counted the request (`MIN_EVIDENCE` tokens or more: a
  tiny request is mostly the provider's fixed overhead) and its ratio lies within `BOUNDS`
  (an upstream that reports absurd usage teaches nothing); a reply under `FULL_EVIDENCE`
  tokens counts for less;
- an owner's estimate starts at the prior and moves by an exponentially weighted average in
  log space (`SMOOTHING` for a full reply), each reply clipped to `STEP` times the current
  value first, and stays within `BOUNDS` — so five replies of a steady ratio take it to within
  a few per cent of it, and no one reply moves it by more than √`STEP`. It is learned from that
  owner's replies alone;
- it is kept per (owner, upstream, normalised model id): one upstream's replies scale only the
  counts of requests sent to that upstream; an estimate not updated for `TTL_S` is forgotten,
  and past `RATIOS_MAX` estimates the least recently used goes.

Which ratio a request is counted at — the rule that keeps one client from setting it for others
(what a client sends, and what its upstream reports of it, is a fact for that client only):

1. its owner's own estimate, once that owner taught `MIN_REPLIES` replies or more ("settled");
2. else the *shared* ratio: the median of the settled owners' estimates, one vote per owner —
   so one client moves what the others are counted at only if it is most of the model's
   settled clients. Of an even number, the middle one nearer the prior is taken: a client
   that is half of them cannot pull the others away from the prior;
3. else its owner's own estimate however few its replies (its own evidence, for itself);
4. else the prior (the tokenizer's own factor).

Requests are counted at it rounded to `GRAIN`: a ratio that settled moves by less with each
reply, and a session's counts (and what `policies.carry` kept of them) stay put meanwhile.

Models brim counts exactly learn about 1.0, and stay there: the ratio is always taken against
brim's count in its encoding, never against a count already scaled by it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cachetools import TLRUCache

BOUNDS = (0.5, 3.0)  # a learned ratio stays within; a reply outside is no evidence
MIN_EVIDENCE = 256  # tokens brim counted, below which a reply teaches nothing
FULL_EVIDENCE = 4_096  # tokens at which a reply counts fully (fewer: proportionally less)
SMOOTHING = 0.5  # a full reply's weight in the running estimate (in log space)
STEP = 1.5  # a reply's ratio is clipped to within this factor of the current value
TTL_S = 7 * 24 * 3600.0  # a ratio not updated for this long is forgotten
RATIOS_MAX = 4_096  # (owner, upstream, model) estimates kept; the least recently used go first
GRAIN = 2  # decimals of the ratio requests are counted at
MIN_REPLIES = 5  # replies after which an owner's estimate is settled: its own, and a vote

Key = tuple[str, str]  # (upstream name, normalised model id)
OwnedKey = tuple[str, str, str]  # (owner, upstream name, normalised model id)


@dataclass(frozen=True, slots=True)
class Ratio:
    """What one owner's replies taught of one upstream's model: `value` (the provider's count ÷
    brim's), from how many `replies`, last `updated` at this wall-clock time (`time.time()`)."""

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


def median(values: Iterable[float], prior: float) -> float | None:
    """The median of `values` (None if there are none); of an even number, whichever middle
    value lies nearer `prior` in log space (the lower one on a tie)."""
    ordered = sorted(values)
    if not ordered:
        return None
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    low, high = ordered[half - 1], ordered[half]
    return low if abs(math.log(low / prior)) <= abs(math.log(high / prior)) else high


@dataclass(frozen=True, slots=True)
class Votes:
    """What the owners taught of one upstream's model: the `settled` owners' estimates, in
    order (their votes), how many `owners` taught any and with how many `replies` in all,
    the `latest` update, and `until` when these stand (the oldest estimate is forgotten then)."""

    settled: tuple[float, ...]
    owners: int
    replies: int
    latest: float
    until: float

    def shared(self, prior: float) -> float | None:
        """The shared ratio (module doc): the settled owners' median; None if none settled."""
        return median(self.settled, prior)


@dataclass(frozen=True, slots=True)
class Shared:
    """What is shown of one upstream's model — never which owners taught it: the shared
    `value` (None until an owner settled), from how many `owners` and how many of them
    `settled`, their `replies` in all, last `updated` at this wall-clock time."""

    value: float | None
    owners: int
    settled: int
    replies: int
    updated: float


def _until(key: OwnedKey, ratio: Ratio, now: float) -> float:
    return ratio.updated + TTL_S


class TokenRatios:
    """The learned ratios of this process (and, through `middleware.services.shared`, of every brim
    on the same Redis), per owner, upstream and model, and the shared ratio of each upstream's
    model (module doc). Looking up does no I/O; thread-safe enough for its use: each operation
    runs on the event loop without awaiting."""

    def __init__(self, *, timer: Callable[[], float] = time.time) -> None:
        self._timer = timer
        self._held: TLRUCache[OwnedKey, Ratio] = TLRUCache(
            maxsize=RATIOS_MAX, ttu=_until, timer=timer
        )
        # Who taught each model: an index into `_held`, which may have dropped some since
        # (they are left out, and the index rebuilt, as they are found).
        self._owners: dict[Key, set[str]] = {}
        self._indexed = 0  # owners named in `_owners`, over all models
        self._votes: dict[Key, Votes] = {}  # each model's, until `_held` changes

    def ratio(self, owner: str, upstream: str, model: str, prior: float) -> float:
        """The ratio to count `owner`'s requests for `model` to `upstream` with (module doc),
        to `GRAIN`: its own settled estimate, else the shared ratio, else its own estimate,
        else `prior` (the tokenizer's own factor)."""
        own = self._held.get((owner, upstream, model))
        if own is not None and own.replies >= MIN_REPLIES:
            return round(own.value, GRAIN)
        shared = self._voted(upstream, model).shared(prior)
        if shared is None:
            shared = prior if own is None else own.value
        return round(shared, GRAIN)

    def get(self, owner: str, upstream: str, model: str) -> Ratio | None:
        """`owner`'s own estimate for `model` on `upstream`."""
        return self._held.get((owner, upstream, model))

    def shared(self, upstream: str, model: str, prior: float) -> Shared | None:
        """What the owners taught of `model` on `upstream`, as it may be shown (None: nothing)."""
        votes = self._voted(upstream, model)
        if not votes.owners:
            return None
        return Shared(
            votes.shared(prior), votes.owners, len(votes.settled), votes.replies, votes.latest
        )

    def models(self) -> list[Key]:
        """Each (upstream, model) some owner taught, in order."""
        return sorted({(upstream, model) for _, upstream, model in self._held})

    def observe(
        self, owner: str, upstream: str, model: str, prior: float, counted: int, reported: int
    ) -> Ratio | None:
        """Learn from one reply to `owner`: the provider counted `reported` input tokens for a
        request brim counted `counted` tokens of (in its encoding). Returns the owner's new
        estimate, or None if the reply was no evidence (`evidence`)."""
        shown = evidence(counted, reported)
        if shown is None:
            return None
        held = self._held.get((owner, upstream, model))
        current = prior if held is None else held.value
        learned = Ratio(
            updated(min(max(current, BOUNDS[0]), BOUNDS[1]), shown, counted),
            1 if held is None else held.replies + 1,
            self._timer(),
        )
        self._keep((owner, upstream, model), learned)
        return learned

    def adopt(self, owner: str, upstream: str, model: str, ratio: Ratio) -> bool:
        """Keep an estimate learned elsewhere if it is valid and newer than the one held (the
        later learning wins). Returns whether it was kept."""
        key = (owner, upstream, model)
        held = self._held.get(key)
        if not ratio.valid(self._timer()) or (held is not None and held.updated >= ratio.updated):
            return False
        self._keep(key, ratio)
        return True

    def learned(self) -> dict[OwnedKey, Ratio]:
        """Every estimate held and not forgotten."""
        return dict(self._held.items())

    def _keep(self, key: OwnedKey, ratio: Ratio) -> None:
        owner, upstream, model = key
        if key not in self._held and len(self._held) >= RATIOS_MAX:
            self._votes.clear()  # one estimate is dropped to make room: whose votes, unknown
        self._held[key] = ratio
        self._votes.pop((upstream, model), None)
        owners = self._owners.setdefault((upstream, model), set())
        if owner not in owners:
            owners.add(owner)
            self._indexed += 1
            if self._indexed > 2 * RATIOS_MAX:  # names dropped estimates mostly: rebuilt
                self._reindex()

    def _reindex(self) -> None:
        self._owners = {}
        for owner, upstream, model in self._held:
            self._owners.setdefault((upstream, model), set()).add(owner)
        self._indexed = sum(len(owners) for owners in self._owners.values())

    def _voted(self, upstream: str, model: str) -> Votes:
        """The votes on `model` at `upstream`, as remembered or counted afresh (and then
        remembered, if any owner taught it: a model no one taught is client input)."""
        key = (upstream, model)
        now = self._timer()
        votes = self._votes.get(key)
        if votes is not None and now < votes.until:
            return votes
        named = self._owners.get(key, set())
        held = {
            owner: ratio
            for owner in named
            if (ratio := self._held.get((owner, upstream, model))) is not None
        }
        if len(held) < len(named):  # some were dropped since: the index names only the rest
            self._indexed -= len(named) - len(held)
            if held:
                self._owners[key] = set(held)
            else:
                self._owners.pop(key, None)
        ratios = held.values()
        votes = Votes(
            tuple(sorted(ratio.value for ratio in ratios if ratio.replies >= MIN_REPLIES)),
            len(held),
            sum(ratio.replies for ratio in ratios),
            max((ratio.updated for ratio in ratios), default=0.0),
            min((ratio.updated + TTL_S for ratio in ratios), default=math.inf),
        )
        if held:
            self._votes[key] = votes
        return votes
