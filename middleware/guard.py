"""The guard: a request that fits goes out as the client's own bytes; one that does not is made
to fit by the configured policies (tool calls always kept with their results), or refused with a
400 that says what was tried. Broken tool pairings are repaired first, since the provider would
refuse them anyway."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from multidict import CIMultiDict

from adapters.base import UpstreamResponse
from adapters.errors import BrimError, ContextTooLarge
from adapters.exchange import Exchange
from adapters.headers import CREDENTIAL_HEADERS
from middleware.archive import ContentArchive
from middleware.base import CallNext
from middleware.limits import OFF_LOOP_BYTES
from middleware.summarize import Summarizer, Summary, transcript
from policies.compress import Outcome, compress_request
from policies.conversation import Dialect, FidelityRecord, Policy, archive_key
from policies.dialects import DIALECTS, conversation_of, with_conversation
from policies.tokens import CounterMeter, TokenCounter

log = logging.getLogger("brim.guard")


NOTICE_PREFIX = "[brim removed "
SUMMARY_HEADER = "[brim: a summary of earlier messages, removed to fit the context window]\n"
RESULT_HEADER = "[brim: a summary of this tool result, too large for the context window]\n"


def _notice_at(messages: Sequence[Any]) -> int | None:
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and content.startswith(NOTICE_PREFIX):
            return index
    return None


def _task_of(messages: Sequence[Any]) -> str:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return transcript([message]).removeprefix("user: ")[:2_000]
    return ""


def _detail(summary: Summary) -> str:
    flags = [
        flag for flag, on in (("cached", summary.cache_hit), ("truncated", summary.truncated)) if on
    ]
    return f"{summary.level} by {summary.provider}" + "".join(f", {flag}" for flag in flags)


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
        gemini_message=(
            f"The input token count ({outcome.tokens_in}) exceeds the maximum number of tokens "
            f"allowed ({outcome.limit}). brim could not make it fit: {how}"
        ),
    )


class NothingLeftToSend(BrimError):
    status = 400
    error_type = "invalid_request_error"


class Guard:
    def __init__(
        self,
        counter: TokenCounter,
        policies: Sequence[Policy],
        *,
        low_water: float,
        repair_pairs: bool,
        archive: ContentArchive | None = None,
        summarizer: Summarizer | None = None,
        summary_deadline_s: float = 30.0,
    ) -> None:
        if not 0 < low_water <= 1:
            raise ValueError(f"low_water must be in (0, 1], not {low_water}")
        self.counter = counter
        self.policies = list(policies)
        self.low_water = low_water
        self.repair_pairs = repair_pairs
        self.archive = archive
        self.summarizer = summarizer
        self.summary_deadline_s = summary_deadline_s

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
            DIALECTS[exchange.api].violations(conversation_of(exchange.api, exchange.body))
        )

    def _summary_inputs(
        self, exchange: Exchange
    ) -> tuple[Dialect, CounterMeter, str, dict[str, str]]:
        """The dialect, a meter, the conversation's task, and the client's credentials (for
        summarizers behind pass-through upstreams)."""
        assert exchange.body is not None and exchange.context is not None
        meter = CounterMeter(
            self.counter, exchange.context.limits.limits.tokenizer, exchange.model, exchange.api
        )
        credentials = {k: v for k, v in exchange.headers.items() if k.lower() in CREDENTIAL_HEADERS}
        task = _task_of(conversation_of(exchange.api, exchange.body))
        return DIALECTS[exchange.api], meter, task, credentials

    async def _summary(
        self, text: str, target: int, task: str, credentials: dict[str, str]
    ) -> Summary | None:
        """A summary within the deadline, or None (the caller keeps what it had)."""
        assert self.summarizer is not None
        try:
            return await asyncio.wait_for(
                self.summarizer.summarize(text, target, task, credentials), self.summary_deadline_s
            )
        except TimeoutError:
            log.warning("summarizer slower than %ss: going on without it", self.summary_deadline_s)
            return None

    async def _summarized(self, exchange: Exchange, outcome: Outcome) -> Outcome:
        """Evict's notice replaced by a summary of what it removed, when one can be made in
        time and fits; otherwise the outcome as it was."""
        at = _notice_at(outcome.messages)
        evicted = [r for r in outcome.records if r.action == "evicted" and r.original]
        if at is None or not evicted:
            return outcome
        dialect, meter, task, credentials = self._summary_inputs(exchange)
        rest = outcome.tokens_out - meter.message(outcome.messages[at])
        room = outcome.target - rest if outcome.target - rest >= 128 else outcome.limit - rest
        if room < 128:
            return outcome
        content = transcript([m for r in evicted for m in orjson.loads(r.original or "[]")])
        summary = await self._summary(content, room - 48, task, credentials)
        if summary is None:
            return outcome
        message = dialect.notice(SUMMARY_HEADER + summary.text)
        size = meter.message(message)
        if rest + size > outcome.limit:
            return outcome
        record = FidelityRecord(
            "summarize",
            "summarized",
            -1,
            sum(r.tokens_before for r in evicted),
            size,
            archive_key=archive_key(content),
            detail=_detail(summary),
            original=content,
        )
        messages = (*outcome.messages[:at], message, *outcome.messages[at + 1 :])
        return dataclasses.replace(
            outcome, messages=messages, tokens_out=rest + size, records=(*outcome.records, record)
        )

    async def _summarized_results(self, exchange: Exchange, outcome: Outcome) -> Outcome:
        """A tool result `truncate` had to cut, summarized into the same room instead."""
        dialect, meter, task, credentials = self._summary_inputs(exchange)
        messages = list(outcome.messages)
        records = list(outcome.records)
        total = outcome.tokens_out
        names = dialect.tools_by_call(messages)
        for record in outcome.records:
            if not record.detail.startswith("tool_result:") or not record.original:
                continue
            call_id = record.detail.removeprefix("tool_result:")
            holders = [
                i
                for i, message in enumerate(messages)
                if any(r.call_id == call_id for r in dialect.tool_results(message, names))
            ]
            if not holders:
                continue
            at = holders[0]
            before = meter.message(messages[at])
            summary = await self._summary(record.original, max(64, before - 64), task, credentials)
            if summary is None:
                continue
            updated = dialect.with_tool_result(messages[at], call_id, RESULT_HEADER + summary.text)
            size = meter.message(updated)
            if total - before + size > outcome.limit:
                continue
            messages[at], total = updated, total - before + size
            records.append(
                FidelityRecord(
                    "summarize",
                    "summarized",
                    record.index,
                    record.tokens_before,
                    size,
                    archive_key=record.archive_key,
                    detail=f"tool result {call_id}: {_detail(summary)}",
                    original=record.original,
                )
            )
        return dataclasses.replace(
            outcome, messages=tuple(messages), tokens_out=total, records=tuple(records)
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
        if not outcome.messages:
            raise NothingLeftToSend(
                "Nothing is left to send: every message was a tool result that answers no tool "
                f"call ({'; '.join(outcome.repairs)})."
            )
        if not outcome.fits:
            exchange.report.outcome = outcome
            log.info("request %s refused: %s", exchange.request_id, outcome.actions)
            raise _refusal(outcome)
        if self.summarizer is not None and any(r.action == "evicted" for r in outcome.records):
            outcome = await self._summarized(exchange, outcome)
        if self.summarizer is not None and any(
            r.detail.startswith("tool_result:") for r in outcome.records
        ):
            outcome = await self._summarized_results(exchange, outcome)
        exchange.report.outcome = outcome
        await keep_originals(self.archive, outcome, exchange)
        if outcome.repairs:
            log.warning(
                "request %s: repaired tool pairing: %s",
                exchange.request_id,
                "; ".join(outcome.repairs),
            )
        body = with_conversation(exchange.api, exchange.body, outcome.messages)
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
