"""Retry on the provider's own "context too long".

Limits go stale and counts drift, so a provider sometimes refuses what brim thought would fit.
On a `ContextOverflow` this stage:

1. learns the window the error states (the registry keeps it for every later request, so the
   next one is compressed up front) and logs it once; likewise that the request's `max_tokens`
   counts against the window, when the error says so (Anthropic's "input length and
   `max_tokens` exceed context limit"), so the cut and later budgets reserve it;
2. tries the model's `fallbacks` (larger windows) first, if `[models."ID"]` lists any;
3. otherwise cuts the request — the same pair-safe policies as the guard, newest content and
   the system prompt kept — straight to the stated limit (minus the margin, scaled by how far
   brim's count was from the provider's), or by `steps` of the first attempt's tokens
   (20 %, 30 %, 40 %), and resends;
4. after `max_attempts` retries, relays the provider's last error unchanged.

What it did goes on the request's report (retries, cuts, fallbacks), from which every reply and
error gets its `x-brim-*` headers. Other failures (auth, rate limits, 5xx, other
4xx) pass through untouched and are never retried here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from adapters.base import OFF_LOOP_BYTES, UpstreamResponse
from adapters.errors import ContextOverflow, NoRoute
from adapters.exchange import Exchange, RequestContext
from middleware.archive import ContentArchive
from middleware.base import CallNext
from middleware.guard import keep_originals
from policies.budget import budget_for, requested_output
from policies.compress import Outcome, compress_request
from policies.conversation import Policy
from policies.limits import LimitsRegistry
from policies.tokens import CounterMeter, TokenCounter
from policies.wires import conversation_wire

log = logging.getLogger("brim.retry")


class RetryOnOverflow:
    def __init__(
        self,
        registry: LimitsRegistry,
        counter: TokenCounter,
        policies: Sequence[Policy],
        route: Callable[[str, str], str],
        *,
        max_attempts: int,
        steps: Sequence[float],
        safety_margin: float,
        archive: ContentArchive | None = None,
    ) -> None:
        if max_attempts < 0:
            raise ValueError(f"max_attempts cannot be negative ({max_attempts})")
        if not steps or not all(0 < step < 1 for step in steps):
            raise ValueError(f"steps must be fractions between 0 and 1, not {list(steps)}")
        self.registry = registry
        self.counter = counter
        self.policies = list(policies)
        self.route = route
        self.max_attempts = max_attempts
        self.steps = tuple(steps)
        self.safety_margin = safety_margin
        self.archive = archive

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        if exchange.context is None or exchange.body is None or not conversation_wire(exchange.api):
            return await call_next(exchange)
        current = exchange
        retries = 0
        first_tokens: int | None = None
        fallbacks = list(self.registry.fallbacks(exchange.model))
        while True:
            try:
                return await call_next(current)
            except ContextOverflow as overflow:
                self._learn(current.model, overflow)
                exchange.report.overflow_messages.append(overflow.overflow.message)
                sent = await self._tokens_sent(current)
                first_tokens = first_tokens or sent
                if retries >= self.max_attempts:
                    raise
                retries += 1
                exchange.report.retries = retries
                switched = self._fallback(current, fallbacks)
                if switched is not None:
                    exchange.report.fallbacks.append(switched.model)
                    current = switched
                    continue
                cut = await self._cut(current, overflow, retries, first_tokens, sent)
                if cut is None:
                    exchange.report.retries = retries - 1
                    raise
                exchange.report.retry_outcomes.append(cut)
                await keep_originals(self.archive, None, cut, exchange)
                current = self._with_outcome(current, cut)

    def _learn(self, model: str, overflow: ContextOverflow) -> None:
        limit = overflow.overflow.limit
        if limit and self.registry.learn(model, limit):
            log.warning(
                "learned from upstream %r: model %r has a %d-token window",
                overflow.upstream,
                model,
                limit,
            )
        if overflow.overflow.counts_output and self.registry.learn_output_counts(model):
            log.warning(
                "learned from upstream %r: model %r counts max_tokens against its window",
                overflow.upstream,
                model,
            )

    async def _tokens_sent(self, exchange: Exchange) -> int:
        assert exchange.context is not None
        if exchange.context.outcome is not None:
            return exchange.context.outcome.tokens_out
        return await exchange.context.tokens.resolve()

    def _fallback(self, exchange: Exchange, fallbacks: list[str]) -> Exchange | None:
        while fallbacks:
            model = fallbacks.pop(0)
            try:
                upstream = self.route(model, exchange.api)
            except NoRoute:
                log.warning("fallback model %r has no route; skipping it", model)
                continue
            assert exchange.body is not None and exchange.context is not None
            body = {**exchange.body, "model": model}
            resolved = self.registry.resolve(model, long_context=exchange.long_context)
            budget = budget_for(resolved, requested_output(body), safety_margin=self.safety_margin)
            context = dataclasses.replace(exchange.context, limits=resolved, budget=budget)
            log.info("request %s: overflow; trying fallback model %r", exchange.request_id, model)
            return dataclasses.replace(
                exchange.with_body(body), model=model, upstream=upstream, context=context
            )
        return None

    def _target(
        self, exchange: Exchange, overflow: ContextOverflow, retries: int, first: int, sent: int
    ) -> int:
        step = first * (1 - self.steps[min(retries, len(self.steps)) - 1])
        stated = overflow.overflow.limit
        if not stated:
            return int(step)
        assert exchange.body is not None
        resolved = self.registry.resolve(exchange.model, long_context=exchange.long_context)
        if overflow.overflow.counts_output and not resolved.limits.output_counts:
            # "input length and `max_tokens` exceed context limit": the output limit shares the
            # window, so the cut makes room for it too.
            limits = dataclasses.replace(resolved.limits, output_counts=True)
            resolved = dataclasses.replace(resolved, limits=limits)
        budget = budget_for(
            resolved, requested_output(exchange.body), safety_margin=self.safety_margin
        )
        target = budget.effective()
        theirs = overflow.overflow.requested
        if theirs and theirs > sent:  # brim counted low: scale down by the provider's own count
            target = int(target * sent / theirs)
        return target if target < sent else int(step)

    async def _cut(
        self, exchange: Exchange, overflow: ContextOverflow, retries: int, first: int, sent: int
    ) -> Outcome | None:
        assert exchange.body is not None and exchange.context is not None
        target = self._target(exchange, overflow, retries, first, sent)
        tokenizer = exchange.context.limits.limits.tokenizer
        meter = CounterMeter(self.counter, tokenizer, exchange.model, exchange.wire)

        def run() -> Outcome:
            assert exchange.body is not None
            return compress_request(
                exchange.body, meter, self.policies, limit=target, low_water=1.0
            )

        outcome = await asyncio.to_thread(run) if len(exchange.raw) > OFF_LOOP_BYTES else run()
        if not outcome.changed or outcome.tokens_out >= sent:
            log.info("request %s: overflow, and nothing more can be cut", exchange.request_id)
            return None
        log.info(
            "request %s: overflow from %r (%s); retry %d with %d → %d tokens (%s)",
            exchange.request_id,
            overflow.upstream,
            overflow.overflow.message[:120],
            retries,
            sent,
            outcome.tokens_out,
            outcome.actions,
        )
        return outcome

    @staticmethod
    def _with_outcome(exchange: Exchange, outcome: Outcome) -> Exchange:
        assert exchange.body is not None and exchange.context is not None
        body = exchange.wire.with_conversation(exchange.body, outcome.messages)
        context: RequestContext = dataclasses.replace(exchange.context, outcome=outcome)
        return dataclasses.replace(exchange.with_body(body), context=context)
