"""Use what the user configured before cutting: a request over its model's budget goes whole to
the first of the model's fallbacks (`[models."ID"] fallbacks`) whose budget holds it, instead of
being compressed (`[guard] prefer_fallback`, on by default; it acts only where a model has
fallbacks). Each fallback is measured as its own request would be (`ResolveLimits.context_for`:
its limits, its tokenizer, its upstream's own counter where brim can only estimate).

A fallback served by another upstream than the one the client addressed is used only if that
upstream has a key of its own: the client's credential goes to the upstream it addressed and no
other (`adapters.credentials`). Otherwise it is skipped for this request — logged, and on the
request's trace span — and the request is compressed as it would have been.

What it did goes on the request's report (`fallbacks`: `x-brim-actions` says `fallback:1`); the
request's context becomes the fallback's, so its `x-brim-budget` is the fallback's budget.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.credentials import caller_of, may_call, withhold
from brim.adapters.errors import NoRoute
from brim.adapters.exchange import Exchange
from brim.adapters.registry import Upstreams
from brim.middleware.stage import CallNext
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.policies.limits import LimitsRegistry
from brim.policies.wires import conversation_wire

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.fallback")


def fallback_upstream(upstreams: Upstreams, exchange: Exchange, model: str) -> str | None:
    """The upstream that serves fallback `model` for this request, or None: no route serves it
    on the request's API (logged), or it is another upstream than the one the client addressed
    and has no key of its own (`withhold`: logged, and on the request's report)."""
    try:
        upstream = upstreams.route(model, exchange.api)
    except NoRoute:
        log.warning("fallback model %r has no route; skipping it", model)
        return None
    if not may_call(upstream, upstreams.configs[upstream], exchange.addressed):
        withhold(caller_of(exchange), "fallback", model, upstream)
        return None
    return upstream


class PreferFallback:
    @classmethod
    def from_config(
        cls, config: PipelineConfig, services: Services, limits: ResolveLimits
    ) -> PreferFallback | None:
        """`limits`: the pipeline's `ResolveLimits` stage. None unless the guard is on and
        `[guard] prefer_fallback` is set."""
        if not (config.guard.enabled and config.guard.prefer_fallback):
            return None
        return cls(services.limits, limits, services.upstreams)

    def __init__(
        self, registry: LimitsRegistry, limits: ResolveLimits, upstreams: Upstreams
    ) -> None:
        self.registry = registry
        self.limits = limits  # measures a fallback as it measured the request
        self.upstreams = upstreams

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        context = exchange.context
        if context is None or context.fits or exchange.body is None:
            return await call_next(exchange)
        fallbacks = self.registry.fallbacks(exchange.model)
        if not fallbacks or not conversation_wire(exchange.api):
            return await call_next(exchange)
        switched = await self._holding(exchange, fallbacks)
        if switched is None:
            return await call_next(exchange)
        assert switched.context is not None
        log.info(
            "request %s: over the %d-token budget of %r; sent whole to its fallback %r "
            "(budget %d) instead of compressing it",
            exchange.request_id,
            context.budget.effective,
            exchange.model,
            switched.model,
            switched.context.budget.effective,
        )
        exchange.report.fallbacks += (switched.model,)
        exchange.report.context = switched.context
        return await call_next(switched)

    async def _holding(self, exchange: Exchange, fallbacks: tuple[str, ...]) -> Exchange | None:
        """The request sent to the first fallback whose budget holds it whole; None if none
        does (or none may be called)."""
        assert exchange.context is not None
        for model in fallbacks:
            upstream = fallback_upstream(self.upstreams, exchange, model)
            if upstream is None:
                continue
            candidate = exchange.for_model(model, upstream, exchange.context)
            context = await self.limits.context_for(candidate)
            if context.fits:
                return candidate.with_context(context)
            log.debug(
                "request %s: fallback %r does not hold it either (%d-token budget)",
                exchange.request_id,
                model,
                context.budget.effective,
            )
        return None
