"""The last stage: hand the exchange to the adapter of the upstream it was routed to, inside a
client span whose W3C `traceparent` goes to the provider."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from brim.adapters.adapter import Adapter, UpstreamResponse
from brim.adapters.exchange import Exchange
from brim.adapters.registry import Upstreams
from brim.middleware.stage import CallNext

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

PROPAGATOR = TraceContextTextMapPropagator()


class Forward:
    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> Forward:
        return cls(services.upstreams, services.telemetry.tracer)

    def __init__(self, upstreams: Upstreams, tracer: trace.Tracer | None = None) -> None:
        self.upstreams = upstreams
        self.tracer = tracer or trace.NoOpTracer()
        self._tracing = not isinstance(self.tracer, trace.NoOpTracer)

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        adapter = self.upstreams[exchange.upstream]
        if not self._tracing:  # a client traceparent passes through as it came
            return await self._timed(adapter, exchange)
        with self.tracer.start_as_current_span(
            f"upstream {exchange.upstream}",
            kind=SpanKind.CLIENT,
            attributes={"brim.upstream": exchange.upstream, "gen_ai.request.model": exchange.model},
        ) as span:
            carrier: dict[str, str] = {}
            PROPAGATOR.inject(carrier)
            if carrier:
                headers = CIMultiDict(exchange.headers)
                for key in ("traceparent", "tracestate"):
                    headers.popall(key, None)
                headers.update(carrier)
                exchange = dataclasses.replace(exchange, headers=CIMultiDictProxy(headers))
            reply = await self._timed(adapter, exchange)
            span.set_attribute("http.response.status_code", reply.status)
            return reply

    @staticmethod
    async def _timed(adapter: Adapter, exchange: Exchange) -> UpstreamResponse:
        started = time.perf_counter()
        try:
            return await adapter.send(exchange)
        finally:
            exchange.report.upstream_seconds += time.perf_counter() - started
            exchange.report.upstream_calls += 1
