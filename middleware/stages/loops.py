"""Stop a client that sends the same failing request over and over.

Agents in a compaction or retry loop have been seen sending one failing request a thousand times
in minutes, each one a paid provider call. After `limit` identical failures (same body, same
client, same credentials) within `window_s` of each other, brim answers 429 itself — in the
client's wire format, with `retry-after` set to when the block lifts — instead of calling the
provider again. The block lifts `window_s` after the last real failure; one success clears it.

The counts live in `counts`: this process's own (`LocalLoops`), or shared by every instance on
one Redis (`middleware.services.shared.RedisLoops`, whose docstring says exactly how they add up).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import BrimError, RepeatedFailure
from brim.adapters.exchange import Exchange
from brim.adapters.forwarded_headers import CREDENTIAL_HEADERS
from brim.middleware.services.shared import LocalLoops, LoopCounts
from brim.middleware.stage import CallNext

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

KEY_SHOWN = 12  # hex digits of a request's hash that status shows (it is a hash: no content)
# The headers whose values are part of the hash: the client's provider credentials, and the
# headers that change how a provider reads a request. A failure that a client brings about with
# one of them (an `anthropic-beta` the provider refuses) is not counted against the same body
# sent without it.
HASHED_HEADERS = sorted(
    {
        *CREDENTIAL_HEADERS,
        "anthropic-beta",
        "anthropic-version",
        "openai-beta",
        "openai-organization",
        "openai-project",
    }
)


class LoopBreaker:
    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> LoopBreaker | None:
        """None when `[guard] loop_limit` is 0 (off)."""
        guard = config.guard
        if not guard.loop_limit:
            return None
        return cls(services.shared.loops, limit=guard.loop_limit, window_s=guard.loop_window_s)

    def __init__(self, counts: LoopCounts | None = None, *, limit: int, window_s: float) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("limit must be at least 1 and window_s positive")
        self.limit = limit
        self.window_s = window_s
        self.counts = counts if counts is not None else LocalLoops(window_s)

    @staticmethod
    def _key(exchange: Exchange) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(exchange.raw)
        digest.update(exchange.endpoint.encode())
        digest.update(exchange.user_agent.encode())
        # Whose request: two clients sending the same bytes (brim keys behind one provider key)
        # are two counts, so one client's failures never stop another's request.
        digest.update(exchange.owner.encode() + b"\0")
        for name in HASHED_HEADERS:
            for value in exchange.headers.getall(name, ()):
                digest.update(name.encode() + b"\0" + value.encode() + b"\0")
        return digest.digest()

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        counts = self.counts
        # While no count is held, the request has failed nowhere we know of: no hash, no look-up
        # (the key is made only if it fails, or if a count is held by the time it succeeds).
        key = self._key(exchange) if counts.holding() else None
        if key is not None:
            held = await counts.failures(key)
            if held.count >= self.limit:
                wait_s = max(1, math.ceil(held.lifts_in_s))
                stopped = RepeatedFailure(
                    f"This exact request has failed {held.count} times in a row (each within "
                    f"{self.window_s:g} s of the last); brim stopped sending it to the provider "
                    f"to protect your quota. Change the request, or retry in {wait_s} s."
                )
                stopped.brim_headers["retry-after"] = str(wait_s)
                raise stopped
        try:
            reply = await call_next(exchange)
        except BrimError as error:
            if not error.brims_own_refusal:
                await counts.failed(key if key is not None else self._key(exchange))
            raise
        if key is not None or counts.holding():
            counts.succeeded(key if key is not None else self._key(exchange))
        return reply


def loop_status(counts: LoopCounts, *, limit: int, window_s: float) -> dict[str, Any]:
    """What `/admin/status` says of the loop guard: its settings (limit 0: off) and the
    requests it refuses now — a prefix of the request's hash, its failures, when it lifts."""
    blocked = counts.blocked(limit) if limit else []
    return {
        "limit": limit,
        "window_s": window_s,
        "blocked": [
            {
                "request": key.hex()[:KEY_SHOWN],
                "failures": held.count,
                "lifts_in_s": round(held.lifts_in_s, 1),
            }
            for key, held in blocked
        ],
    }
