"""State that several brim processes and instances share through Redis (`[cache] url`), each
piece with a local fallback, and the one Redis connection every shared structure uses.

`RedisLink` is that connection — one client per app — and its one outage policy: a call that
fails marks Redis down and raises `Unavailable` (never anything else); while it is down, calls
raise `Unavailable` at once, without waiting, and one call in `retry_s` tries it again (only one
at a time); the first failure of an outage logs one warning and the first success after it one
line at info, then runs the recovery hooks (the restore store writes what it kept meanwhile).
The restore store (`middleware.services.store.RedisStore`) and the summary cache
(`middleware.services.summarize.RedisCache`) use it too.

`SharedState` is what the pipeline and `/admin/status` share. `LocalState` is one process on
its own, exactly as brim runs without Redis; `RedisState` shares through Redis and keeps a
`LocalState` that serves whenever Redis does not answer:

- learned limits (`LimitsRegistry`, kept in step by `middleware.services.learned.SharedLimits`): a
  fact learned here is written at once (off the request path) to `brim:learned:{window,
  output_counts}` (hashes: normalised model id → "value until"), and every `refresh_s` each
  process reads them back, adopts what is newer than its own (`LimitsRegistry.adopt`; a record
  that is malformed or that the registry rejects is skipped, removed and counted) and writes
  what Redis lacks (learned while it was down, or lost with a Redis restart). A request only
  reads the registry in memory: another instance's fact takes effect here within `refresh_s`
  (plus one write). Facts expire when learned + a day, everywhere. `brim limits forget` leaves
  a tombstone in `brim:learned:forgotten`: every process drops what it learned by then.
- token ratios (`TokenRatios`): every `refresh_s` each process reads `brim:ratios` (a hash:
  `["owner","upstream","model"]` → "ratio replies updated", one client's estimate), adopts each
  estimate learned later than its own, and writes those it learned later than what Redis holds
  (`SharedRatios`). What it reads is checked first (`Ratio.valid`: within the bounds, not from
  the future, not forgotten; an owner as brim names them; an upstream this brim has; a model id
  of sane length): Redis is no more trusted than a reply. Each process takes the shared ratio
  (the median over the settled owners, `policies.ratios`) of what it holds.
- loop-guard counts (`RedisLoops`): see its docstring for the exact semantics.
- the status board's numbers: every `refresh_s` each process writes its own totals,
  per-model usage, tokens removed per policy and time series (`brim:status:instance:<id>`,
  expiring after `instance_ttl_s`, listed in the sorted set `brim:status:instances` by when it
  last wrote) and pushes its new overflow events onto one capped list (`brim:status:events`, the
  last 50); `/admin/status` sums this process's live numbers and the other live instances'
  last writes (the series point by point), and merges the events by time. A record that is not
  one brim writes is left out and counted, never raised.

Keys hold no secrets and no message bodies: loop counts are keyed by a hash of the request, the
rest by model id or a random instance id; every key expires.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from cachetools import TTLCache

from brim.adapters.exchange import OWNER_PATTERN
from brim.middleware.services.learned import (
    ALL_MODELS,
    MODEL_ID_MAX,
    WORKER_REFRESH_S,
    Forgotten,
    Records,
    SharedLimits,
    WorkerFiles,
    WorkerGroup,
    encode,
    warn_once,
)
from brim.middleware.services.status_board import RECENT_EVENTS, StatusBoard, merge_series
from brim.policies.limits import LEARNED_KINDS, Learned, LearnedKind, LimitsRegistry
from brim.policies.ratios import RATIOS_MAX, TTL_S, OwnedKey, Ratio, TokenRatios

log = logging.getLogger("brim.shared")
T = TypeVar("T")
Operation = Callable[[Any], Awaitable[T]]  # given the Redis client

MAX_BACKGROUND = 1_000  # writes off the request path in flight at once; more are dropped
LEARNED_KEY = "brim:learned:"  # + kind
FORGOTTEN_KEY = "brim:learned:forgotten"  # the tombstones of `brim limits forget`
RATIOS_KEY = "brim:ratios"
LOOP_KEY = "brim:loop:"  # + the request's hash, in hex
BLOCKED_KEY = "brim:loop:blocked"  # sorted set: request hash → when its block lifts
BLOCKED_MAX = 10_000
BLOCKED_SHOWN = 20  # blocked requests /admin/status lists
INSTANCES_KEY = "brim:status:instances"  # sorted set: instance id → when it last wrote
INSTANCE_KEY = "brim:status:instance:"  # + instance id
EVENTS_KEY = "brim:status:events"
EVENTS_TTL_S = 24 * 3600
INSTANCE_TTL_S = 30.0  # an instance not heard of for this long (or 5 refreshes) is left out
INSTANCES_HORIZON_S = 3600  # ids listed in `brim:status:instances` for at most this long


class Unavailable(Exception):
    """Redis cannot serve this call: it is down (and not due for a retry), or the call failed."""


class RedisLink:
    """One Redis client and the outage policy every shared structure follows (module doc)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        retry_s: float = 5.0,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError, TimeoutError

        # One quick retry (a pooled connection that died with a Redis restart), no backoff:
        # a request must not wait for a Redis that is down.
        self.client: Any = redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
        self._outage = (ConnectionError, TimeoutError, OSError)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._timer = timer
        self._down = False
        self._retry_at = 0.0
        self._probing = False
        self._recovery: list[Callable[[], Awaitable[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusals: set[str] = set()  # kinds of refusal logged already (bounded: types)

    @property
    def down(self) -> bool:
        return self._down

    def usable(self) -> bool:
        """Whether a call now would be sent to Redis (it is up, or due for a retry)."""
        return not self._down or (not self._probing and self._timer() >= self._retry_at)

    def on_recovery(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` (in the background) whenever Redis answers again after an outage."""
        self._recovery.append(hook)

    async def run(self, operation: Operation[T]) -> T:
        """`operation(client)`'s result; `Unavailable` if Redis is down or the call fails."""
        probe = self._down
        if probe and not self.usable():
            raise Unavailable
        self._probing = self._probing or probe
        try:
            result = await operation(self.client)
        except self._outage as error:
            self._failed(error)
            raise Unavailable from error
        except Exception as error:  # Redis answered but refused, or a bug: that call only
            self._refused(error)
            raise Unavailable from error
        finally:
            if probe:
                self._probing = False
        self._succeeded()
        return result

    def spawn(self, operation: Operation[object]) -> None:
        """Run `operation` off the request path: its failure is the outage policy's (nothing
        raises); dropped when Redis is down, outside an event loop, or too many are pending."""
        if self.usable() and len(self._tasks) < MAX_BACKGROUND:
            self._background(self.run(operation))

    def background(self, work: Callable[[], Awaitable[object]]) -> None:
        """Run `work` (which calls `run` itself) off the request path, as `spawn` does."""
        if self.usable() and len(self._tasks) < MAX_BACKGROUND:
            self._background(work())

    def _background(self, work: Awaitable[object]) -> None:
        async def quietly() -> None:
            try:
                await work
            except Unavailable:
                pass
            except Exception:
                log.exception("a background Redis task failed")

        try:
            task = asyncio.get_running_loop().create_task(quietly())
        except RuntimeError:  # no loop: not shared now (the next sync catches up)
            if asyncio.iscoroutine(work):
                work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait until the writes off the request path are done (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _failed(self, error: BaseException) -> None:
        self._retry_at = self._timer() + self.retry_s
        if not self._down:
            self._down = True
            log.warning(
                "Redis ([cache] url) is unreachable (%s: %s); this process goes on with its own "
                "learned limits, loop counts, status, summaries and restore store, and tries "
                "again every %g s",
                type(error).__name__,
                error,
                self.retry_s,
            )

    def _refused(self, error: Exception) -> None:
        kind = type(error).__name__
        if kind not in self._refusals:
            self._refusals.add(kind)
            log.warning("a Redis command failed (%s: %s); logged once per kind", kind, error)

    def _succeeded(self) -> None:
        if not self._down:
            return
        self._down = False
        log.info("Redis is reachable again; brim shares its state through it again")
        for hook in self._recovery:
            self._background(hook())

    async def aclose(self) -> None:
        if self._tasks:  # let the last writes land, briefly
            await asyncio.wait(list(self._tasks), timeout=self.timeout_s)
        for task in list(self._tasks):
            task.cancel()
        try:
            await self.client.aclose()
        except Exception:
            log.debug("closing the Redis client failed", exc_info=True)


# --- the loop guard's counts -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failures:
    """How often a request failed in a row, and in how many seconds that is forgotten."""

    count: int
    lifts_in_s: float


NO_FAILURES = Failures(0, 0.0)


class LoopCounts(Protocol):
    """Failures of identical requests (`key`: a hash of the request), for `LoopBreaker`."""

    async def failures(self, key: bytes) -> Failures:
        """The failures of `key` so far (before it is sent)."""

    async def failed(self, key: bytes) -> Failures:
        """Count one more failure of `key`; the count is forgotten `window_s` after it."""

    def succeeded(self, key: bytes) -> None:
        """`key` succeeded: its count starts again."""

    def holding(self) -> bool:
        """Whether any count may be held now. While none is, every request has no failures and
        a success clears nothing: `LoopBreaker` then need not hash the request at all."""

    def blocked(self, limit: int, *, most: int = BLOCKED_SHOWN) -> list[tuple[bytes, Failures]]:
        """The requests with at least `limit` failures held now (those the loop guard refuses),
        the longest-held first, at most `most`."""


class LocalLoops:
    """Counts in this process: `window_s` after the last failure a count is forgotten."""

    def __init__(
        self, window_s: float, *, timer: Callable[[], float] = time.monotonic, size: int = 50_000
    ) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._timer = timer
        # key → (failures, when the count is forgotten)
        self._counts: TTLCache[bytes, tuple[int, float]] = TTLCache(
            maxsize=size, ttl=window_s, timer=timer
        )
        self._held_until = -math.inf  # when the longest-held count is forgotten at the latest

    def peek(self, key: bytes) -> Failures | None:
        """The count held for `key`, or None if none is."""
        held = self._counts.get(key)
        if held is None:
            return None
        left = held[1] - self._timer()
        return Failures(held[0], left) if left > 0 else None

    def hold(self, key: bytes, count: int, lifts_in_s: float) -> Failures:
        """Hold `count` for `key` (as Redis has it), forgotten in `lifts_in_s`."""
        lifts_in_s = min(lifts_in_s, self.window_s)
        until = self._timer() + lifts_in_s
        self._counts[key] = (count, until)
        self._held_until = max(self._held_until, until)
        return Failures(count, lifts_in_s)

    def forget(self, key: bytes) -> bool:
        return self._counts.pop(key, None) is not None

    async def failures(self, key: bytes) -> Failures:
        return self.peek(key) or NO_FAILURES

    async def failed(self, key: bytes) -> Failures:
        held = self.peek(key) or NO_FAILURES
        return self.hold(key, held.count + 1, self.window_s)

    def succeeded(self, key: bytes) -> None:
        self.forget(key)

    def holding(self) -> bool:
        # One clock read while nothing has failed for a window; else the cache says (it drops
        # what has lifted first).
        return self._timer() < self._held_until and len(self._counts) > 0

    def blocked(self, limit: int, *, most: int = BLOCKED_SHOWN) -> list[tuple[bytes, Failures]]:
        held = [(key, self.peek(key)) for key in list(self._counts)]
        over = [(key, f) for key, f in held if f is not None and f.count >= limit]
        over.sort(key=lambda pair: pair[1].lifts_in_s, reverse=True)
        return over[:most]


class RedisLoops:
    """Counts shared by every instance on the Redis (`brim:loop:<hash>`, INCR and PEXPIRE
    `window_s` in one transaction), held locally too. Exactly:

    - a failure is counted in Redis before its error goes back to the client (one round trip on
      failed requests only), so failures split over instances add up exactly, and the instance
      that counted the `limit`-th failure refuses the next one at once;
    - a request that this instance knows to have failed (it failed here, or it is blocked — the
      blocked ones, `brim:loop:blocked`, are read every `refresh_s`) asks Redis for the shared
      count first (one GET); any other request does not touch Redis. So an instance that has
      never seen a request fail sends it on until it reads the block (within `refresh_s`) or
      sees it fail once — at most one call too many per such instance;
    - a success clears the count everywhere when the instance that served it knew of the
      failures; otherwise the count still lifts `window_s` after the last failure.

    While Redis is down each instance counts alone (`local`), as without Redis.
    """

    def __init__(self, link: RedisLink, local: LocalLoops, limit: int) -> None:
        self.link = link
        self.local = local
        self.limit = limit
        self._window_ms = max(1, int(local.window_s * 1000))

    @staticmethod
    def _name(key: bytes) -> str:
        return f"{LOOP_KEY}{key.hex()}"

    async def failures(self, key: bytes) -> Failures:
        held = self.local.peek(key)
        if held is None:  # not known to have failed: no round trip
            return NO_FAILURES
        name = self._name(key)

        async def read(client: Any) -> list[Any]:
            return list(await client.pipeline(transaction=False).get(name).pttl(name).execute())

        try:
            count, pttl = await self.link.run(read)
        except Unavailable:
            return held
        if not count or int(pttl) <= 0:  # cleared, or lifted, everywhere
            self.local.forget(key)
            return NO_FAILURES
        return self.local.hold(key, int(count), int(pttl) / 1000)

    async def failed(self, key: bytes) -> Failures:
        held = await self.local.failed(key)  # counted here too, in case Redis does not answer
        name = self._name(key)

        async def count(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=True).incr(name).pexpire(name, self._window_ms)
            return list(await pipe.execute())

        try:
            shared, _ = await self.link.run(count)
        except Unavailable:
            return held
        if int(shared) >= self.limit:
            self.link.spawn(self._block(key))
        return self.local.hold(key, int(shared), self.local.window_s)

    def _block(self, key: bytes) -> Operation[object]:
        async def block(client: Any) -> object:
            now = time.time()
            pipe = client.pipeline(transaction=False)
            pipe.zadd(BLOCKED_KEY, {key.hex(): now + self.local.window_s})
            pipe.zremrangebyscore(BLOCKED_KEY, "-inf", now)
            pipe.zremrangebyrank(BLOCKED_KEY, 0, -BLOCKED_MAX - 1)
            pipe.expire(BLOCKED_KEY, max(1, int(self.local.window_s) + 1))
            return await pipe.execute()

        return block

    def succeeded(self, key: bytes) -> None:
        if self.local.forget(key):
            name, member = self._name(key), key.hex()
            self.link.spawn(
                lambda client: (
                    client.pipeline(transaction=False)
                    .delete(name)
                    .zrem(BLOCKED_KEY, member)
                    .execute()
                )
            )

    def holding(self) -> bool:
        """Whether this instance holds a count: a request it holds none for never reaches Redis
        (see above), so none does while it holds none."""
        return self.local.holding()

    def blocked(self, limit: int, *, most: int = BLOCKED_SHOWN) -> list[tuple[bytes, Failures]]:
        """Those held here: blocked here, or anywhere as of the last `pull`."""
        return self.local.blocked(limit, most=most)

    async def pull(self) -> None:
        """Hold the requests blocked anywhere (so their next try here asks Redis first)."""
        now = time.time()
        blocked = await self.link.run(
            lambda client: client.zrangebyscore(BLOCKED_KEY, now, "+inf", withscores=True)
        )
        for member, until in blocked:
            try:
                key = bytes.fromhex(member.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                continue
            held = self.local.peek(key)
            if held is None or held.count < self.limit:
                self.local.hold(key, self.limit, float(until) - now)


# --- learned limits ----------------------------------------------------------------------------


class RedisFacts:
    """The learned facts of every instance on the Redis (`middleware.services.learned` says how they
    are kept in step): `brim:learned:{window,output_counts}` (hashes: model id → "value until") and
    the tombstones `brim:learned:forgotten` (model id or "*" → when forgotten)."""

    shared_with = "instances"

    def __init__(self, link: RedisLink) -> None:
        self.link = link

    async def read(self) -> Records:
        async def read(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for kind in LEARNED_KINDS:
                pipe.hgetall(f"{LEARNED_KEY}{kind}")
            pipe.hgetall(FORGOTTEN_KEY)
            return list(await pipe.execute())

        *tables, forgotten = await self.link.run(read)
        return Records(dict(zip(LEARNED_KINDS, tables, strict=True)), forgotten)

    async def write(
        self,
        facts: Iterable[Learned],
        stale: Iterable[tuple[LearnedKind, bytes | str]],
        forgotten: Mapping[str, float],
        *,
        ttl_s: float,
    ) -> None:
        ttl = max(1, int(ttl_s))

        async def write(client: Any) -> object:
            pipe = client.pipeline(transaction=False)
            for fact in facts:
                pipe.hset(f"{LEARNED_KEY}{fact.kind}", fact.model, encode(fact))
                pipe.expire(f"{LEARNED_KEY}{fact.kind}", ttl)
            for kind, field in stale:
                pipe.hdel(f"{LEARNED_KEY}{kind}", field)
            if forgotten:
                pipe.hset(FORGOTTEN_KEY, mapping={k: repr(at) for k, at in forgotten.items()})
                pipe.expire(FORGOTTEN_KEY, ttl)
            return await pipe.execute()

        await self.link.run(write)

    async def forget(self, model: str | None, at: float, *, ttl_s: float) -> None:
        async def forget(client: Any) -> object:
            pipe = client.pipeline(transaction=True)
            for kind in LEARNED_KINDS:
                if model is None:
                    pipe.delete(f"{LEARNED_KEY}{kind}")
                else:
                    pipe.hdel(f"{LEARNED_KEY}{kind}", model)
            pipe.hset(FORGOTTEN_KEY, model or ALL_MODELS, repr(at))
            pipe.expire(FORGOTTEN_KEY, max(1, int(ttl_s)))
            return await pipe.execute()

        await self.link.run(forget)


# --- token ratios ------------------------------------------------------------------------------


class SharedRatios:
    """The token ratios of `ratios`, shared (module doc): those of `upstreams` only."""

    def __init__(self, link: RedisLink, ratios: TokenRatios, upstreams: Iterable[str]) -> None:
        self.link = link
        self.ratios = ratios
        self.upstreams = frozenset(upstreams)

    async def pull(self) -> tuple[dict[OwnedKey, float], list[bytes]]:
        """Adopt what Redis holds that is newer. Returns when each estimate Redis holds (for
        this brim's upstreams) was updated, and the fields that hold no valid estimate."""
        table = await self.link.run(lambda client: client.hgetall(RATIOS_KEY))
        now = time.time()
        held: dict[OwnedKey, float] = {}
        found: list[tuple[OwnedKey, Ratio]] = []
        stale: list[bytes] = []
        for field, value in table.items():
            parsed = _parsed_ratio(field, value)
            if parsed is None or not parsed[1].valid(now):
                stale.append(field)
            elif parsed[0][1] in self.upstreams:  # another configuration's upstream: not ours
                found.append(parsed)
        found.sort(key=lambda pair: pair[1].updated, reverse=True)
        for key, ratio in found[:RATIOS_MAX]:
            held[key] = ratio.updated
            self.ratios.adopt(*key, ratio)
        return held, stale

    async def sync(self) -> None:
        """`pull`; then write what is newer here, and drop what is not an estimate at all, or
        forgotten."""
        held, stale = await self.pull()
        newer = [
            (key, ratio)
            for key, ratio in self.ratios.learned().items()
            if held.get(key, 0.0) < ratio.updated and len(key[2]) <= MODEL_ID_MAX
        ]
        if not newer and not stale:
            return

        async def write(client: Any) -> object:
            pipe = client.pipeline(transaction=False)
            for key, ratio in newer:
                pipe.hset(
                    RATIOS_KEY,
                    orjson.dumps(key),
                    f"{ratio.value!r} {ratio.replies} {ratio.updated!r}",
                )
            if stale:
                pipe.hdel(RATIOS_KEY, *stale)
            pipe.expire(RATIOS_KEY, int(TTL_S))
            return await pipe.execute()

        await self.link.run(write)


def _parsed_ratio(field: bytes, value: bytes) -> tuple[OwnedKey, Ratio] | None:
    """A `brim:ratios` entry, or None if it is not one brim writes (one of an earlier brim's,
    keyed by upstream and model alone, included)."""
    try:
        key = orjson.loads(field)
        number, replies, updated = value.decode("ascii").split()
        ratio = Ratio(float(number), int(replies), float(updated))
    except (orjson.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None
    if (
        not isinstance(key, list)
        or len(key) != 3
        or not all(isinstance(part, str) for part in key)
        or OWNER_PATTERN.fullmatch(key[0]) is None
        or len(key[2]) > MODEL_ID_MAX
    ):
        return None
    return (key[0], key[1], key[2]), ratio


# --- the status board ---------------------------------------------------------------------------


class SharedStatus:
    """A `StatusBoard`'s numbers, written for the others and summed with theirs (module doc)."""

    def __init__(
        self,
        link: RedisLink,
        board: StatusBoard,
        instance: str,
        ttl_s: float,
        *,
        rejected: Callable[[str, str], None] | None = None,
    ) -> None:
        """`rejected(record, reason)` hears of each record read that was malformed (record
        "status" or "event", reason "malformed"): it is left out of the sums, never raised."""
        self.link = link
        self.board = board
        self.instance = instance
        self.ttl_s = ttl_s
        self._rejected = rejected
        self._pushed = 0  # events on the shared list
        self._identity = {"host": socket.gethostname(), "pid": os.getpid()}

    async def push(self) -> None:
        """Write this process's numbers, and its events not pushed yet."""
        board = self.board
        seen, new = board.events, board.events_since(self._pushed)
        now = time.time()
        numbers = orjson.dumps(
            {
                "id": self.instance,
                **self._identity,
                "started_at": board.started_at,
                "totals": board.totals,
                "models": board.models,
                "tokens_removed": board.removed,
                "series": board.series.snapshot(),
            }
        )
        events = [orjson.dumps({**event, "instance": self.instance}) for event in new]

        async def write(client: Any) -> object:
            pipe = client.pipeline(transaction=False)
            pipe.set(f"{INSTANCE_KEY}{self.instance}", numbers, ex=max(1, int(self.ttl_s)))
            pipe.zadd(INSTANCES_KEY, {self.instance: now})
            pipe.zremrangebyscore(INSTANCES_KEY, "-inf", now - INSTANCES_HORIZON_S)
            pipe.expire(INSTANCES_KEY, INSTANCES_HORIZON_S)
            if events:
                pipe.lpush(EVENTS_KEY, *events)
                pipe.ltrim(EVENTS_KEY, 0, RECENT_EVENTS - 1)
                pipe.expire(EVENTS_KEY, EVENTS_TTL_S)
            return await pipe.execute()

        await self.link.run(write)
        self._pushed = seen

    def _own(self) -> dict[str, Any]:
        return {
            "id": self.instance,
            **self._identity,
            "uptime_s": round(time.time() - self.board.started_at, 1),
        }

    async def snapshot(self) -> dict[str, Any]:
        """The status of every live instance: this one's live numbers and the others' last."""
        own = self.board.snapshot()
        own["instance"] = self.instance
        now = time.time()

        async def listing(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.zrangebyscore(INSTANCES_KEY, now - self.ttl_s, "+inf")
            pipe.lrange(EVENTS_KEY, 0, RECENT_EVENTS - 1)
            return list(await pipe.execute())

        try:
            ids, pushed = await self.link.run(listing)
            others = [i for i in map(self._instance_id, ids) if i and i != self.instance]
            written = (
                await self.link.run(
                    lambda client: client.mget([f"{INSTANCE_KEY}{i}" for i in others])
                )
                if others
                else []
            )
        except Unavailable:
            return {**own, "shared": False, "instances": [self._own()]}
        totals: Counter[str] = Counter(own["totals"])
        removed: Counter[str] = Counter(own["tokens_removed"])
        models: dict[str, Counter[str]] = {m: Counter(u) for m, u in own["models"].items()}
        series = [own["series"]]
        instances = [self._own()]
        for raw in written:
            numbers = _instance(raw)
            if numbers is None:
                if raw is not None:  # None: it expired since the listing
                    self._skip("status", raw)
                continue
            totals.update(_counts(numbers.get("totals")))
            removed.update(_counts(numbers.get("tokens_removed")))
            if isinstance(numbers.get("series"), dict):
                series.append(numbers["series"])
            for model, usage in (numbers.get("models") or {}).items():
                models.setdefault(str(model), Counter()).update(_counts(usage))
            started = numbers.get("started_at")
            instances.append(
                {
                    "id": numbers.get("id"),
                    "host": numbers.get("host"),
                    "pid": numbers.get("pid"),
                    "uptime_s": round(now - started, 1)
                    if isinstance(started, int | float)
                    else None,
                }
            )
        events = []
        for raw in reversed(pushed):
            event = _loaded(raw)
            if event is None or not isinstance(event.get("time"), str):
                self._skip("event", raw)
            else:
                events.append(event)
        mine = self.board.events_since(self._pushed)
        events += [{**event, "instance": self.instance} for event in mine]
        events.sort(key=lambda event: str(event.get("time", "")))
        return {
            **own,
            "totals": dict(totals),
            "models": {model: dict(usage) for model, usage in models.items()},
            "tokens_removed": dict(removed),
            "series": merge_series(series, points=self.board.series.points),
            "recent_events": events[-RECENT_EVENTS:],
            "shared": True,
            "instances": instances,
        }

    def _instance_id(self, raw: Any) -> str | None:
        try:
            return str(raw.decode("utf-8"))
        except (AttributeError, UnicodeDecodeError):
            self._skip("status", raw)
            return None

    def _skip(self, record: str, raw: Any) -> None:
        shown = raw if isinstance(raw, bytes | str) else repr(raw)
        warn_once(
            log, (record, shown), "skipped a malformed shared %s record: %.80r", *(record, raw)
        )
        if self._rejected is not None:
            self._rejected(record, "malformed")


def _instance(raw: Any) -> dict[str, Any] | None:
    """An instance's status record as `SharedStatus.push` writes it, or None if it is not one
    (each field it has of the type push writes; the series as `merge_series` reads them)."""
    numbers = _loaded(raw)
    if numbers is None:
        return None
    kinds: dict[str, type | tuple[type, ...]] = {
        "id": str,
        "host": str,
        "pid": int,
        "started_at": (int, float),
        "totals": dict,
        "tokens_removed": dict,
        "models": dict,
        "series": dict,
    }
    for name, kind in kinds.items():
        if numbers.get(name) is not None and not isinstance(numbers[name], kind):
            return None
    if not all(isinstance(usage, dict) for usage in (numbers.get("models") or {}).values()):
        return None
    series = (numbers.get("series") or {}).get("series")
    if series is not None and not (
        isinstance(series, list)
        and all(isinstance(one, dict) and isinstance(one.get("points", []), list) for one in series)
    ):
        return None
    return numbers


def _loaded(raw: Any) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


# --- the shared state ----------------------------------------------------------------------------


class SharedState(Protocol):
    """What brim processes and instances share: loop counts, status, learned limits (which
    follow the registry: learning needs nothing of the caller, forgetting does)."""

    instance: str

    @property
    def loops(self) -> LoopCounts: ...

    @property
    def limits_shared_with(self) -> str | None:
        """Who shares the learned limits: "instances" (Redis), "workers" (the files of a
        `--workers` group), or None (this process alone)."""

    async def start(self) -> None:
        """Begin sharing (called once the app runs)."""

    async def status(self) -> dict[str, Any]:
        """`/admin/status`'s numbers (without the learned limits, which the registry has)."""

    async def forget(self, model: str | None) -> Forgotten:
        """Forget what was learned of `model` (None: of every model), here and everywhere the
        learned limits are shared."""

    def follow(self, registry: LimitsRegistry, upstreams: Iterable[str]) -> None:
        """A reload's configuration: `registry` (`LimitsRegistry.reconfigured`: the same facts,
        another `[models]`) and these upstreams are what the records read are checked against."""

    async def aclose(self) -> None: ...


class LocalState:
    """One process without Redis, exactly as brim runs alone; a worker of a `--workers` group
    (`group`) shares its learned limits with the group's other workers through files."""

    def __init__(
        self,
        board: StatusBoard,
        *,
        loop_window_s: float,
        registry: LimitsRegistry | None = None,
        group: WorkerGroup | None = None,
        rejected: Callable[[str, str], None] | None = None,
    ) -> None:
        """`registry`: the learned limits `forget` forgets (None: nothing is learned here)."""
        self.instance = os.urandom(6).hex()
        self.board = board
        self.registry = registry
        self._loops = LocalLoops(loop_window_s)
        self.limits: SharedLimits | None = None
        if group is not None and registry is not None:
            self.limits = SharedLimits(
                WorkerFiles(group), registry, spawn=self._spawn, rejected=rejected
            )
        self._tasks: set[asyncio.Task[None]] = set()  # writes off the request path
        self._refresher: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def loops(self) -> LocalLoops:
        return self._loops

    @property
    def limits_shared_with(self) -> str | None:
        return None if self.limits is None else self.limits.store.shared_with

    def _spawn(self, work: Callable[[], Awaitable[object]]) -> None:
        async def quietly() -> None:
            try:
                await work()
            except Exception:
                log.exception("writing this worker's learned limits failed")

        try:
            task = asyncio.get_running_loop().create_task(quietly())
        except RuntimeError:  # no loop: the next sync writes it
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        if self.limits is not None and self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        assert self.limits is not None
        while True:
            try:
                await self.limits.sync()
                self._failing = False
            except Exception:
                if not self._failing:  # once per spell of failures
                    log.exception("sharing learned limits with the other workers failed")
                self._failing = True
            await asyncio.sleep(WORKER_REFRESH_S)

    async def status(self) -> dict[str, Any]:
        return self.board.snapshot()

    async def forget(self, model: str | None) -> Forgotten:
        if self.limits is not None:
            return await self.limits.forget(model)
        return Forgotten([] if self.registry is None else self.registry.forget(model), True)

    def follow(self, registry: LimitsRegistry, upstreams: Iterable[str]) -> None:
        if self.registry is not None:
            self.registry = registry
        if self.limits is not None:
            self.limits.registry = registry

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
        if self._tasks:  # let the last writes land
            await asyncio.wait(list(self._tasks), timeout=2)


class RedisState:
    """Shared through Redis, with `local` serving while Redis is down (module doc). Every
    `refresh_s` it adopts learned limits and blocked requests, and writes this process's status
    numbers; the link is this object's to close. `rejected(record, reason)` hears of each
    record read from Redis that was malformed or implausible, and left out."""

    def __init__(
        self,
        link: RedisLink,
        local: LocalState,
        registry: LimitsRegistry,
        *,
        refresh_s: float,
        loop_limit: int,
        rejected: Callable[[str, str], None] | None = None,
        ratios: TokenRatios | None = None,
        upstreams: Iterable[str] = (),
    ) -> None:
        if refresh_s <= 0:
            raise ValueError("refresh_s must be positive")
        self.link = link
        self.local = local
        self.instance = local.instance
        self.refresh_s = refresh_s
        self._loops = RedisLoops(link, local.loops, max(1, loop_limit))
        self.limits = SharedLimits(
            RedisFacts(link), registry, spawn=link.background, rejected=rejected
        )
        # None: token ratios are not learned here ([guard] learn_token_ratios = false)
        self.ratios = None if ratios is None else SharedRatios(link, ratios, upstreams)
        ttl_s = max(INSTANCE_TTL_S, 5 * refresh_s)
        self.board = SharedStatus(link, local.board, local.instance, ttl_s, rejected=rejected)
        self._task: asyncio.Task[None] | None = None
        self._failed_steps: set[str] = set()

    @property
    def loops(self) -> RedisLoops:
        return self._loops

    @property
    def limits_shared_with(self) -> str:
        return self.limits.store.shared_with

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._refresh())

    async def sync(self) -> None:
        """One round: learned limits and ratios, blocked requests, this process's status
        numbers."""
        steps = [self.limits.sync, self._loops.pull, self.board.push]
        if self.ratios is not None:
            steps.insert(1, self.ratios.sync)
        for step in steps:
            try:
                await step()
            except Unavailable:
                pass
            except Exception:  # a bug, or data in Redis brim did not write: logged once a step
                name = step.__qualname__
                if name not in self._failed_steps:
                    self._failed_steps.add(name)
                    log.exception("sharing state through Redis failed (%s)", name)

    async def _refresh(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.refresh_s)

    async def status(self) -> dict[str, Any]:
        return await self.board.snapshot()

    async def forget(self, model: str | None) -> Forgotten:
        return await self.limits.forget(model)

    def follow(self, registry: LimitsRegistry, upstreams: Iterable[str]) -> None:
        self.local.follow(registry, upstreams)
        self.limits.registry = registry
        if self.ratios is not None:
            self.ratios.upstreams = frozenset(upstreams)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.link.aclose()
