"""Hidden restore rounds: the model fetches back what brim cut, within the same request.

When the guard or the retry cut a request, they offer the model one more tool, `brim_restore`
(`RESTORE_TOOL`, added at the end of the request's tools in its own wire format), and every
placeholder, notice and summary names the key of what it stands for. When the provider's reply
calls it, this stage answers the call itself from the content store — the original the request's
own owner kept (another client's key is answered exactly as an unknown one), whole: where the
request has no room for it, older content makes the room (results cleared, turns evicted, by
the guard's policies, the restored turn kept whole), and the original is cut only where even
that cannot make it — appends the call and its result, and asks the provider again, at
most `max_rounds` times (the last round with tool calls turned off, so the model answers). The
client gets only the final reply, its usage the sum over the rounds; client tool calls made in
the same turn as a restore are dropped from the hidden round (the model makes them again once it
has the content). A round goes on from the request as it was last sent: the retry's cut of it,
where the provider refused it as too long (`RequestReport.sent`), so this stage sits outside the
retry and every round still has the retry behind it.

Streams are held only until it is clear how the turn starts. A turn that starts with a restore
call is read to its end and answered before the client gets anything (a failure there is still
an HTTP error). A turn that starts with text is relayed at once, event by event, until its first
tool call; from there its events are held to the turn's end (tool calls are short). If none of
them calls brim_restore they go on exactly as they came. If one does, the held calls (the
client's too) and the turn's end are dropped, brim answers, asks again, and streams the next
round on as more of the same reply, which every wire API can express (`Wire.splice`):

- Chat Completions: the next round's chunks under the first round's id, created and model,
  without its role-only opener; one finish reason, one usage chunk (the sum), one `[DONE]`.
- Anthropic Messages: the next round's `message_start` dropped and its content blocks numbered
  on; the last `message_delta` carries its stop reason and every round's usage, input included
  (the SDKs take a `message_delta`'s figures over `message_start`'s); one `message_stop`.
- Responses: the next round's `response.created` / `.in_progress` dropped, `sequence_number`
  and `output_index` numbered on, item ids as the provider gave them; the last
  `response.completed` has the last round's id (the stored response a client goes on from),
  every item the client got, the summed usage.
- Gemini: the next round's chunks appended under the first `responseId`, the earlier rounds'
  usage added to every usage figure.

The same holds in a round that is itself a continuation, up to `max_rounds`. Once the client
has the stream's start, a failure of a later round (the provider's error, a model that keeps
calling brim_restore) ends the stream with that API's own error event, never a dangling call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from brim.adapters.adapter import OFF_LOOP_BYTES, UpstreamResponse
from brim.adapters.errors import BrimError, UpstreamFailure, UpstreamProtocolError
from brim.adapters.exchange import Exchange
from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.store import ContentStore
from brim.middleware.stage import CallNext
from brim.policies.clients import ClientRule
from brim.policies.compress import DEFAULT_ORDER, Outcome, build_policies, compress_request
from brim.policies.conversation import Policy, text_tokens_for
from brim.policies.lines import cut_middle
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.base import (
    Splice,
    SseEvent,
    SseEvents,
    ToolCall,
    ToolSpec,
    TurnReader,
    Usage,
    Wire,
)

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.restore")

RESTORE_TOOL = ToolSpec(
    name="brim_restore",
    description=(
        "Fetch back the original of something removed or shortened to fit the context window. "
        "Placeholders, notices and summaries in this conversation name what they stand for as "
        "sha256:<16 hex digits>. Call this with that key when you need the exact content (a "
        "file, a log, a tool result, earlier messages) instead of guessing it."
    ),
    parameters={
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "the key as shown, e.g. sha256:0123abcd…"},
        },
        "required": ["key"],
    },
)
GONE = (
    "[brim: {key} is no longer available (unknown or expired); continue without it or ask the "
    "user for it]"
)
MIN_RESULT_TOKENS = 64
RESULT_SLACK = 16  # tokens: a cut lands on line ends, its marker's count varies


def restore_offer(
    store: ContentStore | None, exchange: Exchange, clients: Mapping[str, ClientRule]
) -> dict[str, Any] | None:
    """The exchange's body with `brim_restore` added, for a stage about to cut it (the guard, the
    retry), where brim may offer it: the content store is on (None: restore is off), the
    client's rule allows it, and the request has no tool of that name yet (brim's own from an
    earlier cut, or the client's); else None. The tool counts in the cut, and goes only where
    the cut removed something the model can fetch back (`restorable`)."""
    assert exchange.body is not None and exchange.context is not None
    client = exchange.context.client
    rule = clients.get(client) if client else None
    if store is None or (rule is not None and not rule.restore):
        return None
    if RESTORE_TOOL.name in exchange.wire.tool_names(exchange.body):
        return None
    return exchange.wire.with_tool(exchange.body, RESTORE_TOOL)


def restorable(outcome: Outcome) -> bool:
    """Whether a cut removed something the model can fetch back (a record with a key)."""
    return any(record.archive_key for record in outcome.records)


class RestoreRounds:
    @classmethod
    def from_config(
        cls, config: PipelineConfig, services: Services, policies: Sequence[Policy]
    ) -> RestoreRounds | None:
        """None when `[restore]` is off (no content store among the services). `policies`: the
        pipeline's compression policies (the guard's)."""
        if services.store is None:
            return None
        return cls(
            services.store,
            services.counter,
            max_rounds=config.restore.max_rounds,
            policies=policies,
            archive=services.archive,
        )

    def __init__(
        self,
        store: ContentStore,
        counter: TokenCounter,
        *,
        max_rounds: int,
        policies: Sequence[Policy] | None = None,
        archive: ContentArchive | None = None,
    ) -> None:
        """`policies`: what makes room for a restored original (the guard's; default: brim's
        default policies); `archive`: where what that removes is kept for people, besides the
        `store`."""
        if not 1 <= max_rounds <= 10:
            raise ValueError(f"max_rounds must be between 1 and 10, not {max_rounds}")
        self.store = store
        self.counter = counter
        self.max_rounds = max_rounds
        self.policies = (
            list(policies) if policies is not None else build_policies(DEFAULT_ORDER, {})
        )
        self.archive = archive

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        report = exchange.report
        try:  # `_sent`, written out: every request takes this step, most offer no restore
            response = await call_next(exchange)
        finally:
            sent, report.sent = report.sent, None
        if not report.restore_offered or response.status >= 300:
            return response
        exchange = sent or exchange
        if exchange.body is None:
            return response
        if response.chunks is not None:
            return await self._streamed(exchange, response, call_next)
        reply = response.payload if response.payload is not None else _json(response.body)
        if not isinstance(reply, dict) or not self._restores(exchange.wire, reply):
            return response
        return await self._rounds(exchange, reply, Usage(), 0, call_next, response)

    def _restores(self, wire: Wire, reply: Mapping[str, Any]) -> list[ToolCall]:
        return [call for call in wire.reply_calls(reply) if call.name == RESTORE_TOOL.name]

    async def _rounds(
        self,
        exchange: Exchange,
        reply: dict[str, Any],
        earlier: Usage,
        rounds: int,
        call_next: CallNext,
        response: UpstreamResponse,
    ) -> UpstreamResponse:
        """Hidden rounds from a whole `reply` that calls brim_restore, until the model answers;
        the last round's response, streamed as it comes if the client asked for a stream."""
        wire = exchange.wire
        usage = earlier.added(wire.usage(reply) or Usage())
        while calls := self._restores(wire, reply):
            self._check_rounds(exchange, rounds)
            rounds += 1
            asked, response = await _sent(
                await self._asked(exchange, reply, calls, rounds), call_next
            )
            if response.status >= 300:
                return response
            if response.chunks is not None:
                return await self._streamed(asked, response, call_next, usage, rounds)
            found = response.payload if response.payload is not None else _json(response.body)
            if not isinstance(found, dict):
                return response
            exchange, reply = asked, found
            usage = usage.added(wire.usage(reply) or Usage())
        final = wire.with_usage(reply, usage)
        return UpstreamResponse(
            status=response.status,
            headers=response.headers,
            body=orjson.dumps(final),
            payload=final,
        )

    def _check_rounds(self, exchange: Exchange, rounds: int) -> None:
        """A turn that calls brim_restore after `rounds` rounds is one too many once the last
        round (asked to answer without tools) did so."""
        if rounds >= self.max_rounds:
            log.warning(
                "request %s: the model kept calling %s after %d rounds",
                exchange.request_id,
                RESTORE_TOOL.name,
                rounds,
            )
            raise UpstreamProtocolError(
                f"the model kept calling {RESTORE_TOOL.name} after {rounds} rounds",
                upstream=exchange.upstream,
            )

    async def _asked(
        self, exchange: Exchange, reply: Mapping[str, Any], calls: list[ToolCall], rounds: int
    ) -> Exchange:
        """The request of round `rounds`: `exchange`'s, with `reply`'s turn and brim's answers
        to its `calls`; tool calling turned off in the last round. The originals go out whole
        whenever they fit: where the request has no room for them, older content makes it —
        cleared or evicted by the policies (`_with_room`), the restored turn kept whole — before
        an original is cut. It carries its own size (`Outcome.tokens_out`: the retry cuts it
        from there, the next round counts on from there)."""
        assert exchange.body is not None and exchange.context is not None
        # brim offers the tool only in a request it cut (the guard or the retry): the cut's
        # outcome has the request's size and the limit it was cut to, both in brim's counts.
        outcome = exchange.context.outcome
        assert outcome is not None, f"{RESTORE_TOOL.name} offered in a request brim did not cut"
        wire, body, context = exchange.wire, exchange.body, exchange.context
        meter = exchange.meter(self.counter)
        originals = [await self._original(exchange, call) for call in calls]
        continued = wire.continued(body, reply, calls, [text for text, _ in originals])
        tokens = outcome.tokens_out + _added(wire, body, continued, meter)
        if tokens > outcome.limit:
            made = await self._with_room(exchange, continued, meter, outcome.limit)
            if made is not None:
                continued, tokens = made
            else:
                continued, tokens = self._cut_originals(
                    wire, body, reply, calls, originals, meter, outcome
                )
        if rounds >= self.max_rounds:
            continued = wire.with_tool_choice_none(continued)
        context = dataclasses.replace(
            exchange.context, outcome=dataclasses.replace(outcome, tokens_out=tokens)
        )
        return dataclasses.replace(exchange.with_body(continued), context=context)

    async def _with_room(
        self, exchange: Exchange, continued: dict[str, Any], meter: CounterMeter, limit: int
    ) -> tuple[dict[str, Any], int] | None:
        """`continued` (the request with the restored originals whole) made to fit `limit` by
        the policies, the restored turn — the newest — kept whole: older results cleared and
        turns evicted first, and only where that cannot make the room, a cut into text, which
        comes to the restored turn last (`policies.compress`). Its size, and what was removed
        kept under the keys its stand-ins name (`keep_originals`); None if it cannot fit."""

        def run(text_cuts: bool) -> Outcome:
            return compress_request(
                continued, meter, self.policies, limit=limit, low_water=1.0, text_cuts=text_cuts
            )

        large = len(orjson.dumps(continued)) > OFF_LOOP_BYTES
        for text_cuts in (False, True):
            made = await asyncio.to_thread(run, text_cuts) if large else run(text_cuts)
            if made.fits:
                await keep_originals(self.archive, self.store, made, exchange)
                log.info(
                    "request %s: made room for a restored original (%s)",
                    exchange.request_id,
                    made.actions,
                )
                return exchange.wire.with_conversation(continued, made.messages), made.tokens_out
        return None

    def _cut_originals(
        self,
        wire: Wire,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: list[ToolCall],
        originals: list[tuple[str, bool]],
        meter: CounterMeter,
        outcome: Outcome,
    ) -> tuple[dict[str, Any], int]:
        """The request with the originals cut to share the room it has left, where nothing
        could make more: the reply's own turn (its text, thinking, the calls) and the results'
        wrapping come first; the originals share what is left (a share is tokens of text: the
        room is in the provider's). A cut's marker and the rounding of each item's count can
        take a share past its room: then again, each share that much (and a little) less."""
        turn = _added(wire, body, wire.continued(body, reply, calls, [""] * len(calls)), meter)
        room = (outcome.limit - outcome.tokens_out - turn) // len(calls)
        share = max(MIN_RESULT_TOKENS, text_tokens_for(room, meter))
        tokens_of = [meter.tokens(text) if found else None for text, found in originals]
        for _ in range(4):
            results = [
                cut_middle(text, share, meter, tokens=own)[0] if own is not None else text
                for (text, _), own in zip(originals, tokens_of, strict=True)
            ]
            continued = wire.continued(body, reply, calls, results)
            tokens = outcome.tokens_out + _added(wire, body, continued, meter)
            over = tokens - outcome.limit
            if over <= 0 or share == MIN_RESULT_TOKENS:
                break
            less = text_tokens_for(over // len(calls), meter) + RESULT_SLACK
            share = max(MIN_RESULT_TOKENS, share - less)
        return continued, tokens

    async def _original(self, exchange: Exchange, call: ToolCall) -> tuple[str, bool]:
        """The original a call asks for, and True; or a note that it is gone, and False."""
        key = str(call.arguments.get("key", ""))
        original = await self.store.get(exchange.owner, key)  # another owner's: as unknown
        if original is None:
            log.info("request %s: restore of %r: not available", exchange.request_id, key[:80])
            exchange.report.restore_missing += (key,)
            return GONE.format(key=key[:80] or "the key"), False
        exchange.report.restored += (key,)
        return original, True

    async def _streamed(
        self,
        exchange: Exchange,
        response: UpstreamResponse,
        call_next: CallNext,
        earlier: Usage | None = None,
        rounds: int = 0,
    ) -> UpstreamResponse:
        """Hold the stream until its turn starts; a restore call first: read it whole and go on
        with hidden rounds; anything else: relay it as one reply (`_spliced`)."""
        assert response.chunks is not None
        wire = exchange.wire
        reader = wire.turn_reader()
        events = SseEvents()
        held: list[SseEvent] = []
        chunks = response.chunks
        async for chunk in chunks:
            for event in events.feed(chunk):
                held.append(event)
                reader.take(event.json)
            # a text turn goes at once; tool calls are short: such a turn is read to its end
            if reader.started == "text":
                break
        if reader.started == "call" and self._restores(wire, reply := reader.reply()):
            await response.aclose()
            usage = earlier or Usage()
            return await self._rounds(exchange, reply, usage, rounds, call_next, response)
        round_ = _Round(reader, events, held, chunks)
        spliced = self._spliced(exchange, response, round_, call_next, wire.splice(earlier), rounds)
        return UpstreamResponse(
            status=response.status, headers=response.headers, chunks=spliced, closer=response.aclose
        )

    async def _spliced(
        self,
        exchange: Exchange,
        response: UpstreamResponse,
        round_: _Round,
        call_next: CallNext,
        splice: Splice,
        rounds: int,
    ) -> AsyncIterator[bytes]:
        """The client's stream, relayed event by event as it comes, from `round_` (its events
        read so far and the rest of its stream) on. From a round's first tool call on, its
        events are held to the round's end: released as they came if none calls brim_restore;
        else the calls are answered, the provider asked again, and its next round streamed on
        as more of the same reply (`Wire.splice`). A failure once the client has the stream's
        start ends it with the API's error event (`proxy.relay`)."""
        wire = exchange.wire
        try:
            while True:
                reader, events = round_.reader, round_.events
                if out := splice.feed(round_.read):
                    yield out
                async for chunk in round_.rest:
                    if out := _fed(events.feed(chunk), reader, splice):
                        yield out
                if out := _fed(events.end(), reader, splice):
                    yield out
                reply = reader.reply()
                calls = self._restores(wire, reply)
                if not calls:
                    if out := splice.release():
                        yield out
                    return
                await response.aclose()
                self._check_rounds(exchange, rounds)
                if out := splice.answer(wire.usage(reply) or Usage()):
                    yield out
                rounds += 1
                asked = await self._asked(exchange, reply, calls, rounds)
                exchange, response = await self._continued(asked, call_next)
                assert response.chunks is not None
                round_ = _Round(wire.turn_reader(), SseEvents(), [], response.chunks)
        finally:
            await response.aclose()

    async def _continued(
        self, exchange: Exchange, call_next: CallNext
    ) -> tuple[Exchange, UpstreamResponse]:
        """The round that continues a reply the client is already reading, as sent (`_sent`),
        and its stream; or an `UpstreamFailure` (which ends the client's stream with the API's
        error event)."""
        try:
            exchange, response = await _sent(exchange, call_next)
        except BrimError as exc:
            log.warning(
                "request %s: the round after %s failed: %s",
                exchange.request_id,
                RESTORE_TOOL.name,
                exc.message,
            )
            if isinstance(exc, UpstreamFailure):
                raise
            raise UpstreamProtocolError(
                f"the round after {RESTORE_TOOL.name} failed: {exc.message}",
                upstream=exchange.upstream,
            ) from exc
        if response.status < 300 and response.chunks is not None:
            return exchange, response
        await response.aclose()
        log.warning("request %s: the round after a restore did not stream", exchange.request_id)
        raise UpstreamProtocolError(
            f"the round after {RESTORE_TOOL.name} answered HTTP {response.status} without a stream",
            upstream=exchange.upstream,
        )


@dataclass(frozen=True, slots=True)
class _Round:
    """One streamed round being relayed: its reader and event splitter, the events they have
    read so far (not yet relayed) and the rest of its stream."""

    reader: TurnReader
    events: SseEvents
    read: list[SseEvent]
    rest: AsyncIterator[bytes]


async def _sent(exchange: Exchange, call_next: CallNext) -> tuple[Exchange, UpstreamResponse]:
    """`call_next`'s response to `exchange`, and the request it answers: the retry's, where the
    retry cut it or changed its model (`RequestReport.sent`, taken off the report here), which
    the next round continues from; else `exchange`."""
    try:
        response = await call_next(exchange)
    finally:
        sent, exchange.report.sent = exchange.report.sent, None
    return sent or exchange, response


def _added(
    wire: Wire, body: Mapping[str, Any], continued: Mapping[str, Any], meter: CounterMeter
) -> int:
    """The tokens of what `continued` appends to `body`'s conversation (`Wire.continued`)."""
    return sum(
        meter.message(item) for item in wire.conversation(continued)[len(wire.conversation(body)) :]
    )


def _fed(events: list[SseEvent], reader: TurnReader, splice: Splice) -> bytes:
    for event in events:
        reader.take(event.json)
    return splice.feed(events)


def _json(body: bytes | None) -> Any:
    try:
        return orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None


async def keep_originals(
    archive: ContentArchive | None,
    store: ContentStore | None,
    outcome: Outcome,
    exchange: Exchange,
) -> None:
    """Keep what the policies removed, under the keys their records name, before it goes: in
    the archive (for people) and the content store (for `brim_restore`), both the exchange's
    owner's."""
    items = [(r.archive_key, r.original) for r in outcome.records if r.archive_key and r.original]
    exchange.report.archive_keys += tuple(key for key, _ in items)
    if archive is not None and items:
        await asyncio.to_thread(archive.put_many, exchange.owner, items)
    if store is not None and items:
        await store.put_many(exchange.owner, items)
