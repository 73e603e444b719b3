"""Resolve the model's limits and the request's token budget, measure the request, and attach
all three to the exchange.

Measuring is cheap when there is room: a free byte bound settles it without tokenizing. Only a
request whose bound exceeds its budget is counted exactly (per-message counts are cached, and
large requests are tokenized beside the event loop, not on it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from cachetools import LRUCache

from adapters.base import UpstreamResponse
from adapters.exchange import Exchange, RequestContext, RequestTokens
from middleware.base import CallNext
from policies.budget import TokenBudget, budget_for, requested_output
from policies.clients import ClientRule, match_client
from policies.limits import LimitSource, LimitsRegistry, wants_long_context
from policies.tokens import TokenCounter
from policies.wires.base import Wire

log = logging.getLogger("brim.limits")


async def _thread(count: Callable[[], int]) -> int:
    return await asyncio.to_thread(count)


INLINE_BYTES = 64 * 1024  # smaller bodies are counted on the spot: well under a millisecond
OFF_LOOP_BYTES = 256 * 1024  # larger bodies are counted in a worker thread


class ResolveLimits:
    def __init__(
        self,
        registry: LimitsRegistry,
        counter: TokenCounter,
        *,
        safety_margin: float,
        clients: Mapping[str, ClientRule],
    ) -> None:
        if not 0 <= safety_margin < 1:
            raise ValueError(f"safety_margin must be in [0, 1), not {safety_margin}")
        self.registry = registry
        self.counter = counter
        self.safety_margin = safety_margin
        self.clients = dict(clients)
        self._warned: LRUCache[str, bool] = LRUCache(
            maxsize=10_000
        )  # bounded: ids are client input

    async def measure(
        self, exchange: Exchange, budget: TokenBudget, tokenizer: str
    ) -> RequestTokens:
        body = exchange.body or {}
        wire = exchange.wire
        bound = self.counter.upper_bound(exchange.raw, body, tokenizer, wire)
        count = functools.partial(self._count, wire, body, tokenizer, exchange.model, bound)
        if len(exchange.raw) <= INLINE_BYTES:
            return RequestTokens(upper_bound=bound, exact=count())
        if budget.fits(bound):  # no decision hangs on it: count beside the upstream call
            return RequestTokens(upper_bound=bound, pending=asyncio.ensure_future(_thread(count)))
        if len(exchange.raw) > OFF_LOOP_BYTES:
            return RequestTokens(upper_bound=bound, exact=await _thread(count))
        return RequestTokens(upper_bound=bound, exact=count())

    def _count(
        self, wire: Wire, body: Mapping[str, Any], tokenizer: str, model: str, bound: int
    ) -> int:
        try:
            return self.counter.request(wire, body, tokenizer, model).total
        except Exception:  # a count must never fail a request: the bound is still true
            log.exception("token count failed; using the byte bound %d", bound)
            return bound

    async def context_for(self, exchange: Exchange) -> RequestContext:
        # Anthropic's context-1m beta gives this request (an Anthropic model's) a 1M window.
        betas = exchange.headers.getall("anthropic-beta", ())
        resolved = self.registry.resolve(exchange.model, long_context=wants_long_context(betas))
        if resolved.source is LimitSource.DEFAULT and exchange.model not in self._warned:
            self._warned[exchange.model] = True
            limits = resolved.limits
            log.warning(
                "unknown model %r: assuming a %d-token window and %d output tokens; "
                'set [models."%s"] in proxy.toml to be exact',
                exchange.model,
                limits.context_window,
                limits.max_output,
                exchange.model,
            )
        client = match_client(self.clients, exchange.user_agent, exchange.headers)
        budget = budget_for(
            resolved,
            requested_output(exchange.body or {}),
            safety_margin=self.safety_margin,
            cli_overhead=client[1].overhead if client else None,
        )
        tokens = await self.measure(exchange, budget, resolved.limits.tokenizer)
        return RequestContext(resolved, budget, tokens, client[0] if client else None)

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        context = await self.context_for(exchange)
        exchange.report.context = context
        if not context.fits:
            log.info(
                "request %s: %s tokens exceed the %d-token budget of %r",
                exchange.request_id,
                context.tokens.exact,
                context.budget.effective(),
                exchange.model,
            )
        return await call_next(dataclasses.replace(exchange, context=context))
