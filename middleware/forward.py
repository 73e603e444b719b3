"""The last stage: hand the exchange to the adapter of the upstream it was routed to."""

from __future__ import annotations

from adapters.base import UpstreamResponse
from adapters.exchange import Exchange
from adapters.registry import Upstreams
from middleware.base import CallNext


class Forward:
    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        return await self.upstreams[exchange.upstream].send(exchange)
