"""Per-key rate limits: `[server] requests_per_minute` and `tokens_per_minute` (input tokens as
brim counts them), per brim key — per client address when brim has no keys — with per-key
overrides (`[server.key_limits.NAME]`). The HTTP layer says whom a request counts against and
their limits (`Exchange.quota`); with no limit configured this stage is not in the pipeline.

Windows: a holder's minute starts with its first request and lasts 60 s; within it at most
`requests_per_minute` requests and `tokens_per_minute` input tokens are let through, and the
window's end is when everything resets (`retry-after`, `x-ratelimit-reset-*`). A refused request
is not counted, so a burst of N over the limit gets exactly N refusals. A request larger than
the whole `tokens_per_minute` is refused whatever the window holds (OpenAI does the same).
Being fixed windows, a client may spend its limit at the end of one minute and again at the
start of the next: at most twice the limit in any 60 s.

The counts live in `RedisRates` when `[cache] url` is set — one Lua script per request, so every
process and instance shares them exactly — and in `LocalRates` otherwise, or while Redis does
not answer (then each process counts on its own; a request is never refused or failed because
Redis is down).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cachetools import TTLCache

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import RateLimitExceeded
from brim.adapters.exchange import Exchange
from brim.middleware.services.shared import RedisLink, Unavailable
from brim.middleware.stage import CallNext

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


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: `12s`, `1m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def rate_headers(
    window: Window, requests_limit: int | None, tokens_limit: int | None
) -> dict[str, str]:
    """`retry-after` and OpenAI's `x-ratelimit-*` headers for the limits that are set."""
    headers = {"retry-after": str(max(1, math.ceil(window.resets_in_s)))}
    reset = reset_text(window.resets_in_s)
    for name, limit, used in (
        ("requests", requests_limit, window.requests),
        ("tokens", tokens_limit, window.tokens),
    ):
        if limit is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{name}"] = reset
    return headers


class RateLimit:
    """Refuses, with 429 in the client's format, a request past its holder's limits. Placed
    after `ResolveLimits`, which measured the request."""

    def __init__(self, counts: RateCounts, on_refusal: Callable[[str], None] | None = None) -> None:
        self.counts = counts
        self.on_refusal = on_refusal

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        quota = exchange.quota
        if quota is None:
            return await call_next(exchange)
        tokens = 0
        if quota.tokens_per_minute is not None and exchange.context is not None:
            measured = exchange.context.tokens
            tokens = measured.brims if measured.brims is not None else await measured.resolve()
        requests_limit, tokens_limit = quota.requests_per_minute, quota.tokens_per_minute
        window = await self.counts.take(quota.holder, requests_limit, tokens_limit, tokens)
        if window.allowed:
            return await call_next(exchange)
        wait_s = max(1, math.ceil(window.resets_in_s))
        if tokens_limit is not None and tokens > tokens_limit:
            kind = "tokens"
            message = (
                f"Request too large for this client's tokens per minute: limit {tokens_limit}, "
                f"requested {tokens} (server.tokens_per_minute). Send a smaller request."
            )
        elif requests_limit is not None and window.requests + 1 > requests_limit:
            kind = "requests"
            message = (
                f"Rate limit reached for this client on requests per minute: limit "
                f"{requests_limit}, used {window.requests}, requested 1 "
                f"(server.requests_per_minute). Please try again in {wait_s}s."
            )
        else:
            kind = "tokens"
            message = (
                f"Rate limit reached for this client on tokens per minute: limit "
                f"{tokens_limit}, used {window.tokens}, requested {tokens} "
                f"(server.tokens_per_minute). Please try again in {wait_s}s."
            )
        if self.on_refusal is not None:
            self.on_refusal(kind)
        refused = RateLimitExceeded(message)
        refused.error_type = kind
        refused.brim_headers.update(rate_headers(window, requests_limit, tokens_limit))
        raise refused
