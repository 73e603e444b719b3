"""Hidden restore rounds, on every wire API: a reply that calls `brim_restore` is answered by
brim from the content store and the provider is asked again; the client sees only the answer.

The stage runs behind `ResolveLimits` (for the budget) in front of a scripted upstream that
answers each round with the next reply; replies and checks come from the shapes each API's
tests use (`tests.policies.wires.test_restore_shapes`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import UpstreamProtocolError
from brim.adapters.exchange import ANONYMOUS, Exchange
from brim.middleware.services.store import MemoryStore
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.middleware.stages.restore import RESTORE_TOOL, RestoreRounds
from brim.policies.compress import compress_request
from brim.policies.conversation import archive_key
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.base import Usage, json_event, sse_data
from brim.proxy.app import bound_port, start
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import exchange
from tests.fakes import LoopThread, start_app
from tests.policies.wires.test_restore_shapes import (
    CLIENT_CALL,
    HEARD,
    SHAPES,
    Call,
    Heard,
    Say,
    Shape,
    Turn,
)
from tests.restoring import (
    MODELS,
    SHAPE_OF,
    Restoring,
    brim_config,
    chat_body,
    gemini_body,
    logs,
    messages_body,
    responses_body,
    restored,
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
    for at in range(0, len(data), 97):  # events split across reads
        yield data[at : at + 97]


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
    await store.put_many(ANONYMOUS, [(KEY, ORIGINAL)])  # the exchange's owner
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
        # As the guard does when it cut something: the tool offered, the cut on the context.
        ex.report.restore_offered = True
        assert ex.body is not None and ex.context is not None
        meter = CounterMeter(COUNTER, ex.context.limits.limits.tokenizer, ex.model, ex.wire)
        limit = ex.context.budget.effective
        cut = compress_request(ex.body, meter, [], limit=limit, low_water=1.0)
        context = dataclasses.replace(ex.context, outcome=cut)
        return await stage(dataclasses.replace(ex, context=context), upstream)

    body = shape.wire.with_tool(shape.body(), RESTORE_TOOL)
    ex = exchange(shape.api, model, body, stream=stream)
    response = await limits(ex, offered)
    if response.chunks is None:
        final = response.payload
    else:
        data = b"".join([chunk async for chunk in response.chunks])
        reader = shape.wire.turn_reader()
        for event in sse_data(data):
            reader.take(json_event(event))
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
    assert ex.report.restored == (f"sha256:{KEY[:16]}",)


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
    assert ex.report.restored == ()
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


# ---- through a running brim: a restore after text, streamed to the official SDKs --------------
#
# A provider scripted round by round (`Restoring` with a script, from tests/restoring.py)
# streams each turn the way its API does (`round_stream`, from the shapes); its brim_restore
# calls ask for the first key the request shows. brim cuts the client's long conversation, so it
# offers the tool; the client reads the stream with its own SDK (Gemini, which has none here,
# over plain HTTP as the Gemini CLI does).

T1, T2, T3 = Usage(3000, 40, 2048), Usage(5200, 60, 3000), Usage(6100, 35, 5000)


def brims_restore(text: str) -> Turn:
    """Text, then a call of brim_restore (its key filled in by `Restoring`)."""
    return Turn((Say(text), Call("call_restore_1", RESTORE_TOOL.name, {})), T1)


@dataclass(frozen=True)
class Client:
    """One wire API as its clients speak it: a long conversation whose tool results brim must
    cut, read through the official SDK (`heard`), or as raw bytes (`raw`)."""

    api: str
    path: str
    body: Callable[[list[str]], dict[str, Any]]
    heard: Callable[[str, dict[str, Any]], Heard]


def chat_heard(base: str, body: dict[str, Any]) -> Heard:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    ids = set()
    create = {k: v for k, v in body.items() if k != "stream"}
    with sdk.chat.completions.stream(**create) as stream:
        for event in stream:
            if event.type == "chunk":
                ids.add(event.chunk.id)
        completion = stream.get_final_completion()
    message = completion.choices[0].message
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return Heard(
        message.content or "",
        [c.function.name for c in message.tool_calls or [] if c.type == "function"],
        Usage(
            usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens
        ),
        sorted(ids),
    )


def messages_heard(base: str, body: dict[str, Any]) -> Heard:
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0)
    with sdk.messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as stream:
        message = stream.get_final_message()
    u = message.usage
    read, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    return Heard(
        "".join(b.text for b in message.content if b.type == "text"),
        [b.name for b in message.content if b.type == "tool_use"],
        Usage(u.input_tokens + read + written, u.output_tokens, u.cache_read_input_tokens),
        [message.id],
    )


def responses_heard(base: str, body: dict[str, Any]) -> Heard:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    with sdk.responses.stream(**{k: v for k, v in body.items() if k != "stream"}) as stream:
        ids = [event.response.id for event in stream if event.type == "response.created"]
        final = stream.get_final_response()
    usage = final.usage
    assert usage is not None
    return Heard(
        final.output_text,
        [item.name for item in final.output if item.type == "function_call"],
        Usage(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens),
        list(dict.fromkeys([*ids, final.id])),
    )


def gemini_heard(base: str, body: dict[str, Any]) -> Heard:
    heard, errors = HEARD["gemini.generate"](raw(base, GEMINI, body))
    assert errors == []
    return heard


CHAT = Client("openai.chat", "/v1/chat/completions", partial(chat_body, stream=True), chat_heard)
MESSAGES = Client(
    "anthropic.messages", "/v1/messages", partial(messages_body, stream=True), messages_heard
)
RESPONSES = Client(
    "openai.responses", "/v1/responses", partial(responses_body, stream=True), responses_heard
)
GEMINI = Client(
    "gemini.generate",
    f"/v1beta/models/{MODELS['gemini']}:streamGenerateContent?alt=sse",
    gemini_body,
    gemini_heard,
)
CLIENTS = [CHAT, MESSAGES, RESPONSES, GEMINI]
each_client = pytest.mark.parametrize("client", CLIENTS, ids=[c.api for c in CLIENTS])


def raw(base: str, client: Client, body: dict[str, Any]) -> bytes:
    """The stream's bytes as the client receives them."""
    headers = {"authorization": "Bearer sk-client", "x-api-key": "sk-ant-client"}
    headers["x-goog-api-key"] = "AIza-client"
    with httpx.stream("POST", base + client.path, json=body, headers=headers, timeout=60) as got:
        assert got.status_code == 200, got.read()
        return got.read()


@pytest.fixture
def through(loop_thread: LoopThread) -> Iterator[Callable[..., tuple[str, Restoring]]]:
    """brim, restore on, in front of a `Restoring` provider playing `script`: (brim's base URL,
    the provider)."""
    runners: list[Any] = []

    def make(script: list[Turn | int], **restore: Any) -> tuple[str, Restoring]:
        fake = Restoring(script=script)
        runner, url = loop_thread.run(start_app(fake.app()))
        runners.append(runner)
        # The scripted turns report a fixed usage (T1, …), not a count of the request: no
        # token ratio is learned from them (it would change how the next request is cut).
        config = brim_config(
            url,
            upstream={"native_count": False},
            restore=restore,
            guard={"learn_token_ratios": False},
        )
        brim = loop_thread.run(start(config, "127.0.0.1", 0))
        runners.append(brim)
        return f"http://127.0.0.1:{bound_port(brim)}", fake

    yield make
    for runner in reversed(runners):
        loop_thread.run(runner.cleanup())


def restored_in(client: Client, body: dict[str, Any], texts: list[str]) -> list[str]:
    """The originals of `texts` that answer brim_restore calls in a request."""
    wire = SHAPE_OF[client.api].wire
    answered = orjson.dumps(wire.conversation(body)[-1]).decode()
    return [t for t in texts if orjson.dumps(t).decode()[1:-1] in answered]


def one_reply(client: Client, fake: Restoring) -> list[str]:
    """The ids a client reads a reply spliced from `fake`'s rounds under: the first round's (a
    Responses stream's completed response is the last round's, the one stored with the answer:
    what a client's next `previous_response_id` names)."""
    if client is RESPONSES:
        return ["resp_1", f"resp_{len(fake.calls)}"]
    first = {
        "openai.chat": "chatcmpl-1",
        "anthropic.messages": "msg_1",
        "gemini.generate": "resp-1",
    }
    return [first[client.api]]


@each_client
def test_a_restore_after_text_streams_on_as_the_same_reply(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    script: list[Turn | int] = [
        brims_restore("Let me fetch the cut log. "),
        Turn((Say("It says the build timed out."),), T2),
    ]
    base, fake = through(script)
    texts = logs()
    heard = client.heard(base, client.body(texts))

    assert len(fake.calls) == 2
    first, second = (call.body for call in fake.calls)
    assert RESTORE_TOOL.name in orjson.dumps(first).decode()  # cut, so offered
    shape = SHAPE_OF[client.api]
    assert shape.errors(shape.wire.conversation(second)) == []
    assert len(restored_in(client, second, texts)) == 1  # the original came back
    assert "Let me fetch the cut log." in orjson.dumps(second).decode()  # the relayed text too
    assert heard.text == "Let me fetch the cut log. It says the build timed out."
    assert heard.calls == []
    assert heard.usage == T1.added(T2)
    assert heard.ids == one_reply(client, fake)


@each_client
def test_text_then_a_client_call_goes_on_byte_for_byte(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    base, fake = through([Turn((Say("Reading b.py."), CLIENT_CALL), T1)])
    body = client.body(logs())
    got = raw(base, client, body)
    assert len(fake.calls) == 1
    assert RESTORE_TOOL.name in orjson.dumps(fake.calls[0].body).decode()  # offered, not called
    assert got == fake.sent[0]
    heard = client.heard(base, body)
    assert (heard.text, heard.calls) == ("Reading b.py.", [CLIENT_CALL.name])


@each_client
def test_a_client_call_beside_a_restore_after_text_is_dropped(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    both = Turn((Say("Two things. "), CLIENT_CALL, Call("call_r", RESTORE_TOOL.name, {})), T1)
    base, fake = through([both, Turn((Say("Found it."),), T2)])
    heard = client.heard(base, client.body(logs()))
    assert len(fake.calls) == 2
    tail = orjson.dumps(SHAPE_OF[client.api].wire.conversation(fake.calls[1].body)[-2:]).decode()
    assert CLIENT_CALL.name not in tail and RESTORE_TOOL.name in tail
    assert (heard.text, heard.calls) == ("Two things. Found it.", [])
    assert heard.usage == T1.added(T2)


@each_client
def test_a_restore_after_text_in_a_continuation_round(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    again = Turn((Say("One more piece. "), Call("call_r2", RESTORE_TOOL.name, {})), T2)
    script: list[Turn | int] = [brims_restore("A first piece. "), again, Turn((Say("Done."),), T3)]
    base, fake = through(script)
    heard = client.heard(base, client.body(logs()))
    assert len(fake.calls) == 3
    shape = SHAPE_OF[client.api]
    assert shape.errors(shape.wire.conversation(fake.calls[2].body)) == []
    assert (heard.text, heard.calls) == ("A first piece. One more piece. Done.", [])
    assert heard.usage == T1.added(T2).added(T3)
    assert heard.ids == one_reply(client, fake)


ERROR_EVENT: dict[str, Callable[[dict[str, Any]], bool]] = {
    "openai.chat": lambda data: "error" in data,
    "anthropic.messages": lambda data: data.get("type") == "error" and "error" in data,
    "openai.responses": lambda data: data.get("type") == "error" and "message" in data,
    "gemini.generate": lambda data: "error" in data,
}


def ends_in_error(client: Client, stream: bytes) -> str:
    """The stream's text, checking that it ends with the API's own error event and makes no
    tool call."""
    datas = sse_data(stream)
    assert ERROR_EVENT[client.api](orjson.loads(datas[-1])), datas[-1]
    assert RESTORE_TOOL.name.encode() not in b"".join(datas[:-1])
    reader = SHAPE_OF[client.api].wire.turn_reader()
    for data in datas[:-1]:
        reader.take(json_event(data))
    reply = reader.reply()
    assert SHAPE_OF[client.api].wire.reply_calls(reply) == []
    return orjson.dumps(reply).decode()


@each_client
def test_a_model_that_keeps_restoring_after_text_ends_the_stream_with_an_error(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    base, fake = through([brims_restore("Still missing. ")], max_rounds=2)
    got = raw(base, client, client.body(logs()))
    assert len(fake.calls) == 3  # the request and two rounds, the last without tools
    choice_none = SHAPE_OF[client.api].choice_none
    assert {k: fake.calls[-1].body.get(k) for k in choice_none} == choice_none
    assert ends_in_error(client, got).count("Still missing.") == 3


@each_client
def test_a_failed_continuation_ends_the_stream_with_an_error_event(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    # (twice: the SDK's request below fails the same way, in its stream, not before it)
    base, fake = through([brims_restore("Let me fetch it. "), 500] * 2)
    got = raw(base, client, client.body(logs()))
    assert len(fake.calls) == 2
    assert "Let me fetch it." in ends_in_error(client, got)
    if client is CHAT:  # the SDK raises the provider's kind of error
        with pytest.raises(openai.APIError) as raised:
            client.heard(base, client.body(logs()))
        assert not isinstance(raised.value, openai.APIStatusError)  # from the stream's event
    if client is MESSAGES:
        with pytest.raises(anthropic.APIError) as raised:
            client.heard(base, client.body(logs()))
        assert getattr(raised.value, "status_code", None) == 200  # from the stream's event
    if client is RESPONSES:  # the SDK hands on the API's error event; no response completes
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
        body = {k: v for k, v in client.body(logs()).items() if k != "stream"}
        with sdk.responses.stream(**body) as stream:
            events = list(stream)
            with pytest.raises(RuntimeError, match=r"response\.completed"):
                stream.get_final_response()
        assert events[-1].type == "error" and events[-1].message
        assert [e.type for e in events].count("error") == 1
    if client is GEMINI:  # Google's error object, which the Gemini CLI's client throws
        error = orjson.loads(sse_data(got)[-1])["error"]
        assert isinstance(error["code"], int) and error["code"] >= 400
        assert error["status"] and error["message"]


# Text the model writes before it calls brim_restore: ~900 tokens, less than the room the
# guard's cut leaves, which the original would fill on its own.
LONG_SAY = " ".join(
    f"Step {n}: the cache key for stage {n} matched, so it was skipped." for n in range(50)
)


@each_client
def test_a_restore_after_long_text_is_answered_within_the_budget(
    client: Client, through: Callable[..., tuple[str, Restoring]]
) -> None:
    """A restored original goes out whole, the reply's own turn (its text before the call)
    counted too: older content makes the room (results cleared, turns evicted), and the next
    round stays within the budget."""
    script: list[Turn | int] = [
        Turn((Say(LONG_SAY), Call("call_r", RESTORE_TOOL.name, {})), T1),
        Turn((Say("Done."),), T2),
    ]
    base, fake = through(script)
    texts = [logs("long", 1, lines=200)[0], *logs()]
    headers = {"authorization": "Bearer sk-client", "x-api-key": "sk-ant-client"}
    headers["x-goog-api-key"] = "AIza-client"
    body = client.body(texts)
    with httpx.stream("POST", base + client.path, json=body, headers=headers, timeout=60) as got:
        assert got.status_code == 200, got.read()
        heard, errors = HEARD[client.api](got.read())
    assert errors == []
    assert heard.text == LONG_SAY + "Done."
    first, second = fake.calls
    assert LONG_SAY in orjson.dumps(second.body).decode()
    (result,) = restored(second.api, second.body)
    assert result == texts[0]  # whole: the room came from older content
    assert second.tokens <= int(got.headers["x-brim-budget"]), (first.tokens, second.tokens)
