"""One client never shrinks a model's window for the others.

A provider names an unknown field back as the client spelled it — OpenAI "Unrecognized request
argument supplied: <field>", Anthropic "<field>: Extra inputs are not permitted", Gemini
'Unknown name "<field>"', Responses "Unknown parameter: '<field>'" — so a client can make any
provider error say "maximum context length is 1 tokens". brim learns a window only from the
provider's own overflow sentence, where its own count of the request bears it out and the window
lies within the registry's bounds; what Redis holds is checked the same way on read; and an
operator can list and forget what was learned (`brim limits`), on every instance at once.

The clients are the official SDKs (plain HTTP for Gemini, whose SDK is not among the test
tools) against a running brim in front of `Echoing`: the fake provider of tests/fakes.py behind
the providers' real unknown-field and overflow replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import redis
from aiohttp import web

from brim.policies.wires import WIRES
from brim.proxy.commands import main
from tests.conftest import BrimFactory, RedisServer, every_api
from tests.fakes import FakeProvider, LoopThread, counted, start_app, wait_for

ADMIN = "learned-admin-key-0123456789"
ADMIN_ENV = "LEARNED_LIMITS_ADMIN_KEYS"
FAST = {"refresh_s": 0.05, "retry_s": 0.2, "timeout_s": 1}  # sync often, retry soon
REAL_WINDOW = 8_000  # what the fake's "-w8000" models hold
TOLD = 24_000  # what brim is told they hold: 3 times too much (within its 8x bounds)

# The fields each API knows; any other is answered the way the real provider answers it.
KNOWN_FIELDS = {
    "openai.chat": {
        "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
        "tools", "tool_choice", "temperature", "top_p", "n", "stop", "user", "seed",
        "response_format", "parallel_tool_calls", "metadata", "store",
    },
    "openai.responses": {
        "model", "input", "instructions", "max_output_tokens", "stream", "tools", "tool_choice",
        "temperature", "top_p", "previous_response_id", "store", "reasoning", "text",
        "metadata", "parallel_tool_calls", "truncation", "include", "user",
    },
    "anthropic.messages": {
        "model", "messages", "system", "max_tokens", "stream", "tools", "tool_choice",
        "temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking",
    },
    "gemini.generate": {
        "contents", "systemInstruction", "system_instruction", "generationConfig",
        "generation_config", "tools", "toolConfig", "tool_config", "safetySettings",
        "cachedContent",
    },
}  # fmt: skip


def error_body(api: str, message: str, *, code: str | None = None) -> dict[str, Any]:
    """A 400 as `api`'s provider shapes it, saying `message`."""
    if api == "anthropic.messages":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if api == "gemini.generate":
        return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return {"error": error}


def unknown_field(api: str, name: str) -> dict[str, Any]:
    """The provider's reply to a request with a field it does not know, naming it."""
    return {
        "openai.chat": error_body(api, f"Unrecognized request argument supplied: {name}"),
        "openai.responses": error_body(
            api, f"Unknown parameter: '{name}'.", code="unknown_parameter"
        ),
        "anthropic.messages": error_body(api, f"{name}: Extra inputs are not permitted"),
        "gemini.generate": error_body(
            api, f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
        ),
    }[api]


def overflow(api: str, tokens: int, window: int) -> dict[str, Any]:
    """The provider's own reply to a request over its window, in its own words."""
    said = {
        "openai.chat": f"This model's maximum context length is {window} tokens. However, your "
        f"messages resulted in {tokens} tokens. Please reduce the length of the messages.",
        "openai.responses": "Your input exceeds the context window of this model. Please "
        "adjust your input and try again.",
        "anthropic.messages": f"prompt is too long: {tokens} tokens > {window} maximum",
        "gemini.generate": f"The input token count ({tokens}) exceeds the maximum number of "
        f"tokens allowed ({window}).",
    }[api]
    return error_body(api, said, code="context_length_exceeded")


def api_of(path: str) -> str:
    if path.endswith("/chat/completions"):
        return "openai.chat"
    if path.endswith("/responses"):
        return "openai.responses"
    if path.endswith("/messages"):
        return "anthropic.messages"
    return "gemini.generate"


@dataclass
class Echoing:
    """The fake provider, behind the real providers' answers to an unknown field, and to a
    request over the window of a model named `…-wN` (N tokens). A model named `liar-…` states
    a 2 000-token window for any request, however small. `calls` notes (api, model, tokens,
    reply) of each request."""

    provider: FakeProvider = field(default_factory=FakeProvider)
    calls: list[tuple[str, str, int, str]] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        @web.middleware
        async def as_providers_do(request: web.Request, handler: Any) -> web.StreamResponse:
            api = api_of(request.path)
            body = orjson.loads(await request.read())
            model = body.get("model") or request.match_info.get("target", "").split(":")[0]
            tokens = counted(api, body)
            unknown = sorted(set(body) - KNOWN_FIELDS[api])
            if unknown:
                self.calls.append((api, model, tokens, "unknown field"))
                return web.json_response(unknown_field(api, unknown[0]), status=400)
            stated = REAL_WINDOW if model.endswith("-w8000") else None
            if model.startswith(("liar-", "claude-liar-", "gemini-liar-")):
                stated, tokens = 2_000, 2_100
            if stated is not None and tokens > stated:
                self.calls.append((api, model, tokens, "overflow"))
                return web.json_response(overflow(api, tokens, stated), status=400)
            self.calls.append((api, model, tokens, "answer"))
            response: web.StreamResponse = await handler(request)
            return response

        app = self.provider.app()
        app.middlewares.append(as_providers_do)
        return app

    def replies(self) -> list[str]:
        return [reply for *_, reply in self.calls]


@pytest.fixture
def echoing(loop_thread: LoopThread) -> Iterator[Echoing]:
    fake = Echoing()
    runner, url = loop_thread.run(start_app(fake.app()))
    fake.url = fake.provider.url = url
    yield fake
    loop_thread.run(runner.cleanup())


def brim_config(echoing: Echoing, **sections: Any) -> dict[str, Any]:
    """The sections of a brim in front of `echoing` on all four APIs (`claude-*`: Messages,
    `gemini-*`: Gemini), told the `-w8000` models hold `TOLD` tokens, its admin endpoints open."""
    models = {
        f"{prefix}echo-w8000": {"context_window": TOLD, "max_output": 1_000}
        for prefix in ("", "claude-", "gemini-")
    }
    return {
        **every_api(echoing.provider),
        "models": models,
        "server": {"admin_keys_env": ADMIN_ENV},
        **sections,
    }


@pytest.fixture(autouse=True)
def admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)


# --- the clients -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: httpx.Headers
    text: str  # the answer's text, or the error body


Turns = list[tuple[str, str]]  # (role "user" | "assistant", text)


def send_chat(base: str, key: str, model: str, turns: Turns, extra: dict[str, Any]) -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
    messages: Any = [{"role": role, "content": text} for role, text in turns]
    try:
        raw = sdk.chat.completions.with_raw_response.create(
            model=model, messages=messages, extra_body=extra
        )
    except openai.APIStatusError as error:
        return Reply(error.status_code, error.response.headers, error.response.text)
    return Reply(raw.status_code, raw.headers, raw.parse().choices[0].message.content or "")


def send_responses(base: str, key: str, model: str, turns: Turns, extra: dict[str, Any]) -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
    items: Any = [{"role": role, "content": text} for role, text in turns]
    try:
        raw = sdk.responses.with_raw_response.create(model=model, input=items, extra_body=extra)
    except openai.APIStatusError as error:
        return Reply(error.status_code, error.response.headers, error.response.text)
    return Reply(raw.status_code, raw.headers, raw.parse().output_text)


def send_messages(base: str, key: str, model: str, turns: Turns, extra: dict[str, Any]) -> Reply:
    sdk = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=60)
    messages: Any = [{"role": role, "content": text} for role, text in turns]
    try:
        raw = sdk.messages.with_raw_response.create(
            model=model, max_tokens=100, messages=messages, extra_body=extra
        )
    except anthropic.APIStatusError as error:
        return Reply(error.status_code, error.response.headers, error.response.text)
    block = raw.parse().content[0]
    return Reply(raw.status_code, raw.headers, getattr(block, "text", ""))


def send_gemini(base: str, key: str, model: str, turns: Turns, extra: dict[str, Any]) -> Reply:
    contents = [
        {"role": "model" if role == "assistant" else "user", "parts": [{"text": text}]}
        for role, text in turns
    ]
    reply = httpx.post(
        f"{base}/v1beta/models/{model}:generateContent",
        json={"contents": contents, **extra},
        headers={"x-goog-api-key": key},
        timeout=60,
    )
    if reply.status_code != 200:
        return Reply(reply.status_code, reply.headers, reply.text)
    parts = reply.json()["candidates"][0]["content"]["parts"]
    return Reply(200, reply.headers, "".join(part.get("text", "") for part in parts))


@dataclass(frozen=True)
class Api:
    name: str  # the wire API, as `WIRES` names it
    send: Callable[[str, str, str, Turns, dict[str, Any]], Reply]
    known_model: str  # a model the registry knows (litellm's map)
    prefix: str  # what routes a model name to this API's upstream
    hostile_field: str  # a field name that is the overflow sentence brim used to search for
    states_window: bool = True  # the API's overflow error says how large the window is


APIS = [
    Api(
        "openai.chat",
        send_chat,
        "gpt-4o-mini",
        "",
        "maximum context length is 1 tokens",
    ),
    Api(
        "openai.responses",
        send_responses,
        "gpt-4o-mini",
        "",
        "maximum context length is 1 tokens",
        states_window=False,
    ),
    Api(
        "anthropic.messages",
        send_messages,
        "claude-haiku-4-5",
        "claude-",
        "prompt is too long: 999999 tokens > 10 maximum",
    ),
    Api(
        "gemini.generate",
        send_gemini,
        "gemini-2.5-flash",
        "gemini-",
        "The input token count (999999) exceeds the maximum number of tokens allowed (10)",
    ),
]
STATING = [api for api in APIS if api.states_window]


def test_every_wire_api_is_covered() -> None:
    assert {api.name for api in APIS} == set(WIRES)


HELLO: Turns = [("user", "Hello")]


def long_conversation(turns: int = 8) -> Turns:
    """~10 000 tokens: over the fake's 8 000-token window, within what brim is told, and back
    under it after a cut of 30 % (a retry's second step)."""
    conversation: Turns = []
    for n in range(turns):
        conversation.append(
            ("user", f"Notes {n}: " + " ".join(f"item-{n}-{i}" for i in range(250)))
        )
        conversation.append(("assistant", f"Noted {n}."))
    conversation.append(("user", "What is in the newest notes?"))
    return conversation


def admin(base: str, method: str = "GET", path: str = "/admin/limits") -> dict[str, Any]:
    reply = httpx.request(method, f"{base}{path}", headers={"x-brim-admin-key": ADMIN}, timeout=10)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def learned(base: str) -> dict[tuple[str, str], int]:
    """What brim learned, as `/admin/status` lists it (`/admin/limits` lists the same)."""
    rows = admin(base, path="/admin/status")["learned"]
    return {(row["model"], row["kind"]): row["value"] for row in rows}


def metric(base: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", headers={"x-brim-admin-key": ADMIN}).text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- the attack ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_a_field_named_like_an_overflow_teaches_brim_nothing(
    api: Api, brim: BrimFactory, echoing: Echoing
) -> None:
    base = brim(**brim_config(echoing))
    attack = api.send(base, "sk-attacker", api.known_model, HELLO, {api.hostile_field: 1})
    # The provider's refusal of the unknown field comes back unchanged, and is not retried.
    assert attack.status == 400 and api.hostile_field in attack.text
    assert attack.headers["x-brim-retries"] == "0"
    assert echoing.replies() == ["unknown field"]

    # Another client's "Hello" still goes through, to the provider, whole.
    hello = api.send(base, "sk-victim", api.known_model, HELLO, {})
    assert (hello.status, hello.text) == (200, "pong"), hello.text
    assert hello.headers["x-brim-actions"] == "none"
    assert echoing.replies() == ["unknown field", "answer"]
    assert learned(base) == {}


# --- a real overflow is learned and retried as before ----------------------------------------


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_a_real_overflow_is_still_retried_and_learned_where_it_states_the_window(
    api: Api, brim: BrimFactory, echoing: Echoing
) -> None:
    base = brim(**brim_config(echoing, restore={"enabled": False}))
    model = f"{api.prefix}echo-w8000"
    first = api.send(base, "sk-one", model, long_conversation(), {})
    assert (first.status, first.text) == (200, "pong"), first.text
    replies = echoing.replies()
    assert replies[0] == "overflow" and replies[-1] == "answer"
    if not api.states_window:  # OpenAI Responses: "Your input exceeds the context window…"
        assert int(first.headers["x-brim-retries"]) >= 1 and learned(base) == {}
        return
    assert first.headers["x-brim-retries"] == "1"  # straight to the stated window
    assert learned(base) == {(model, "window"): REAL_WINDOW}

    echoing.calls.clear()  # another client's next turn is cut up front, once
    again = api.send(base, "sk-two", model, [*long_conversation(), ("user", "And?")], {})
    assert again.status == 200 and again.headers["x-brim-retries"] == "0"
    assert echoing.replies() == ["answer"] and echoing.calls[0][2] <= REAL_WINDOW


@pytest.mark.parametrize("api", STATING, ids=[a.name for a in STATING])
def test_an_overflow_sentence_brims_own_count_does_not_bear_out_is_not_learned(
    api: Api, brim: BrimFactory, echoing: Echoing
) -> None:
    """A provider that says "2 000-token window, you sent 2 100" of a request brim counted at
    a few tokens (its error text is not about this request): not learned, not cut to."""
    base = brim(**brim_config(echoing))
    model = f"{api.prefix}liar-model"
    reply = api.send(base, "sk-one", model, HELLO, {})
    assert reply.status == 400 and "2000" in reply.text.replace(",", "")
    assert learned(base) == {}
    assert metric(base, "brim_learned_refused_total", kind="window", reason="unproven") >= 1


def test_a_window_far_below_what_the_registry_knows_is_not_learned(
    brim: BrimFactory, echoing: Echoing
) -> None:
    """Consistent with the request, but under 1/8 of the window brim knows: not learned (an
    operator who knows better sets `[models]`); the retry cuts by its steps instead."""
    sections = brim_config(echoing, restore={"enabled": False})
    sections["models"]["big-w8000"] = {"context_window": 100_000, "max_output": 1_000}
    base = brim(**sections)
    reply = send_chat(base, "sk-one", "big-w8000", long_conversation(), {})
    assert reply.status == 200 and int(reply.headers["x-brim-retries"]) >= 1
    assert learned(base) == {}
    assert metric(base, "brim_learned_refused_total", kind="window", reason="implausible") == 1
    echoing.calls.clear()  # the next request is not cut up front: it overflows again
    again = send_chat(base, "sk-two", "big-w8000", long_conversation(), {})
    assert again.status == 200 and echoing.replies()[0] == "overflow"


# --- shared through Redis --------------------------------------------------------------------


def test_bogus_and_malformed_learned_records_in_redis_are_skipped_counted_and_removed(
    brim: BrimFactory, echoing: Echoing, redis_server: RedisServer
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    day = time.time() + 24 * 3600 - 60
    client.hset(
        "brim:learned:window",
        mapping={
            "gpt-4o-mini": f"1 {day!r}",  # below the floor
            "claude-haiku-4-5": f"10 {day!r}",  # below the floor, and 1/8 of 200 000
            "gemini-2.5-flash": "lots",  # not a record brim writes
            "GPT-4O-MINI": f"100000 {day!r}",  # not a normalised id
            "gpt-4o": f"120000 {day + 10 * 24 * 3600!r}",  # expires ten days on
            "claude-opus-4-1": f"150000 {day!r}",  # plausible: adopted
        },
    )
    client.hset("brim:learned:output_counts", mapping={"gpt-4o-mini": f"7 {day!r}"})
    client.hset("brim:learned:forgotten", mapping={"gpt-4o": "yesterday"})
    base = brim(**brim_config(echoing, cache={"url": redis_server.url, **FAST}))
    assert wait_for(lambda: learned(base) == {("claude-opus-4-1", "window"): 150_000})
    assert wait_for(lambda: client.hkeys("brim:learned:window") == [b"claude-opus-4-1"])
    assert client.hkeys("brim:learned:output_counts") == []
    rejected = "brim_shared_records_rejected_total"
    assert metric(base, rejected, record="learned") == 6
    assert metric(base, rejected, record="learned", reason="malformed") == 1  # "lots"
    assert metric(base, rejected, record="learned", reason="implausible") == 5  # the registry's
    assert metric(base, rejected, record="forgotten", reason="malformed") >= 1
    for api in APIS:  # every client's "Hello" goes through
        hello = api.send(base, "sk-victim", api.known_model, HELLO, {})
        assert (hello.status, hello.text) == (200, "pong"), (api.name, hello.text)
    client.close()


def test_an_attack_on_one_instance_reaches_no_other(
    brim: BrimFactory, echoing: Echoing, redis_server: RedisServer
) -> None:
    sections = brim_config(echoing, cache={"url": redis_server.url, **FAST})
    a, b = brim(**sections), brim(**sections)
    for api in APIS:
        api.send(a, "sk-attacker", api.known_model, HELLO, {api.hostile_field: 1})
    time.sleep(0.3)  # several refreshes
    client = redis.Redis.from_url(redis_server.url)
    assert client.hlen("brim:learned:window") == 0
    client.close()
    for api in APIS:
        hello = api.send(b, "sk-victim", api.known_model, HELLO, {})
        assert (hello.status, hello.text) == (200, "pong"), (api.name, hello.text)


# --- brim limits: list and forget ------------------------------------------------------------


def test_brim_limits_lists_and_forgets_on_every_instance_sharing_redis(
    brim: BrimFactory,
    echoing: Echoing,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sections = brim_config(echoing, cache={"url": redis_server.url, **FAST})
    a, b = brim(**sections), brim(**sections)
    client = redis.Redis.from_url(redis_server.url)
    for model, api in (("echo-w8000", APIS[0]), ("claude-echo-w8000", APIS[2])):
        assert api.send(a, "sk-one", model, long_conversation(), {}).status == 200
    both = {("echo-w8000", "window"): REAL_WINDOW, ("claude-echo-w8000", "window"): REAL_WINDOW}
    assert learned(a) == both
    assert wait_for(lambda: learned(b) == both)  # B adopted them

    assert main(["limits", "--url", b, "--admin-key", ADMIN]) == 0
    out = capsys.readouterr().out
    assert "shared by its instances" in out
    assert "echo-w8000" in out and "window 8,000" in out and f"{TOLD:,} (config)" in out
    assert main(["limits", "--url", b, "--admin-key", ADMIN, "--json"]) == 0
    listed = orjson.loads(capsys.readouterr().out)
    assert {(row["model"], row["value"]) for row in listed["learned"]} == {
        ("echo-w8000", REAL_WINDOW),
        ("claude-echo-w8000", REAL_WINDOW),
    }

    # Forgotten through A: gone from A at once, from Redis, and from B within its refresh.
    assert main(["limits", "forget", "echo-w8000", "--url", a, "--admin-key", ADMIN]) == 0
    out = capsys.readouterr().out
    assert "Forgot what was learned of 'echo-w8000' here: 1 fact(s)" in out
    assert "every instance on its Redis drops it" in out
    rest = {("claude-echo-w8000", "window"): REAL_WINDOW}
    assert learned(a) == rest
    assert client.hkeys("brim:learned:window") == [b"claude-echo-w8000"]
    assert wait_for(lambda: learned(b) == rest)
    time.sleep(0.3)  # several refreshes: nobody writes it back
    assert learned(a) == learned(b) == rest and client.hlen("brim:learned:window") == 1

    # B overflows on it again, and learns it again: a new fact stands, and A adopts it.
    echoing.calls.clear()
    again = send_chat(b, "sk-two", "echo-w8000", long_conversation(), {})
    assert again.headers["x-brim-retries"] == "1" and echoing.replies()[0] == "overflow"
    assert wait_for(lambda: learned(a) == both)

    # --all, through B: every model, everywhere.
    assert main(["limits", "forget", "--all", "--url", b, "--admin-key", ADMIN]) == 0
    assert "Forgot what was learned of every model here: 2 fact(s)" in capsys.readouterr().out
    assert learned(b) == {}
    assert wait_for(lambda: learned(a) == {})
    assert client.hlen("brim:learned:window") == 0
    client.close()


def test_brim_limits_says_what_it_needs(
    brim: BrimFactory, echoing: Echoing, capsys: pytest.CaptureFixture[str]
) -> None:
    base = brim(**brim_config(echoing))
    assert main(["limits", "--url", base]) == 2  # no key
    assert "--admin-key or $BRIM_ADMIN_KEY" in capsys.readouterr().err
    assert main(["limits", "forget", "--url", base, "--admin-key", ADMIN]) == 2  # no model
    assert main(["limits", "forget", "m", "--all", "--url", base, "--admin-key", ADMIN]) == 2
    assert "name a MODEL to forget, or --all" in capsys.readouterr().err
    assert main(["limits", "--url", base, "--admin-key", "wrong"]) == 1
    assert "answered 401" in capsys.readouterr().err
    assert main(["limits", "--url", base, "--admin-key", ADMIN]) == 0
    assert "nothing learned from providers" in capsys.readouterr().out


def test_the_admin_endpoints_take_any_spelling_of_a_model_id_and_refuse_a_bad_one(
    brim: BrimFactory, echoing: Echoing
) -> None:
    base = brim(**brim_config(echoing))
    model = "openai/echo-w8000"  # a slash in the id: the rest of the path
    assert send_chat(base, "sk-one", model, long_conversation(), {}).status == 200
    assert learned(base) == {(model, "window"): REAL_WINDOW}
    done = admin(base, "DELETE", "/admin/limits/OpenAI%2Fecho-w8000")
    assert [row["model"] for row in done["forgotten"]] == [model] and done["reached"] is True
    assert learned(base) == {}
    for bad in ("%2A", "a" * 300):
        reply = httpx.delete(
            f"{base}/admin/limits/{bad}", headers={"x-brim-admin-key": ADMIN}, timeout=10
        )
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
    unauthorised = httpx.delete(f"{base}/admin/limits", timeout=10)
    assert unauthorised.status_code == 401
