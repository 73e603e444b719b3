"""Resolve the model's limits and the request's token budget, and attach them to the exchange."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from multidict import CIMultiDict

from adapters.base import UpstreamResponse
from adapters.exchange import Exchange, RequestContext
from middleware.base import CallNext
from policies.budget import budget_for, requested_output
from policies.clients import ClientRule, match_client
from policies.limits import LimitSource, LimitsRegistry

log = logging.getLogger("brim.limits")


class ResolveLimits:
    def __init__(
        self,
        registry: LimitsRegistry,
        *,
        safety_margin: float,
        clients: Mapping[str, ClientRule],
    ) -> None:
        if not 0 <= safety_margin < 1:
            raise ValueError(f"safety_margin must be in [0, 1), not {safety_margin}")
        self.registry = registry
        self.safety_margin = safety_margin
        self.clients = dict(clients)
        self._warned: set[str] = set()

    def context_for(self, exchange: Exchange) -> RequestContext:
        resolved = self.registry.resolve(exchange.model)
        if resolved.source is LimitSource.DEFAULT and exchange.model not in self._warned:
            self._warned.add(exchange.model)
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
        return RequestContext(resolved, budget, client[0] if client else None)

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        context = self.context_for(exchange)
        reply = await call_next(dataclasses.replace(exchange, context=context))
        headers = CIMultiDict(reply.headers)
        headers["x-brim-budget"] = str(context.budget.effective())
        return dataclasses.replace(reply, headers=headers)
