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
   (20 %, 30 %, 40 %), and resends. Like the guard, it keeps what it cut in the archive and the
   content store and, where it cut something the model may fetch back, offers `brim_restore`
   (measured in the cut, not added twice, not where the client's rule or the client's own
   tools rule it out); a hidden restore round answered on the resent request (`RestoreRounds`,
   which continues from the request as this stage sent it: `RequestReport.sent`) stays inside
   the limit it was cut to, and a round the provider refuses in turn is cut from its own size;
4. after `max_attempts` retries, relays the provider's last error unchanged.

What it did goes on the request's report (retries, cuts, fallbacks), from which every reply and
error gets its `x-brim-*` headers. Other failures (auth, rate limits, 5xx, other
4xx) pass through untouched and are never retried here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapters.base import OFF_LOOP_BYTES, UpstreamResponse
from adapters.errors import ContextOverflow, NoRoute
from adapters.exchange import Exchange, RequestContext
from middleware.archive import ContentArchive
from middleware.base import CallNext
from middleware.guard import keep_originals
from middleware.restore import restorable, restore_offer
from middleware.store import ContentStore
from policies.budget import budget_for, requested_output
from policies.clients import ClientRule
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
        store: ContentStore | None = None,
        clients: Mapping[str, ClientRule] | None = None,
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
        self.store = store  # None: brim_restore is not offered
        self.clients = dict(clients or {})

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        if exchange.context is None or exchange.body is None or not conversation_wire(exchange.api):
            return await call_next(exchange)
        current = exchange
        retries = 0
        first_tokens: int | None = None
        fallbacks: list[str] | None = None  # looked up on the first overflow
        while True:
            try:
                response = await call_next(current)
            except ContextOverflow as overflow:
                if fallbacks is None:
                    fallbacks = list(self.registry.fallbacks(exchange.model))
                self._learn(current.model, overflow)
                exchange.report.overflow_messages += (overflow.overflow.message,)
                sent = await self._tokens_sent(current)
                first_tokens = first_tokens or sent
                if retries >= self.max_attempts:
                    raise
                retries += 1
                exchange.report.retries += 1  # over every restore round of the request
                switched = self._fallback(current, fallbacks)
                if switched is not None:
                    exchange.report.fallbacks += (switched.model,)
                    current = switched
                    continue
                cut = await self._cut_again(
                    exchange, current, overflow, retries, first_tokens, sent
                )
                if cut is None:
                    exchange.report.retries -= 1
                    raise
                current = cut
            else:
                if current is not exchange and exchange.report.restore_offered:
                    exchange.report.sent = current  # restore rounds go on from it
                return response

    async def _cut_again(
        self,
        exchange: Exchange,
        current: Exchange,
        overflow: ContextOverflow,
        retries: int,
        first: int,
        sent: int,
    ) -> Exchange | None:
        """`current` (the request that overflowed, `sent` tokens) cut for retry `retries`, its
        originals kept and the cut recorded on `exchange`'s report; None if nothing more can be
        cut."""
        target = self._target(current, overflow, retries, first, sent)
        made = await self._offering_cut(current, target, sent)
        if made is None:
            log.info("request %s: overflow, and nothing more can be cut", exchange.request_id)
            return None
        body, cut, offered = made
        log.info(
            "request %s: overflow from %r (%s); retry %d with %d → %d tokens (%s)",
            exchange.request_id,
            overflow.upstream,
            overflow.overflow.message[:120],
            retries,
            sent,
            cut.tokens_out,
            cut.actions,
        )
        exchange.report.retry_outcomes += (cut,)
        await keep_originals(self.archive, self.store, cut, exchange)
        if offered:
            exchange.report.restore_offered = True
        return self._with_outcome(current, body, cut)

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
        target = budget.effective
        theirs = overflow.overflow.requested
        if theirs and theirs > sent:  # brim counted low: scale down by the provider's own count
            target = int(target * sent / theirs)
        return target if target < sent else int(step)

    async def _offering_cut(
        self, exchange: Exchange, target: int, sent: int
    ) -> tuple[dict[str, Any], Outcome, bool] | None:
        """The request cut to `target` tokens: its body (brim_restore added where the retry
        offers it, and counted in the cut), how it was cut, and whether the tool was added; or
        None if nothing more can be cut. A cut that removed nothing the model could fetch back
        is made again without the tool, so that it cuts no deeper than the request needs."""
        assert exchange.body is not None
        offered = restore_offer(self.store, exchange, self.clients)
        if offered is not None:
            cut = await self._cut(exchange, offered, target, sent)
            if cut is not None and restorable(cut):
                return offered, cut, True
        cut = await self._cut(exchange, exchange.body, target, sent)
        return None if cut is None else (exchange.body, cut, False)

    async def _cut(
        self, exchange: Exchange, body: dict[str, Any], target: int, sent: int
    ) -> Outcome | None:
        """`body` (the exchange's, or with brim_restore added) cut to `target` tokens; None if
        that cuts nothing, or not below the `sent` tokens that overflowed."""
        assert exchange.context is not None
        tokenizer = exchange.context.limits.limits.tokenizer
        ratio = exchange.context.tokens.ratio
        meter = CounterMeter(self.counter, tokenizer, exchange.model, exchange.wire, ratio)

        def run() -> Outcome:
            return compress_request(body, meter, self.policies, limit=target, low_water=1.0)

        outcome = await asyncio.to_thread(run) if len(exchange.raw) > OFF_LOOP_BYTES else run()
        if not outcome.changed or outcome.tokens_out >= sent:
            return None
        return outcome

    @staticmethod
    def _with_outcome(exchange: Exchange, body: dict[str, Any], outcome: Outcome) -> Exchange:
        """The exchange carrying `body` cut as `outcome` says (whose limit is what a restore
        round answered on it may fill: `RestoreRounds._asked`)."""
        assert exchange.context is not None
        cut = exchange.wire.with_conversation(body, outcome.messages)
        context: RequestContext = dataclasses.replace(exchange.context, outcome=outcome)
        return dataclasses.replace(exchange.with_body(cut), context=context)
