"""Requests and tokens counted per holder and minute, for the `RateLimit` stage
(`middleware.stages.ratelimit`, which says how windows work).

The counts live in `RedisRates` when `[cache] url` is set — one Lua script per request, so every
process and instance shares them exactly — and in `LocalRates` otherwise, or while Redis does
not answer (then each process counts on its own; a request is never refused or failed because
Redis is down).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cachetools import TTLCache

from brim.middleware.services.shared import RedisLink, Unavailable

WINDOW_S = 60.0
RATE_KEY = "brim:rate:"  # + the holder (a hash)
LOCAL_HOLDERS = 100_000  # windows held in one process; the least recent are forgotten first


@dataclass(frozen=True, slots=True)
class Window:
    """A holder's window after one request was offered: whether it was let through, what the
    window has counted (this request included when it was), and in how long it ends."""

    allowed: bool
    requests: int
    tokens: int
    resets_in_s: float


class RateCounts(Protocol):
    async def take(
        self, holder: str, requests_limit: int | None, tokens_limit: int | None, tokens: int
    ) -> Window:
        """Count one request of `tokens` input tokens for `holder` if both limits allow it."""


def _fits(used: int, more: int, limit: int | None) -> bool:
    return limit is None or used + more <= limit


class LocalRates:
    """This process's own windows."""

    def __init__(
        self, *, window_s: float = WINDOW_S, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._timer = timer
        # holder → (when its window ends, requests, tokens)
        self._windows: TTLCache[str, tuple[float, int, int]] = TTLCache(
            maxsize=LOCAL_HOLDERS, ttl=window_s, timer=timer
        )

    async def take(
        self, holder: str, requests_limit: int | None, tokens_limit: int | None, tokens: int
    ) -> Window:
        now = self._timer()
        held = self._windows.get(holder)
        ends, requests, used = held if held is not None and held[0] > now else (0.0, 0, 0)
        if not ends:
            ends = now + self.window_s
        allowed = _fits(requests, 1, requests_limit) and _fits(used, tokens, tokens_limit)
        if allowed:
            requests, used = requests + 1, used + tokens
            self._windows[holder] = (ends, requests, used)
        return Window(allowed, requests, used, ends - now)


# One round trip, atomic: read the window (a hash, expiring when the window ends), count the
# request only if both limits allow it. 0 as a limit: none.
TAKE = """
local held = redis.call('HMGET', KEYS[1], 'r', 't')
local ttl = redis.call('PTTL', KEYS[1])
local requests, tokens = tonumber(held[1]) or 0, tonumber(held[2]) or 0
if ttl < 0 then
  redis.call('DEL', KEYS[1])
  requests, tokens, ttl = 0, 0, tonumber(ARGV[4])
end
local rlimit, tlimit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ok = 1
if rlimit > 0 and requests + 1 > rlimit then ok = 0 end
if tlimit > 0 and tokens + n > tlimit then ok = 0 end
if ok == 1 then
  requests = redis.call('HINCRBY', KEYS[1], 'r', 1)
  tokens = redis.call('HINCRBY', KEYS[1], 't', n)
  if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
end
return {ok, requests, tokens, ttl}
"""


class RedisRates:
    """Windows shared by every process and instance on one Redis (`brim:rate:<holder>`), with
    `local` counting whenever Redis does not answer."""

    def __init__(self, link: RedisLink, local: LocalRates) -> None:
        self.link = link
        self.local = local
        self._window_ms = max(1, int(local.window_s * 1000))
        self._script: Any = None

    async def take(
        self, holder: str, requests_limit: int | None, tokens_limit: int | None, tokens: int
    ) -> Window:
        key = f"{RATE_KEY}{holder}"
        args = [requests_limit or 0, tokens_limit or 0, tokens, self._window_ms]

        async def run(client: Any) -> list[Any]:
            if self._script is None:
                self._script = client.register_script(TAKE)
            return list(await self._script(keys=[key], args=args))

        try:
            ok, requests, used, ttl_ms = await self.link.run(run)
        except Unavailable:
            return await self.local.take(holder, requests_limit, tokens_limit, tokens)
        return Window(bool(ok), int(requests), int(used), max(0, int(ttl_ms)) / 1000)
