"""Hidden restore rounds: the model fetches back what brim cut, within the same request.

When the guard or the retry cut a request, they offer the model one more tool, `brim_restore`
(`RESTORE_TOOL`, added at the end of the request's tools in its own wire format), and every
placeholder, notice and summary names the key of what it stands for. When the provider's reply
calls it, this stage answers the call itself from the content store — the original, cut to the
room the request has left — appends the call and its result, and asks the provider again, at
most `max_rounds` times (the last round with tool calls turned off, so the model answers). The
client gets only the final reply, its usage the sum over the rounds; client tool calls made in
the same turn as a restore are dropped from the hidden round (the model makes them again once it
has the content).

Streams are held only until it is clear how the turn starts: a turn that starts with text is
relayed at once, as it comes; one that starts with a restore call is read to its end, answered,
and the final round's stream is relayed with the usage of every round.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from adapters.base import UpstreamResponse
from adapters.errors import UpstreamProtocolError
from adapters.exchange import Exchange
from middleware.base import CallNext
from middleware.observe import EventData
from middleware.store import ContentStore
from policies.clients import ClientRule
from policies.prune import cut_middle
from policies.tokens import CounterMeter, TokenCounter
from policies.wires.base import ToolCall, ToolSpec, Usage, Wire

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


def offers_restore(
    wire: Wire, body: Mapping[str, Any], client: str | None, clients: Mapping[str, ClientRule]
) -> bool:
    """Whether brim may add `brim_restore` to this request: restore is on for its client and the
    client's own tools do not already use the name."""
    rule = clients.get(client) if client else None
    if rule is not None and not rule.restore:
        return False
    return RESTORE_TOOL.name not in wire.tool_names(body)


class RestoreRounds:
    def __init__(self, store: ContentStore, counter: TokenCounter, *, max_rounds: int) -> None:
        if not 1 <= max_rounds <= 10:
            raise ValueError(f"max_rounds must be between 1 and 10, not {max_rounds}")
        self.store = store
        self.counter = counter
        self.max_rounds = max_rounds

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        response = await call_next(exchange)
        if not exchange.report.restore_offered or exchange.body is None or response.status >= 300:
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
        assert exchange.body is not None
        body: dict[str, Any] = exchange.body
        usage = earlier.added(wire.usage(reply) or Usage())
        while calls := self._restores(wire, reply):
            if rounds >= self.max_rounds:  # asked to answer without tools, and did not
                raise UpstreamProtocolError(
                    f"the model kept calling {RESTORE_TOOL.name} after {rounds} rounds",
                    upstream=exchange.upstream,
                )
            rounds += 1
            share = self._share(exchange, body, len(calls))
            results = [await self._result(exchange, call, share) for call in calls]
            body = wire.continued(body, reply, calls, results)
            if rounds >= self.max_rounds:
                body = wire.with_tool_choice_none(body)
            asked = exchange.with_body(body)
            response = await call_next(asked)
            if response.status >= 300:
                return response
            if response.chunks is not None:
                return await self._streamed(asked, response, call_next, usage, rounds)
            found = response.payload if response.payload is not None else _json(response.body)
            if not isinstance(found, dict):
                return response
            reply = found
            usage = usage.added(wire.usage(reply) or Usage())
        final = wire.with_usage(reply, usage)
        return UpstreamResponse(
            status=response.status,
            headers=response.headers,
            body=orjson.dumps(final),
            payload=final,
        )

    def _share(self, exchange: Exchange, body: Mapping[str, Any], calls: int) -> int:
        """Tokens each of a round's `calls` may have: the room the request has left."""
        assert exchange.context is not None
        tokenizer = exchange.context.limits.limits.tokenizer
        used = self.counter.request(exchange.wire, body, tokenizer, exchange.model).total
        room = exchange.context.budget.effective() - used - 200 * calls  # the turn's own items
        return max(MIN_RESULT_TOKENS, room // calls)

    async def _result(self, exchange: Exchange, call: ToolCall, share: int) -> str:
        """The original a call asks for, cut to `share` tokens."""
        key = str(call.arguments.get("key", ""))
        original = await self.store.get(key)
        if original is None:
            log.info("request %s: restore of %r: not available", exchange.request_id, key[:80])
            return GONE.format(key=key[:80] or "the key")
        exchange.report.restored.append(key)
        assert exchange.context is not None
        tokenizer = exchange.context.limits.limits.tokenizer
        meter = CounterMeter(self.counter, tokenizer, exchange.model, exchange.wire)
        return cut_middle(original, share, meter)[0]

    async def _streamed(
        self,
        exchange: Exchange,
        response: UpstreamResponse,
        call_next: CallNext,
        earlier: Usage | None = None,
        rounds: int = 0,
    ) -> UpstreamResponse:
        """Hold the stream until its turn starts; a restore call first: read it whole and go on
        with hidden rounds; anything else: relay it (with earlier rounds' usage added)."""
        assert response.chunks is not None
        wire = exchange.wire
        reader = wire.turn_reader()
        events = EventData()
        held: list[bytes] = []
        chunks = response.chunks
        async for chunk in chunks:
            held.append(chunk)
            for event in events.feed(chunk):
                reader.feed(event)
            # a text turn goes at once; tool calls are short: such a turn is read to its end
            if reader.started == "text":
                break
        if reader.started == "call" and self._restores(wire, reply := reader.reply()):
            await response.aclose()
            usage = earlier or Usage()
            return await self._rounds(exchange, reply, usage, rounds, call_next, response)
        relayed = _relay(held, chunks, wire, earlier)
        return UpstreamResponse(
            status=response.status,
            headers=response.headers,
            chunks=relayed,
            closer=response.aclose,
        )


async def _relay(
    held: Sequence[bytes], rest: AsyncIterator[bytes], wire: Wire, earlier: Usage | None
) -> AsyncIterator[bytes]:
    """The held chunks, then the rest, with `earlier` usage added to every usage report."""
    if earlier is None:
        for chunk in held:
            yield chunk
        async for chunk in rest:
            yield chunk
        return
    pending = b""

    def rewrite(chunk: bytes) -> bytes:
        nonlocal pending
        data = pending + chunk
        end = data.rfind(b"\n") + 1
        complete, pending = data[:end], data[end:]
        lines = []
        for line in complete.splitlines(keepends=True):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                ending = line[len(line.rstrip(b"\r\n")) :]
                line = b"data: " + wire.stream_usage(line[5:].strip(), earlier) + ending
            lines.append(line)
        return b"".join(lines)

    for chunk in held:
        if out := rewrite(chunk):
            yield out
    async for chunk in rest:
        if out := rewrite(chunk):
            yield out
    if pending:
        yield pending


def _json(body: bytes | None) -> Any:
    try:
        return orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None
