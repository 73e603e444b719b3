"""Hidden restore rounds, on every wire API: a reply that calls `brim_restore` is answered by
brim from the content store and the provider is asked again; the client sees only the answer.

The stage runs behind `ResolveLimits` (for the budget) in front of a scripted upstream that
answers each round with the next reply; replies and checks come from the shapes each API's
tests use (`tests.policies.wires.test_restore_shapes`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from adapters.base import UpstreamResponse
from adapters.errors import UpstreamProtocolError
from adapters.exchange import Exchange
from middleware.limits import ResolveLimits
from middleware.restore import RESTORE_TOOL, RestoreRounds
from middleware.store import MemoryStore
from policies.conversation import archive_key
from policies.limits import LimitsRegistry, ModelFacts
from policies.tokens import TokenCounter
from policies.wires.base import Usage, sse_data
from proxy.resources import use_bundled_tiktoken_files
from tests.builders import exchange
from tests.policies.wires.test_restore_shapes import (
    CLIENT_CALL,
    SHAPES,
    Call,
    Say,
    Shape,
    Turn,
)

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
ORIGINAL = (
    "\n".join(f"deploy.log line {n}: ok" for n in range(40)) + "\nthe key rotates on tuesdays"
)
KEY = archive_key(ORIGINAL)
FIRST = Usage(input=1000, output=20, cached_input=0)
SECOND = Usage(input=1400, output=30, cached_input=1000)
each_shape = pytest.mark.parametrize("shape", SHAPES, ids=[s.api for s in SHAPES])


def restore_call(key: str) -> Call:
    return Call("call_restore_1", RESTORE_TOOL.name, {"key": f"sha256:{key[:16]}"})


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 97):  # events split across reads
        yield data[start : start + 97]


def scripted(shape: Shape, turns: list[Turn], stream: bool, seen: list[dict[str, Any]]) -> Any:
    async def upstream(ex: Exchange) -> UpstreamResponse:
        assert ex.body is not None
        seen.append(ex.body)
        turn = turns[min(len(seen), len(turns)) - 1]
        if stream:
            return UpstreamResponse(status=200, headers={}, chunks=_chunks(shape.stream(turn, 3)))
        reply = shape.reply(turn)
        return UpstreamResponse(status=200, headers={}, body=orjson.dumps(reply), payload=reply)

    return upstream


async def run(
    shape: Shape,
    turns: list[Turn],
    *,
    stream: bool = False,
    max_rounds: int = 3,
    seen: list[dict[str, Any]] | None = None,
) -> tuple[Exchange, list[dict[str, Any]], dict[str, Any]]:
    """The stage over `turns`; what the client got, and every request the upstream saw (also
    in `seen`, when given, if the stage raises)."""
    store = MemoryStore(1 << 20, 3600)
    await store.put_many([(KEY, ORIGINAL)])
    model = "m-restore"
    limits = ResolveLimits(
        LimitsRegistry({model: ModelFacts(context_window=200_000, max_output=4_000)}),
        COUNTER,
        safety_margin=0.05,
        clients={},
    )
    stage = RestoreRounds(store, COUNTER, max_rounds=max_rounds)
    seen = [] if seen is None else seen
    upstream = scripted(shape, turns, stream, seen)

    async def offered(ex: Exchange) -> UpstreamResponse:
        ex.report.restore_offered = True  # as the guard does when it cut something
        return await stage(ex, upstream)

    body = shape.wire.with_tool(shape.body(), RESTORE_TOOL)
    ex = exchange(shape.api, model, body, stream=stream)
    response = await limits(ex, offered)
    if response.chunks is None:
        final = response.payload
    else:
        data = b"".join([chunk async for chunk in response.chunks])
        reader = shape.wire.turn_reader()
        for event in sse_data(data):
            reader.feed(event)
        final = reader.reply()
    return ex, seen, final


@each_shape
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_restore_call_is_answered_from_the_store_and_hidden_from_the_client(
    shape: Shape, stream: bool
) -> None:
    turns = [
        Turn((restore_call(KEY), CLIENT_CALL), FIRST),
        Turn((Say("It rotates on tuesdays."),), SECOND),
    ]
    ex, seen, final = asyncio.run(run(shape, turns, stream=stream))
    assert len(seen) == 2
    wire = shape.wire
    second = wire.conversation(seen[1])
    assert shape.errors(second) == []
    answered = wire.dialect.text(second[-1]) + orjson.dumps(second[-1]).decode()
    assert "the key rotates on tuesdays" in answered
    assert CLIENT_CALL.name not in orjson.dumps(second[-2:]).decode()  # dropped from the round
    assert wire.reply_calls(final) == []
    assert RESTORE_TOOL.name not in orjson.dumps(final).decode()
    usage = wire.usage(final)
    assert usage is not None
    assert (usage.input, usage.output) == (2400, 50)
    assert ex.report.restored == [f"sha256:{KEY[:16]}"]


@each_shape
def test_an_unknown_key_is_answered_as_no_longer_available(shape: Shape) -> None:
    turns = [
        Turn((restore_call("0" * 64),), FIRST),
        Turn((Say("Going on without it."),), SECOND),
    ]
    ex, seen, final = asyncio.run(run(shape, turns))
    second = shape.wire.conversation(seen[1])
    assert "no longer available" in orjson.dumps(second[-1]).decode()
    assert shape.errors(second) == []
    assert ex.report.restored == []
    assert shape.wire.reply_calls(final) == []


@each_shape
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_last_round_turns_tools_off_and_a_model_that_ignores_it_is_an_error(
    shape: Shape, stream: bool
) -> None:
    turns = [Turn((restore_call(KEY),), FIRST)]  # the model never stops asking
    seen: list[dict[str, Any]] = []
    with pytest.raises(UpstreamProtocolError):
        asyncio.run(run(shape, turns, stream=stream, max_rounds=2, seen=seen))
    assert len(seen) == 3  # the request and two rounds
    assert {k: seen[-1].get(k) for k in shape.choice_none} == shape.choice_none
    assert not any(seen[0].get(k) == v for k, v in shape.choice_none.items())


@each_shape
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_turn_without_restore_goes_to_the_client_as_it_came(shape: Shape, stream: bool) -> None:
    turns = [Turn((Say("Done."), CLIENT_CALL), FIRST)]
    _, seen, final = asyncio.run(run(shape, turns, stream=stream))
    assert len(seen) == 1
    assert [c.name for c in shape.wire.reply_calls(final)] == [CLIENT_CALL.name]
