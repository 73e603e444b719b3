"""Retry on the provider's own "context too long".

Limits go stale and counts drift, so a provider sometimes refuses what brim thought would fit.
On a `ContextOverflow` this stage:

1. learns the window the error states (the registry keeps it for every later request, so the
   next one is compressed up front) and logs it once; likewise that the request's `max_tokens`
   counts against the window, when the error says so (Anthropic's "input length and
   `max_tokens` exceed context limit"), so the cut and later budgets reserve it. Only where
   brim's own count of the request bears the error out (`policies.evidence`) and the window
   lies within the registry's bounds: a fact learned here is every client's for a day, and
   the error's text is partly the client's. A stated window that fails either is not learned
   (logged, counted in `brim.learned.refused`) and not cut to either: the cut takes the steps;
2. tries the model's `fallbacks` (larger windows) first, if `[models."ID"]` lists any — one
   on another upstream than the client addressed only if that upstream has its own key
   (`middleware.stages.fallback.fallback_upstream`);
3. otherwise cuts the request — the same pair-safe policies as the guard, newest content and
   the system prompt kept — straight to the stated limit (minus the margin, scaled by how far
   brim's count was from the provider's), or by `steps` of the first attempt's tokens
   (20 %, 30 %, 40 %; where an earlier cut already went past a step, the first step of what
   was sent), and resends. Like the guard, it keeps what it cut in the archive and the
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
from typing import TYPE_CHECKING, Any

from brim.adapters.adapter import OFF_LOOP_BYTES, UpstreamResponse
from brim.adapters.errors import ContextOverflow
from brim.adapters.exchange import Exchange, RequestContext
from brim.adapters.overflow import Overflow
from brim.adapters.registry import Upstreams
from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.store import ContentStore
from brim.middleware.stage import CallNext
from brim.middleware.stages.fallback import fallback_upstream
from brim.middleware.stages.restore import keep_originals, restorable, restore_offer
from brim.policies.budget import budget_for, requested_output
from brim.policies.clients import ClientRule
from brim.policies.compress import Outcome, compress_request
from brim.policies.conversation import Policy
from brim.policies.evidence import Sent, output_counts_unproven, window_unproven
from brim.policies.limits import LimitsRegistry
from brim.policies.tokens import TokenCounter
from brim.policies.wires import conversation_wire

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.retry")


class RetryOnOverflow:
    @classmethod
    def from_config(
        cls, config: PipelineConfig, services: Services, policies: Sequence[Policy]
    ) -> RetryOnOverflow | None:
        """None when `[retry] enabled` is false. `policies`: the pipeline's compression
        policies (the guard's)."""
        if not config.retry.enabled:
            return None
        guard = config.guard
        learned_refused = services.telemetry.learned_refused
        return cls(
            services.limits,
            services.counter,
            policies,
            services.upstreams,
            max_attempts=config.retry.max_attempts,
            steps=config.retry.steps,
            safety_margin=guard.safety_margin,
            archive=services.archive,
            store=services.store,
            clients=config.clients,
            refused=lambda kind, reason: learned_refused.add(1, {"kind": kind, "reason": reason}),
        )

    def __init__(
        self,
        registry: LimitsRegistry,
        counter: TokenCounter,
        policies: Sequence[Policy],
        upstreams: Upstreams,
        *,
        max_attempts: int,
        steps: Sequence[float],
        safety_margin: float,
        archive: ContentArchive | None = None,
        store: ContentStore | None = None,
        clients: Mapping[str, ClientRule] | None = None,
        refused: Callable[[str, str], None] | None = None,
    ) -> None:
        """`refused(kind, reason)` hears of each fact an error stated that was not learned
        (`reason`: "unproven" or "implausible")."""
        if max_attempts < 0:
            raise ValueError(f"max_attempts cannot be negative ({max_attempts})")
        if not steps or not all(0 < step < 1 for step in steps):
            raise ValueError(f"steps must be fractions between 0 and 1, not {list(steps)}")
        self.registry = registry
        self.counter = counter
        self.policies = list(policies)
        self.upstreams = upstreams  # where fallbacks are routed, and which have keys of their own
        self.max_attempts = max_attempts
        self.steps = tuple(steps)
        self.safety_margin = safety_margin
        self.archive = archive
        self.store = store  # None: brim_restore is not offered
        self.clients = dict(clients or {})
        self.refused = refused

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
                exchange.report.overflow_messages += (overflow.overflow.message,)
                sent = await self._tokens_sent(current)
                first_tokens = first_tokens or sent
                stated = self._learn(current, overflow, sent)
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
                    exchange, current, overflow, stated, retries, first_tokens, sent
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
        stated: Overflow,
        retries: int,
        first: int,
        sent: int,
    ) -> Exchange | None:
        """`current` (the request that overflowed, `sent` tokens; the error stated what `stated`
        holds, as far as brim believes it) cut for retry `retries`, its originals kept and the
        cut recorded on `exchange`'s report; None if nothing more can be cut."""
        target = self._target(current, stated, retries, first, sent)
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

    def _learn(self, exchange: Exchange, overflow: ContextOverflow, tokens: int) -> Overflow:
        """Learn what the error states that brim's measurement of the request (`tokens` sent)
        bears out; returns the overflow as the retry may use it: without a stated window or
        output sharing that were not learned for want of evidence."""
        assert exchange.context is not None and exchange.body is not None
        stated, model = overflow.overflow, exchange.model
        sent = Sent(
            tokens,
            output=requested_output(exchange.body),
            overhead=exchange.context.budget.cli_overhead,
        )
        if stated.counts_output:
            why = output_counts_unproven(stated.output, sent)
            if why is not None:
                self._refuse(exchange, "output_counts", "unproven", why)
                stated = dataclasses.replace(stated, counts_output=False)
            elif self.registry.learn_output_counts(model):
                log.warning(
                    "learned from upstream %r: model %r counts max_tokens against its window",
                    overflow.upstream,
                    model,
                )
        if not stated.limit:
            return stated
        output_counts = stated.counts_output or exchange.context.limits.limits.output_counts
        why = window_unproven(stated.limit, stated.requested, sent, output_counts=output_counts)
        reason = "unproven"
        if why is None:
            why, reason = self.registry.implausible("window", model, stated.limit), "implausible"
        if why is not None:
            self._refuse(exchange, "window", reason, why)
            return dataclasses.replace(stated, limit=None, requested=None)
        if self.registry.learn(model, stated.limit):
            log.warning(
                "learned from upstream %r: model %r has a %d-token window",
                overflow.upstream,
                model,
                stated.limit,
            )
        return stated

    def _refuse(self, exchange: Exchange, kind: str, reason: str, why: str) -> None:
        log.info(
            "request %s: not learned (%s) that model %r has %s: %s",
            exchange.request_id,
            reason,
            exchange.model,
            "the window its error states" if kind == "window" else "output sharing its window",
            why,
        )
        if self.refused is not None:
            self.refused(kind, reason)

    async def _tokens_sent(self, exchange: Exchange) -> int:
        assert exchange.context is not None
        if exchange.context.outcome is not None:
            return exchange.context.outcome.tokens_out
        return await exchange.context.tokens.resolve()

    def _fallback(self, exchange: Exchange, fallbacks: list[str]) -> Exchange | None:
        """The request sent to the next of `fallbacks` that may be called
        (`fallback_upstream`), with that model's limits and budget; None when none is left."""
        while fallbacks:
            model = fallbacks.pop(0)
            upstream = fallback_upstream(self.upstreams, exchange, model)
            if upstream is None:
                continue
            assert exchange.body is not None and exchange.context is not None
            resolved = self.registry.resolve(model, long_context=exchange.long_context)
            budget = budget_for(
                resolved,
                requested_output(exchange.body),
                safety_margin=self.safety_margin,
                cli_overhead=self._client_overhead(exchange),
            )
            context = dataclasses.replace(exchange.context, limits=resolved, budget=budget)
            log.info("request %s: overflow; trying fallback model %r", exchange.request_id, model)
            return exchange.for_model(model, upstream, context)
        return None

    def _client_overhead(self, exchange: Exchange) -> int | None:
        """The CLI overhead of the `[clients]` rule the request matched (None: none matched,
        the model's own stands), as `ResolveLimits` budgeted the request with."""
        assert exchange.context is not None
        rule = self.clients.get(exchange.context.client or "")
        return rule.overhead if rule is not None else None

    def _target(
        self, exchange: Exchange, stated: Overflow, retries: int, first: int, sent: int
    ) -> int:
        step = first * (1 - self.steps[min(retries, len(self.steps)) - 1])
        if step >= sent:  # an earlier cut went past this step (whole results cleared, turns
            # evicted: reversible cuts come in pieces): cut on from what was sent
            step = sent * (1 - self.steps[0])
        if not stated.limit:
            return int(step)
        assert exchange.body is not None
        resolved = self.registry.resolve(exchange.model, long_context=exchange.long_context)
        if stated.counts_output and not resolved.limits.output_counts:
            # "input length and `max_tokens` exceed context limit": the output limit shares the
            # window, so the cut makes room for it too.
            limits = dataclasses.replace(resolved.limits, output_counts=True)
            resolved = dataclasses.replace(resolved, limits=limits)
        budget = budget_for(
            resolved,
            requested_output(exchange.body),
            safety_margin=self.safety_margin,
            cli_overhead=self._client_overhead(exchange),
        )
        target = budget.effective
        theirs = stated.requested
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
        meter = exchange.meter(self.counter)

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
