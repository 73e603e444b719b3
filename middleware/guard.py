"""The guard: a request that fits goes out as the client's own bytes; one that does not is made
to fit by the configured policies (tool calls always kept with their results), or refused with a
400 that says what was tried. Broken tool pairings are repaired first, since the provider would
refuse them anyway."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from multidict import CIMultiDict

from adapters.base import UpstreamResponse
from adapters.errors import ContextTooLarge
from adapters.exchange import Exchange
from middleware.archive import ContentArchive
from middleware.base import CallNext
from middleware.limits import OFF_LOOP_BYTES
from policies.compress import Outcome, compress_request
from policies.conversation import Policy
from policies.dialects import DIALECTS
from policies.tokens import CounterMeter, TokenCounter

log = logging.getLogger("brim.guard")


def _refusal(outcome: Outcome) -> ContextTooLarge:
    tried = ", ".join(outcome.tried) or "nothing (no policy is configured)"
    how = (
        f"the smallest it got was {outcome.tokens_out} tokens after trying {tried}. "
        "Shorten the conversation or start a new one."
    )
    return ContextTooLarge(
        f"This request has {outcome.tokens_in} input tokens, over the {outcome.limit}-token "
        f"budget brim keeps for this model, and could not be made to fit: {how}",
        param="messages",
        # Claude Code recognises this wording and offers to compact the conversation.
        anthropic_message=(
            f"prompt is too long: {outcome.tokens_in} tokens > {outcome.limit} maximum "
            f"(brim could not make it fit: {how})"
        ),
    )


class Guard:
    def __init__(
        self,
        counter: TokenCounter,
        policies: Sequence[Policy],
        *,
        low_water: float,
        repair_pairs: bool,
        archive: ContentArchive | None = None,
    ) -> None:
        if not 0 < low_water <= 1:
            raise ValueError(f"low_water must be in (0, 1], not {low_water}")
        self.counter = counter
        self.policies = list(policies)
        self.low_water = low_water
        self.repair_pairs = repair_pairs
        self.archive = archive

    def outcome(self, exchange: Exchange) -> Outcome:
        """What the guard does to this exchange (also used by `brim inspect`)."""
        assert exchange.context is not None and exchange.body is not None
        limits = exchange.context.limits.limits
        return compress_request(
            exchange.body,
            CounterMeter(self.counter, limits.tokenizer, exchange.model, exchange.api),
            self.policies,
            limit=exchange.context.budget.effective(),
            low_water=self.low_water,
            repair=self.repair_pairs,
        )

    def _needs_work(self, exchange: Exchange) -> bool:
        assert exchange.context is not None and exchange.body is not None
        if not exchange.context.fits:
            return True
        return self.repair_pairs and bool(
            DIALECTS[exchange.api].violations(exchange.body.get("messages") or [])
        )

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        if exchange.context is None or exchange.body is None or exchange.api not in DIALECTS:
            return await call_next(exchange)
        if not self._needs_work(exchange):
            reply = await call_next(exchange)
            tokens = await exchange.context.tokens.resolve()
            return _with_headers(reply, tokens, "none")

        if len(exchange.raw) > OFF_LOOP_BYTES:
            outcome = await asyncio.to_thread(self.outcome, exchange)
        else:
            outcome = self.outcome(exchange)
        exchange.report.outcome = outcome
        if not outcome.fits:
            log.info("request %s refused: %s", exchange.request_id, outcome.actions)
            raise _refusal(outcome)
        await keep_originals(self.archive, outcome, exchange)
        if outcome.repairs:
            log.warning(
                "request %s: repaired tool pairing: %s",
                exchange.request_id,
                "; ".join(outcome.repairs),
            )
        body = {**exchange.body, "messages": list(outcome.messages)}
        changed = exchange.with_body(body)
        context = dataclasses.replace(exchange.context, outcome=outcome)
        reply = await call_next(dataclasses.replace(changed, context=context))
        return _with_headers(reply, outcome.tokens_out, outcome.actions, outcome.tokens_in)


async def keep_originals(
    archive: ContentArchive | None, outcome: Outcome, exchange: Exchange
) -> None:
    """Store what the policies removed, under the keys their records name, before it goes."""
    items = [(r.archive_key, r.original) for r in outcome.records if r.archive_key and r.original]
    exchange.report.archive_keys += [key for key, _ in items]
    if archive is not None and items:
        await asyncio.to_thread(archive.put_many, items)


def _with_headers(
    reply: UpstreamResponse, tokens_out: int, actions: str, tokens_in: int | None = None
) -> UpstreamResponse:
    """Set the token and action headers, unless a later stage (a retry) already set them."""
    headers = CIMultiDict(reply.headers)
    headers.setdefault("x-brim-tokens-in", str(tokens_in if tokens_in is not None else tokens_out))
    headers.setdefault("x-brim-tokens-out", str(tokens_out))
    headers.setdefault("x-brim-actions", actions)
    return dataclasses.replace(reply, headers=headers)
