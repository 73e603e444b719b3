"""The guard: a request that fits goes out as the client's own bytes; one that does not is made
to fit by the configured policies (tool calls always kept with their results), or refused with a
400 that says what was tried. Broken tool pairings are repaired first, since the provider would
refuse them anyway."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from brim.adapters.adapter import OFF_LOOP_BYTES, UpstreamResponse
from brim.adapters.credentials import Caller, caller_of
from brim.adapters.errors import ContextTooLarge, NothingLeftToSend
from brim.adapters.exchange import Exchange
from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.sessions import SessionMemory
from brim.middleware.services.store import ContentStore
from brim.middleware.services.summarize import LEVELS, Summarizer, Summary
from brim.middleware.stage import CallNext
from brim.middleware.stages.restore import keep_originals, restorable, restore_offer
from brim.policies.carry import carried_from, carry, growth, prefix_digests
from brim.policies.clients import ClientRule
from brim.policies.compress import Outcome, compress_request
from brim.policies.conversation import FidelityRecord, Policy, archive_key, text_tokens_for
from brim.policies.evict import GISTS_HEADER
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires import conversation_wire
from brim.policies.wires.base import Refusal, Wire, is_notice, transcript

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.guard")


# A summary's first line names the key of the messages it condenses (as one JSON array, in
# order, as evict's records keep them), under which the store keeps them for `brim_restore`.
SUMMARY_HEADER = (
    "[brim: a summary of earlier messages, removed to fit the context window; "
    "the originals are sha256:{key}]\n"
)
PER_SUMMARY = 52  # tokens a summary message costs beyond its text (header and key, overhead)
SUMMARY_ALLOWANCE = 0.1  # of the budget, set aside for summaries when evicting with a summarizer


def summary_header(key: str) -> str:
    """The first line of a summary of evicted messages, naming the key of their JSON."""
    return SUMMARY_HEADER.format(key=key[:16])


def summary_low_water(low_water: float, *, summarizing: bool) -> float:
    """With a summarizer, reversible cuts go far enough below the budget to leave the
    summaries' allowance free (the default low-water mark already does)."""
    return min(low_water, 1 - SUMMARY_ALLOWANCE) if summarizing else low_water


def guard_outcome(
    counter: TokenCounter,
    policies: Sequence[Policy],
    body: Mapping[str, Any],
    wire: Wire,
    tokenizer: str,
    model: str,
    budget: int,
    *,
    low_water: float,
    repair: bool,
    provider_ratio: float | None = None,
    room: int = 0,
    ratio: float | None = None,
) -> Outcome:
    """What the guard does to a request (the stage, and `brim inspect`). Policies measure with
    brim's counter, at the request's `ratio` (`RequestTokens.ratio`; None: the tokenizer's
    prior); where the provider counted the request (`provider_ratio` = its count ÷ brim's),
    the budget is scaled to brim's counts."""
    return compress_request(
        body,
        CounterMeter(counter, tokenizer, model, wire, ratio),
        policies,
        limit=counted_limit(budget, provider_ratio),
        low_water=low_water,
        room=room,
        repair=repair,
    )


def counted_limit(budget: int, provider_ratio: float | None) -> int:
    """The budget in brim's counts, where the provider counted the request itself."""
    return int(budget / provider_ratio) if provider_ratio else budget


def summary_batches(
    evicted: Sequence[FidelityRecord], client: Sequence[Any] | None
) -> list[list[Any]]:
    """The evicted items in the batches `evict` recorded (`FidelityRecord.batch`): a batch
    keeps its units as the session grows (older units of its class do not move), so its summary
    is reused byte for byte — until the cut, moving on, adds to the one batch it stopped inside.
    Items are the client's own (`client`), or, after a pair repair moved indices, what the
    eviction recorded. Batches in conversation order."""
    batches: dict[tuple[int, int] | None, list[Any]] = {}
    first: dict[tuple[int, int] | None, int] = {}
    for record in sorted(evicted, key=lambda r: r.index):
        removed = orjson.loads(record.original or "[]")
        if client is not None and 0 <= record.index < len(client):
            removed = list(client[record.index : record.index + len(removed)])
        batches.setdefault(record.batch, []).extend(removed)
        first.setdefault(record.batch, record.index)
    return [batches[key] for key in sorted(batches, key=lambda k: first[k])]


def _summary_plan(sizes: Sequence[int], allowance: int) -> tuple[int, list[int]] | None:
    """How many of the oldest batches are summarized together (in one summary, which takes
    the room the others leave), and the summary target of each — the merged one first — so
    that all fit `allowance`: every batch's summary is its key points, then the oldest step
    down to a headline one by one, then the oldest are merged. A function of the evicted
    batches alone — not of the room a turn happens to have — so the summaries change only on
    the turns that evict more, and come from the cache on all others (None: nothing fits)."""
    shares = list(LEVELS.values())[1:]  # key points, headline
    for merged in range(len(sizes) + 1):
        kept = sizes[merged:]
        levels = [0] * len(kept)
        while True:
            targets = [
                max(48, math.ceil(size * shares[level]))
                for size, level in zip(kept, levels, strict=True)
            ]
            left = allowance - sum(targets) - PER_SUMMARY * (len(kept) + bool(merged))
            if not merged and left >= 0:
                return 0, targets
            if merged and left >= 48:
                return merged, [min(left, max(48, sum(sizes[:merged]))), *targets]
            oldest = next((n for n, level in enumerate(levels) if level < len(shares) - 1), None)
            if oldest is None:
                break
            levels[oldest] += 1
    return None


RESULT_HEADER = (
    "[brim: a summary of this tool result, too large for the context window; "
    "the whole is sha256:{key}]\n"
)


def _notice_at(wire: Wire, items: Sequence[Any]) -> int | None:
    """Where evict's notice is (the one item brim wrote that starts its way)."""
    for index, item in enumerate(items):
        if is_notice(wire.dialect, item):
            return index
    return None


def _task_of(wire: Wire, items: Sequence[Any]) -> str:
    """The conversation's task, for the summarizer: the first user item's text."""
    for item in items:
        if wire.dialect.role(item) == "user" and (text := wire.dialect.text(item)):
            return text[:2_000]
    return ""


def _detail(summary: Summary) -> str:
    flags = [
        flag for flag, on in (("cached", summary.cache_hit), ("truncated", summary.truncated)) if on
    ]
    return f"{summary.level} by {summary.provider}" + "".join(f", {flag}" for flag in flags)


def _refusal(outcome: Outcome, wire: Wire) -> ContextTooLarge:
    tried = ", ".join(outcome.tried) or "nothing (no policy is configured)"
    how = (
        f"the smallest it got was {outcome.tokens_out} tokens after trying {tried}. "
        "Shorten the conversation or start a new one."
    )
    return ContextTooLarge(
        Refusal(outcome.tokens_in, outcome.limit, how), param=wire.conversation_field
    )


class Guard:
    @classmethod
    def from_config(
        cls, config: PipelineConfig, services: Services, policies: Sequence[Policy]
    ) -> Guard | None:
        """None when `[guard] enabled` is false. `policies`: the pipeline's compression
        policies (`[guard] policies`), shared with the restore rounds and the retry."""
        guard = config.guard
        if not guard.enabled:
            return None
        return cls(
            services.counter,
            policies,
            low_water=guard.low_water,
            repair_pairs=guard.repair_pairs,
            archive=services.archive,
            summarizer=services.summarizer,
            summary_deadline_s=config.summarize.deadline_s,
            sessions=services.sessions if guard.carry_forward else None,
            room_for_turns=guard.room_for_turns,
            store=services.store,
            clients=config.clients,
        )

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
        sessions: SessionMemory | None = None,
        room_for_turns: float = 0,
        store: ContentStore | None = None,
        clients: Mapping[str, ClientRule] | None = None,
    ) -> None:
        if not 0 < low_water <= 1:
            raise ValueError(f"low_water must be in (0, 1], not {low_water}")
        if room_for_turns < 0:
            raise ValueError(f"room_for_turns must be at least 0, not {room_for_turns}")
        self.counter = counter
        self.policies = list(policies)
        self.low_water = summary_low_water(low_water, summarizing=summarizer is not None)
        self.repair_pairs = repair_pairs
        self.archive = archive
        self.summarizer = summarizer
        self.summary_deadline_s = summary_deadline_s
        self.sessions = sessions
        self.room_for_turns = room_for_turns
        self.store = store  # None: brim_restore is not offered
        self.clients = dict(clients or {})

    def _decide(
        self, exchange: Exchange, body: Mapping[str, Any], received: int | None
    ) -> tuple[Outcome, bytes | None]:
        """What the guard does to this exchange: the session's previous compressed turn plus
        the new items, while that fits; else the policies, leaving room for the next turns.
        `body`: the exchange's, or with brim's own tool added; `received`: the client's request
        as brim counted it (without brim's own tool, which `body` may have), what
        `x-brim-tokens-in` and a refusal report. Also the digest of the client's items (None
        without a session memory)."""
        assert exchange.context is not None
        context = exchange.context
        tokenizer = context.limits.limits.tokenizer
        budget = context.budget.effective
        room = 0
        digest = None
        if self.sessions is not None:
            wire = exchange.wire
            client = wire.conversation(body)
            digests = prefix_digests(client)
            digest = digests[-1] if digests else None
            carried = self.sessions.latest(exchange.owner, exchange.api, tokenizer, digests)
            if carried is not None:
                meter = exchange.meter(self.counter)
                limit = counted_limit(budget, context.tokens.provider_ratio)
                fixed = meter.fixed(body)
                carried_on = carry(
                    carried, wire.dialect, client, fixed, meter, limit=limit, tokens_in=received
                )
                if carried_on is not None:
                    return carried_on, digest
                room = int(self.room_for_turns * growth(carried, client, meter))
        outcome = guard_outcome(
            self.counter,
            self.policies,
            body,
            exchange.wire,
            tokenizer,
            exchange.model,
            budget,
            low_water=self.low_water,
            repair=self.repair_pairs,
            provider_ratio=context.tokens.provider_ratio,
            room=room,
            ratio=context.tokens.ratio,
        )
        if received is not None and outcome.tokens_in != received:
            outcome = dataclasses.replace(outcome, tokens_in=received)
        return outcome, digest

    def _remember(self, exchange: Exchange, outcome: Outcome, digest: bytes | None) -> None:
        """Keep what this turn was made into, for the session's next turn to build on."""
        if self.sessions is None or digest is None:
            return
        assert exchange.body is not None and exchange.context is not None
        carried = carried_from(outcome, exchange.wire.conversation(exchange.body))
        if carried is not None:
            tokenizer = exchange.context.limits.limits.tokenizer
            self.sessions.remember(exchange.owner, exchange.api, tokenizer, digest, carried)

    def _needs_work(self, exchange: Exchange) -> bool:
        assert exchange.context is not None and exchange.body is not None
        if not exchange.context.fits:
            return True
        wire = exchange.wire
        return self.repair_pairs and bool(wire.dialect.violations(wire.conversation(exchange.body)))

    def _summary_inputs(self, exchange: Exchange) -> tuple[Wire, CounterMeter, str, Caller]:
        """The wire, a meter, the conversation's task, and the client (its API, the upstream it
        addressed, its credentials: for a summarizer on that upstream, if it has no key of its
        own): this request's own, passed along."""
        assert exchange.body is not None and exchange.context is not None
        wire = exchange.wire
        meter = exchange.meter(self.counter)
        task = _task_of(wire, wire.conversation(exchange.body))
        return wire, meter, task, caller_of(exchange)

    async def _summary(self, text: str, target: int, task: str, caller: Caller) -> Summary | None:
        """A summary for `caller` (whose owner alone may reuse it) within the deadline, or None
        (the caller keeps what it had)."""
        assert self.summarizer is not None
        try:
            return await asyncio.wait_for(
                self.summarizer.summarize(text, target, task, caller), self.summary_deadline_s
            )
        except TimeoutError:
            log.warning("summarizer slower than %ss: going on without it", self.summary_deadline_s)
            return None

    async def _summarized(self, exchange: Exchange, outcome: Outcome) -> Outcome:
        """Evict's notice replaced by summaries of what it removed — one per batch of the
        conversation (`summary_batches`), so that as a session grows, earlier batches keep their
        summary byte for byte (from the cache) and a turn pays for what it newly evicted, and
        for the older batches the allowance makes it step down or merge — when all can be made
        in time and fit; otherwise the outcome as it was. Each summary's header names the key of
        the messages it condenses (`summary_header`), which its record keeps as the original
        (their JSON, as evict's records keep theirs); the notice's record goes with the notice.
        The lines the notice quoted from the latest removed results stay, after the summaries:
        a summarizer condenses, the quoted lines are what the results said word for word."""
        wire = exchange.wire
        at = _notice_at(wire, outcome.messages)
        evicted = [r for r in outcome.records if r.action == "evicted" and r.original]
        if at is None or not evicted:
            return outcome
        wire, meter, task, caller = self._summary_inputs(exchange)
        rest = outcome.tokens_out - meter.message(outcome.messages[at])
        _, header, lines = wire.dialect.text(outcome.messages[at]).partition("\n" + GISTS_HEADER)
        quoted = header + lines
        # The allowance is the same every turn; only a turn that evicts to its last resorts,
        # up to the budget itself, leaves less (and then no summarizer call is wasted). In
        # tokens of text, as the summaries' targets are.
        allowance = min(
            text_tokens_for(int(outcome.limit * SUMMARY_ALLOWANCE), meter),
            text_tokens_for(outcome.limit - rest, meter)
            - (meter.text_tokens(quoted) if quoted else 0),
        )
        assert exchange.body is not None
        client = None if outcome.repairs else wire.conversation(exchange.body)
        batches = summary_batches(evicted, client)
        contents = [transcript(wire.genai_messages(items)) for items in batches]
        sizes = [meter.text_tokens(content) for content in contents]
        plan = _summary_plan(sizes, allowance)
        if plan is None:
            return outcome
        merged, targets = plan
        if merged:  # the oldest batches, summarized as one
            contents = ["\n".join(contents[:merged]), *contents[merged:]]
            sizes = [sum(sizes[:merged]), *sizes[merged:]]
            batches = [[item for batch in batches[:merged] for item in batch], *batches[merged:]]
        # What each summary stands for, restorable by the key its header names: a function of
        # the batch alone, as the summary is, so the bytes stay put from turn to turn.
        originals = [orjson.dumps(items).decode() for items in batches]
        keys = [archive_key(original) for original in originals]
        summaries = await asyncio.gather(
            *(
                self._summary(content, target, task, caller)
                for content, target in zip(contents, targets, strict=True)
            )
        )
        made = [summary for summary in summaries if summary is not None]
        if len(made) != len(summaries):
            return outcome
        texts = [summary.text for summary in made]
        details = [_detail(summary) for summary in made]
        texts[-1] += quoted
        messages = [
            wire.dialect.notice(summary_header(key) + text)
            for key, text in zip(keys, texts, strict=True)
        ]
        counts = [meter.message(message) for message in messages]
        added = sum(counts)
        if rest + added > outcome.limit:
            return outcome
        records = [
            FidelityRecord(
                "summarize",
                "summarized",
                -1,
                size,
                count,
                archive_key=key,
                detail=detail,
                original=original,
            )
            for key, original, size, count, detail in zip(
                keys, originals, sizes, counts, details, strict=True
            )
        ]
        kept = tuple(r for r in outcome.records if r.action != "notice")  # the notice is gone
        return dataclasses.replace(
            outcome,
            messages=(*outcome.messages[:at], *messages, *outcome.messages[at + 1 :]),
            sizes=(*outcome.sizes[:at], *counts, *outcome.sizes[at + 1 :]),
            tokens_out=rest + added,
            records=(*kept, *records),
        )

    async def _summarized_results(self, exchange: Exchange, outcome: Outcome) -> Outcome:
        """A tool result `truncate` had to cut, summarized into the same room instead."""
        wire, meter, task, caller = self._summary_inputs(exchange)
        dialect = wire.dialect
        messages = list(outcome.messages)
        counts = list(outcome.sizes)
        records = list(outcome.records)
        total = outcome.tokens_out
        names = dialect.tools_by_call(messages)
        for record in outcome.records:
            if not record.detail.startswith("tool_result:") or not record.original:
                continue
            key = record.archive_key or archive_key(record.original)  # of the whole result
            call_id = record.detail.removeprefix("tool_result:")
            holders = [
                i
                for i, message in enumerate(messages)
                if any(r.call_id == call_id for r in dialect.tool_results(message, names))
            ]
            if not holders:
                continue
            at = holders[0]
            before = counts[at]
            target = max(64, text_tokens_for(before, meter) - 64)  # tokens of text
            summary = await self._summary(record.original, target, task, caller)
            if summary is None:
                continue
            header = RESULT_HEADER.format(key=key[:16])
            updated = dialect.with_tool_result(messages[at], call_id, header + summary.text)
            size = meter.message(updated)
            if total - before + size > outcome.limit:
                continue
            messages[at], total = updated, total - before + size
            counts[at] = size
            records.append(
                FidelityRecord(
                    "summarize",
                    "summarized",
                    record.index,
                    record.tokens_before,
                    size,
                    archive_key=key,
                    detail=f"tool result {call_id}: {_detail(summary)}",
                    original=record.original,
                )
            )
        return dataclasses.replace(
            outcome,
            messages=tuple(messages),
            sizes=tuple(counts),
            tokens_out=total,
            records=tuple(records),
        )

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        if exchange.context is None or exchange.body is None or not conversation_wire(exchange.api):
            return await call_next(exchange)
        if not self._needs_work(exchange):
            return await call_next(exchange)

        # Measured with brim_restore among the tools, in case something is cut; sent with it
        # only where something restorable was (cut a little deeper for it, within the slack
        # below the limit that the low-water mark leaves: the policies do not run twice).
        offered = restore_offer(self.store, exchange, self.clients)
        body = exchange.body if offered is None else offered
        tokens = exchange.context.tokens
        received = tokens.brims
        if received is None and tokens.pending is not None:  # counted beside the upstream call
            received = await tokens.pending
        if len(exchange.raw) > OFF_LOOP_BYTES:
            outcome, digest = await asyncio.to_thread(self._decide, exchange, body, received)
        else:
            outcome, digest = self._decide(exchange, body, received)
        offer = offered is not None and restorable(outcome)
        if not offer:
            body = exchange.body
        if not outcome.messages:
            raise NothingLeftToSend(
                "Nothing is left to send: every message was a tool result that answers no tool "
                f"call ({'; '.join(outcome.repairs)})."
            )
        if not outcome.fits:
            exchange.report.outcome = outcome
            log.info("request %s refused: %s", exchange.request_id, outcome.actions)
            raise _refusal(outcome, exchange.wire)
        if self.summarizer is not None and any(r.action == "evicted" for r in outcome.records):
            outcome = await self._summarized(exchange, outcome)
        if self.summarizer is not None and any(
            r.detail.startswith("tool_result:") for r in outcome.records
        ):
            outcome = await self._summarized_results(exchange, outcome)
        exchange.report.outcome = outcome
        if len(exchange.raw) > OFF_LOOP_BYTES:
            await asyncio.to_thread(self._remember, exchange, outcome, digest)
        else:
            self._remember(exchange, outcome, digest)
        await keep_originals(self.archive, self.store, outcome, exchange)
        exchange.report.restore_offered = offer
        if outcome.repairs:
            log.warning(
                "request %s: repaired tool pairing: %s",
                exchange.request_id,
                "; ".join(outcome.repairs),
            )
        changed = exchange.with_body(exchange.wire.with_conversation(body, outcome.messages))
        context = dataclasses.replace(exchange.context, outcome=outcome)
        return await call_next(dataclasses.replace(changed, context=context))
