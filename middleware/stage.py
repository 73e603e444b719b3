"""What a stage is, and how a list of stages runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from opentelemetry.trace import NoOpTracer, Tracer

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.exchange import Exchange

CallNext = Callable[[Exchange], Awaitable[UpstreamResponse]]


class Stage(Protocol):
    """One pipeline step. It may change the exchange before `call_next`, look at (or retry) what
    comes back, or answer itself without calling `call_next` at all. It raises only
    `adapters.errors` exceptions."""

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse: ...


async def _end_of_pipeline(exchange: Exchange) -> UpstreamResponse:
    raise RuntimeError("the pipeline ended without a stage answering (is Forward last?)")


class Pipeline:
    """Runs the stages in order. With a tracer, every stage after the first (which opens the
    request's span) runs in a child span of its own."""

    def __init__(self, stages: Sequence[Stage], tracer: Tracer | None = None) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = tuple(stages)
        if isinstance(tracer, NoOpTracer):
            tracer = None  # no spans to record: no wrappers either
        call: CallNext = _end_of_pipeline
        for position, stage in reversed(list(enumerate(self.stages))):
            call = _bind(stage, call, tracer if position else None)
        self._entry = call

    def __call__(self, exchange: Exchange) -> Awaitable[UpstreamResponse]:
        """The first stage's answer (await it)."""
        return self._entry(exchange)


def _bind(stage: Stage, call_next: CallNext, tracer: Tracer | None) -> CallNext:
    """`stage` with `call_next` bound. Without a tracer, a plain function that hands back the
    stage's own coroutine: one call per stage, not a coroutine of its own around it."""
    run = stage.__call__
    if tracer is None:

        def call(exchange: Exchange) -> Awaitable[UpstreamResponse]:
            return run(exchange, call_next)

        return call
    name = f"brim {type(stage).__name__}"

    async def traced(exchange: Exchange) -> UpstreamResponse:
        with tracer.start_as_current_span(name):
            return await run(exchange, call_next)

    return traced
