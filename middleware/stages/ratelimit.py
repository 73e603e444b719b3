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

The counts are kept by `middleware.services.rates` (this process's own, or shared through Redis).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import RateLimitExceeded
from brim.adapters.exchange import Exchange
from brim.middleware.services.rates import RateCounts, Window
from brim.middleware.stage import CallNext

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services


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

    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> RateLimit | None:
        """None when `[server]` sets no limit (no rate counts among the services)."""
        if services.rates is None:
            return None
        refused = services.telemetry.rate_limited
        return cls(services.rates, lambda kind: refused.add(1, {"limit": kind}))

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
