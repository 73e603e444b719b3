"""Learning each model's token ratio from the usage its provider reports (`policies.ratios`).

The innermost stage but one, right before `Forward`: it sees every call brim makes to an upstream
(the guard's cut, each retry, each hidden restore round) with the very body that call sends. When
the reply states the request's input tokens — a whole reply's usage, or a stream's as it passes
(Chat `usage.prompt_tokens`, Messages `usage.input_tokens` plus the cache's read and written
tokens, Responses `usage.input_tokens`, Gemini `usageMetadata.promptTokenCount`) — brim counts
the body it sent in its encoding (from the counter's cache: the request was counted already)
and `TokenRatios.observe` learns from the pair — for the request's owner (`Exchange.owner`):
what one client's replies teach counts its own requests, and others' only as one vote among
their settled clients (`policies.ratios`). All of it after the reply is on its way: a reply
never waits for the learning, and a stream is only watched for its usage event. What the reply
said of itself is left on it (`UpstreamResponse.reported`, `middleware.services.usage`): `Observe`
takes the usage for its metrics and spans from there instead of reading the reply a second time.

Nothing is learned from a CLI-backed upstream (its usage includes the CLI's own prompt), from a
reply without an input count, or from a request brim could not count; `TokenRatios` decides
what the rest teaches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from brim.adapters.adapter import OFF_LOOP_BYTES, UpstreamResponse
from brim.adapters.exchange import Exchange
from brim.adapters.upstream_config import UpstreamConfig
from brim.middleware.services.usage import StreamUsage, whole_reported
from brim.middleware.stage import CallNext
from brim.policies.ratios import TokenRatios, may_be_evidence
from brim.policies.tokens import RAW, TokenCounter
from brim.policies.wires import conversation_wire
from brim.policies.wires.base import Usage

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.calibrate")

MAX_LEARNING = 256  # large requests being counted off the loop at once; more go unlearned


class LearnRatios:
    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> LearnRatios | None:
        """None when `[guard] learn_token_ratios` is false."""
        if not config.guard.learn_token_ratios:
            return None
        return cls(services.ratios, services.counter, services.upstreams.configs)

    def __init__(
        self,
        ratios: TokenRatios,
        counter: TokenCounter,
        upstreams: Mapping[str, UpstreamConfig],
    ) -> None:
        self.ratios = ratios
        self.counter = counter
        self.upstreams = dict(upstreams)
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        reply = await call_next(exchange)
        if not self._teaches(exchange):
            return reply
        # What the reply says of itself is left on it (`reported`): `Observe` reads it there.
        if reply.chunks is None:
            reported = whole_reported(exchange.wire, reply)
            self._learn_soon(exchange, reported.usage)
            return dataclasses.replace(reply, reported=reported)
        watching = StreamUsage(exchange.wire)
        return dataclasses.replace(
            reply, chunks=self._watch(reply.chunks, exchange, watching), reported=watching.reported
        )

    def _teaches(self, exchange: Exchange) -> bool:
        """Whether a reply to this call can teach a ratio: a conversation brim measured, sent
        to an upstream that is not a CLI."""
        config = self.upstreams.get(exchange.upstream)
        return (
            exchange.context is not None
            and exchange.body is not None
            and config is not None
            and config.api != "cli"
            and conversation_wire(exchange.api) is not None
        )

    async def _watch(
        self, chunks: AsyncIterator[bytes], exchange: Exchange, watching: StreamUsage
    ) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            watching.feed(chunk)
            yield chunk
        # the whole stream was read: its usage stands
        self._learn_soon(exchange, watching.reported.usage)

    def _learn_soon(self, exchange: Exchange, usage: Usage | None) -> None:
        """Learn from the reply once the loop has written it (a large body is counted off the
        loop), unless it cannot teach anything (`may_be_evidence`, from the byte bound)."""
        reported = None if usage is None else usage.input
        if reported is None:
            return
        assert exchange.context is not None and exchange.body is not None
        tokenizer = exchange.context.limits.limits.tokenizer
        bound = self.counter.upper_bound(exchange.raw, exchange.body, tokenizer, exchange.wire, RAW)
        if not may_be_evidence(bound, reported):
            return
        loop = asyncio.get_running_loop()
        if len(exchange.raw) <= OFF_LOOP_BYTES:
            loop.call_soon(lambda: self._learn(exchange, reported, self._counted(exchange)))
        elif len(self._tasks) < MAX_LEARNING:
            task = loop.create_task(self._learn_off_loop(exchange, reported))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _learn_off_loop(self, exchange: Exchange, reported: int) -> None:
        self._learn(exchange, reported, await asyncio.to_thread(self._counted, exchange))

    def _counted(self, exchange: Exchange) -> int | None:
        """brim's count of the request as sent, in its encoding (None: it cannot count it)."""
        assert exchange.context is not None and exchange.body is not None
        tokenizer = exchange.context.limits.limits.tokenizer
        try:
            return self.counter.request(
                exchange.wire, exchange.body, tokenizer, exchange.model, RAW
            ).total
        except Exception:  # a request brim cannot count teaches nothing (and fails nothing)
            log.debug("request %s: not counted; no ratio learned", exchange.request_id)
            return None

    def _learn(self, exchange: Exchange, reported: int, counted: int | None) -> None:
        """`TokenRatios.observe` of the reply, on the event loop."""
        if counted is None:
            return
        assert exchange.context is not None
        limits = exchange.context.limits.limits
        prior = self.counter.prior(limits.tokenizer)
        learned = self.ratios.observe(
            exchange.owner, exchange.upstream, limits.model, prior, counted, reported
        )
        if learned is not None:
            log.debug(
                "request %s: upstream %r counted %d input tokens, brim %d: %r's ratio for its "
                "client is %.3f (%d replies)",
                exchange.request_id,
                exchange.upstream,
                reported,
                counted,
                limits.model,
                learned.value,
                learned.replies,
            )
