"""Resolve the model's limits and the request's token budget, measure the request, and attach
all three to the exchange.

Every count of the request is scaled by one ratio, fixed here (`RequestTokens.ratio`): the one
learned for the model on the upstream the request goes to (`policies.ratios`), else its
tokenizer's prior (Claude: `claude_token_factor`; others: 1).

Measuring is cheap when there is room: a free byte bound settles it without tokenizing. Only a
request whose bound exceeds its budget is counted exactly before it goes on (per-message counts
are cached, and large requests are tokenized beside the event loop, not on it). A request the
bound clears is still counted exactly, for `x-brim-tokens-in`, metrics and status, but while the
upstream works: a large one in a worker thread, a small one on the event loop, at the first
moment the request waits (`RequestTokens.pending`).

Where brim's count is only an estimate (Claude, Gemini) and it lies within its error band around
the budget (`policies.budget.undecided`), the upstream's own counter settles whether the request
fits (`NativeCounts`): within `native_count_timeout_s`, cached by body, brim's estimate standing
whenever the provider cannot answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache, TTLCache

from brim.adapters.adapter import OFF_LOOP_BYTES, NativeCounter, UpstreamResponse
from brim.adapters.credentials import caller_of, may_call, withhold
from brim.adapters.errors import UpstreamError, UpstreamFailure
from brim.adapters.exchange import Exchange, RequestContext, RequestTokens
from brim.adapters.native import native_count_for
from brim.adapters.registry import Upstreams
from brim.adapters.upstream_config import UpstreamConfig
from brim.middleware.stage import CallNext
from brim.policies.budget import (
    TokenBudget,
    budget_for,
    estimate_band,
    requested_output,
    undecided,
)
from brim.policies.clients import ClientRule, match_client
from brim.policies.limits import (
    LimitSource,
    LimitsRegistry,
    ModelContextLimits,
    ResolvedLimits,
)
from brim.policies.ratios import TokenRatios
from brim.policies.remembered import Remembered
from brim.policies.tokens import TokenCounter
from brim.policies.wires.base import Wire

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.limits")


async def _thread(count: Callable[[], int]) -> int:
    return await asyncio.to_thread(count)


def _soon(count: Callable[..., int], *args: Any) -> asyncio.Future[int]:
    """`count(*args)`, made on the event loop once the running task first waits (a request that
    fits waits for its upstream next): a future that has the count then."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(_counted, future, count, args)
    return future


def _counted(future: asyncio.Future[int], count: Callable[..., int], args: tuple[Any, ...]) -> None:
    if not future.done():  # cancelled, with the request that waited for it: nobody reads it
        future.set_result(count(*args))


INLINE_BYTES = 64 * 1024  # smaller bodies are counted on the loop: well under a millisecond


BUDGETS_REMEMBERED = 4_096
NATIVE_CACHE_SIZE = 4_096
NATIVE_CACHE_TTL_S = 3_600.0
MISSING_TTL_S = 3_600.0  # a counter that answered 404/405 for a model is not asked again for this
RESTING_TTL_S = 30.0  # an upstream whose counter timed out, failed or was busy rests this long


def _digest(raw: bytes, betas: Sequence[str]) -> bytes:
    """The native-count cache's key for a request: its bytes, and the betas it asks for."""
    digest = hashlib.blake2b(raw, digest_size=16)
    for beta in betas:
        digest.update(b"\0" + beta.encode())
    return digest.digest()


class NativeCounts:
    """The upstream's own count of a request, where brim can only estimate and its estimate is
    too close to the budget to decide (`settle`). Never fails a request: a timeout, an error
    reply or a missing endpoint leaves brim's estimate standing (logged once per upstream); so
    does an upstream other than the one the client addressed that has no key of its own (a
    fallback's: the client's credential may not go there). Counts are cached by the request's
    bytes (and `anthropic-beta`), per upstream and model."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self._cache: TTLCache[tuple[str, str, bytes], int] = TTLCache(
            maxsize=NATIVE_CACHE_SIZE, ttl=NATIVE_CACHE_TTL_S
        )
        self._missing: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=NATIVE_CACHE_SIZE, ttl=MISSING_TTL_S
        )
        self._resting: TTLCache[str, bool] = TTLCache(maxsize=1_024, ttl=RESTING_TTL_S)
        self._warned: set[str] = set()  # upstream names: bounded by the configuration
        self.calls = 0  # counts asked of an upstream

    def band(self, exchange: Exchange, tokenizer: str) -> float | None:
        """The estimate's error band for this request, or None if the upstream is not asked:
        it has no counter, may not be asked, or its counter counts another API's requests."""
        config = self.upstreams.configs.get(exchange.upstream)
        if config is None or not config.counts_natively:
            return None
        if native_count_for(config.api, exchange) is None:
            return None
        return estimate_band(tokenizer, config.api)

    async def settle(
        self,
        exchange: Exchange,
        tokens: RequestTokens,
        budget: TokenBudget,
        tokenizer: str,
        *,
        band: float | None = None,
    ) -> RequestTokens:
        """`tokens` with the provider's count as `exact` (brim's kept as `estimate`) when the
        estimate is undecided and the provider answers in time; else `tokens` as they were.
        `band`: `self.band(exchange, tokenizer)`, where the caller has it already."""
        if tokens.exact is None:  # the free bound cleared the budget: it fits, whatever counts
            return tokens
        if band is None:
            band = self.band(exchange, tokenizer)
        if band is None or not undecided(tokens.exact, budget.effective, band):
            return tokens
        wire = exchange.wire
        if wire.dialect.violations(wire.conversation(exchange.body or {})):
            return tokens  # the counter would refuse it as sent; the guard repairs it first
        counted = await self.count(exchange)
        if counted is None:
            return tokens
        return dataclasses.replace(tokens, exact=counted, estimate=tokens.exact)

    async def count(self, exchange: Exchange) -> int | None:
        """The upstream's count of this request, or None if it cannot give one in time."""
        name, model = exchange.upstream, exchange.model
        adapter = self.upstreams.adapters.get(name)
        config = self.upstreams.configs[name]
        if not isinstance(adapter, NativeCounter):
            return None
        if (name, model) in self._missing or name in self._resting:
            return None
        if not may_call(name, config, exchange.addressed):  # the client's key may not go there
            withhold(caller_of(exchange), "native_count", model, name)
            return None
        betas = exchange.headers.getall("anthropic-beta", ())
        if len(exchange.raw) > OFF_LOOP_BYTES:
            digest = await asyncio.to_thread(_digest, exchange.raw, betas)
        else:
            digest = _digest(exchange.raw, betas)
        key = (name, model, digest)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        self.calls += 1
        try:
            async with asyncio.timeout(config.native_count_timeout_s):
                counted = await adapter.count_tokens(exchange)
        except Exception as exc:  # never fail the request: the estimate stands
            self._failed(exchange, config, exc)
            return None
        self._cache[key] = counted
        log.debug(
            "request %s: upstream %r counted %d input tokens", exchange.request_id, name, counted
        )
        return counted

    def _failed(self, exchange: Exchange, config: UpstreamConfig, exc: Exception) -> None:
        name = exchange.upstream
        if isinstance(exc, UpstreamError) and exc.status in (404, 405):
            self._missing[(name, exchange.model)] = True
            why = f"its token counter answered HTTP {exc.status}"
        elif isinstance(exc, UpstreamError) and exc.status != 429 and exc.status < 500:
            why = f"its token counter answered HTTP {exc.status}"
        else:
            self._resting[name] = True
            if isinstance(exc, TimeoutError):
                why = f"its token counter did not answer within {config.native_count_timeout_s:g} s"
            elif isinstance(exc, UpstreamError):
                why = f"its token counter answered HTTP {exc.status}"
            elif isinstance(exc, UpstreamFailure):
                why = exc.message
            else:
                why = f"asking its token counter failed ({type(exc).__name__})"
        if name in self._warned:
            log.debug("upstream %r: %s; using brim's estimate", name, why)
            return
        self._warned.add(name)
        log.warning(
            "upstream %r: %s; brim's own estimate decides instead (request %s; logged once "
            "per upstream; set native_count = false to stop asking)",
            name,
            why,
            exchange.request_id,
            exc_info=not isinstance(exc, TimeoutError | UpstreamFailure),  # a bug: say where
        )


def counting_ratio(
    counter: TokenCounter,
    ratios: TokenRatios | None,
    owner: str,
    upstream: str,
    limits: ModelContextLimits,
) -> float:
    """The ratio `owner`'s counts of the model for `upstream` are scaled by: learned (its own,
    else the shared one: `TokenRatios.ratio`), else the tokenizer's prior (always, where
    `ratios` is None: `[guard] learn_token_ratios = false`)."""
    prior = counter.prior(limits.tokenizer)
    if ratios is None:
        return prior
    return ratios.ratio(owner, upstream, limits.model, prior)


class ResolveLimits:
    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> ResolveLimits:
        guard = config.guard
        return cls(
            services.limits,
            services.counter,
            safety_margin=guard.safety_margin,
            clients=config.clients,
            upstreams=services.upstreams,  # their own token counters (`native_count`)
            ratios=services.ratios if guard.learn_token_ratios else None,
        )

    def __init__(
        self,
        registry: LimitsRegistry,
        counter: TokenCounter,
        *,
        safety_margin: float,
        clients: Mapping[str, ClientRule],
        upstreams: Upstreams | None = None,
        ratios: TokenRatios | None = None,
    ) -> None:
        if not 0 <= safety_margin < 1:
            raise ValueError(f"safety_margin must be in [0, 1), not {safety_margin}")
        self.registry = registry
        self.counter = counter
        # learned per owner, upstream and model (None: the tokenizers' priors)
        self.ratios = ratios
        self.safety_margin = safety_margin
        self.clients = dict(clients)
        self._warned: LRUCache[str, bool] = LRUCache(
            maxsize=10_000
        )  # bounded: ids are client input
        # The providers' own counters, for estimates too close to the budget to decide on.
        self.native = NativeCounts(upstreams) if upstreams is not None else None
        # Budgets by (the registry's resolution, by identity; requested output; a client rule's
        # CLI overhead): the registry hands out one resolution per model until it learns more.
        self._budgets: Remembered[
            tuple[int, int | None, int | None], tuple[ResolvedLimits, TokenBudget]
        ] = Remembered(BUDGETS_REMEMBERED)

    async def measure(
        self, exchange: Exchange, budget: TokenBudget, tokenizer: str, ratio: float
    ) -> RequestTokens:
        """The request's size at `ratio`: its free bound, and its exact count — made at once
        where a decision hangs on it (the bound exceeds the budget), else beside the upstream
        call."""
        if len(exchange.raw) <= INLINE_BYTES:
            return self._inline(exchange, budget, tokenizer, ratio)
        body = exchange.body or {}
        wire = exchange.wire
        bound = self.counter.upper_bound(exchange.raw, body, tokenizer, wire, ratio)
        count = functools.partial(self._count, wire, body, tokenizer, exchange.model, bound, ratio)
        if budget.fits(bound):  # no decision hangs on it: count beside the upstream call
            pending = asyncio.ensure_future(_thread(count))
            return RequestTokens(upper_bound=bound, pending=pending, ratio=ratio)
        if len(exchange.raw) > OFF_LOOP_BYTES:
            return RequestTokens(upper_bound=bound, exact=await _thread(count), ratio=ratio)
        return RequestTokens(upper_bound=bound, exact=count(), ratio=ratio)

    def _inline(
        self, exchange: Exchange, budget: TokenBudget, tokenizer: str, ratio: float
    ) -> RequestTokens:
        """`measure` of a small request, on the event loop: the bound, and the exact count —
        on the spot where the bound exceeds the budget, else once the upstream is asked."""
        body = exchange.body or {}
        wire = exchange.wire
        bound = self.counter.upper_bound(exchange.raw, body, tokenizer, wire, ratio)
        if bound <= budget.effective:  # no decision hangs on the count
            count = _soon(self._count, wire, body, tokenizer, exchange.model, bound, ratio)
            return RequestTokens(upper_bound=bound, pending=count, ratio=ratio)
        exact = self._count(wire, body, tokenizer, exchange.model, bound, ratio)
        return RequestTokens(upper_bound=bound, exact=exact, ratio=ratio)

    def _budget(
        self, resolved: ResolvedLimits, requested: int | None, cli_overhead: int | None
    ) -> TokenBudget:
        """`budget_for` this request, remembered per resolution (checked by identity, so one
        the registry replaced is never taken for it), requested output and CLI overhead."""
        key = (id(resolved), requested, cli_overhead)
        held = self._budgets.get(key)
        if held is not None and held[0] is resolved:
            return held[1]
        budget = budget_for(
            resolved, requested, safety_margin=self.safety_margin, cli_overhead=cli_overhead
        )
        self._budgets[key] = (resolved, budget)
        return budget

    def _count(
        self,
        wire: Wire,
        body: Mapping[str, Any],
        tokenizer: str,
        model: str,
        bound: int,
        ratio: float,
    ) -> int:
        try:
            # The count reads the parsed body, written out again where a value is not a string
            # (`9e15` becomes `9000000000000000.0`); the provider reads the bytes as sent, which
            # the bound covers: the smaller figure is still a sound one.
            return min(self.counter.request(wire, body, tokenizer, model, ratio).total, bound)
        except Exception:  # a count must never fail a request: the bound is still true
            log.exception("token count failed; using the byte bound %d", bound)
            return bound

    def ratio(self, owner: str, upstream: str, resolved: ResolvedLimits) -> float:
        """The ratio `owner`'s counts of the model for `upstream` are scaled by
        (`counting_ratio`)."""
        return counting_ratio(self.counter, self.ratios, owner, upstream, resolved.limits)

    async def context_for(self, exchange: Exchange) -> RequestContext:
        # Anthropic's context-1m beta gives this request (an Anthropic model's) a 1M window.
        resolved = self.registry.resolve(exchange.model, long_context=exchange.long_context)
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
        client = (
            match_client(self.clients, exchange.user_agent, exchange.headers)
            if self.clients
            else None
        )
        budget = self._budget(
            resolved,
            requested_output(exchange.body or {}),
            client[1].overhead if client else None,
        )
        tokenizer = resolved.limits.tokenizer
        ratio = self.ratio(exchange.owner, exchange.upstream, resolved)
        if len(exchange.raw) <= INLINE_BYTES:
            tokens = self._inline(exchange, budget, tokenizer, ratio)
        else:
            tokens = await self.measure(exchange, budget, tokenizer, ratio)
        native = self.native
        # Only a count brim made, for an upstream that counts too, can want settling.
        if native is not None and tokens.exact is not None:
            band = native.band(exchange, tokenizer)
            if band is not None:
                tokens = await native.settle(exchange, tokens, budget, tokenizer, band=band)
        return RequestContext(resolved, budget, tokens, client[0] if client else None)

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        context = await self.context_for(exchange)
        exchange.report.context = context
        if not context.fits:
            log.info(
                "request %s: %s tokens exceed the %d-token budget of %r",
                exchange.request_id,
                context.tokens.exact,
                context.budget.effective,
                exchange.model,
            )
        return await call_next(exchange.with_context(context))
