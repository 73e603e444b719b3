"""Nothing cut is lost, end to end: clients on the official SDKs (Gemini over plain HTTP, as the
Gemini CLI sends it) through a running brim, in front of a scripted provider that uses
`brim_restore` the way a model would — it calls the tool with a key it reads in the cut request,
then answers quoting what it got. The client sees only that answer; brim's span, metrics, audit
line and status record the restore. What brim's retry cuts, after the provider refused a request
as too long, comes back the same way. With `[cache] url` a restore is answered by any instance on
the same Redis, whichever one cut the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from brim.middleware.stages.restore import RESTORE_TOOL
from brim.policies.conversation import archive_key
from brim.policies.wires.base import Usage
from brim.proxy.app import bound_port, start
from brim.proxy.config import BrimConfig
from tests.fakes import LoopThread, start_app, wait_for
from tests.policies.wires import test_restore_shapes as shapes
from tests.restoring import (
    KEY_SHOWN,
    MODELS,
    QUOTE,
    RETRY_MODELS,
    SHAPE_OF,
    WINDOW,
    Restoring,
    brim_config,
    chat_body,
    conversation,
    gemini_body,
    logs,
    messages_body,
    responses_body,
    restored,
    tool_names,
)
from tests.scripted_provider import OUTPUT_TOKENS, WIRE_OF, Call, tool_uses

ADMIN = "restore-admin-key-0123456789"


def key_of(text: str) -> str:
    """The key brim shows for `text`."""
    return f"sha256:{archive_key(text)[:16]}"


def original_of(key: str, texts: list[str]) -> str:
    """The one text of `texts` that `key` (`sha256:<16 hex>`) names."""
    (found,) = [t for t in texts if archive_key(t).startswith(key.removeprefix("sha256:"))]
    return found


def dumped(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()


CUT_MIDDLE = re.compile(r"\n?\[… \d+ tokens cut from the middle by brim[^\]\n]*\]\n?")


def came_back(result: str, original: str) -> bool:
    """Whether a restore's result is `original`, or (where the request had less room left than
    it takes) `original` cut in the middle: its head and its tail around brim's marker."""
    parts = CUT_MIDDLE.split(result)
    if len(parts) == 1:
        return result == original
    head, tail = parts
    return bool(head and tail) and original.startswith(head) and original.endswith(tail)


def shows(body: dict[str, Any], text: str) -> bool:
    """Whether a request carries `text` whole (as JSON writes it: its newlines escaped)."""
    return orjson.dumps(text).decode()[1:-1] in dumped(body)


@dataclass(frozen=True)
class Api:
    """One wire API as its clients speak it."""

    name: str  # the scripted provider's name of it
    send: Callable[..., Reply]  # (base URL, texts, model="": the API's in `MODELS`)

    @property
    def model(self) -> str:
        return MODELS[self.name]

    @property
    def retry_model(self) -> str:
        return RETRY_MODELS[self.name]


@dataclass(frozen=True)
class Reply:
    text: str
    calls: list[str]  # names of the tool calls the client got
    usage: tuple[int, int]  # input, output
    headers: httpx.Headers
    dump: str  # the whole reply, for "nothing about brim_restore"


def _chat(base: str, texts: list[str], model: str = "") -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(**chat_body(texts, model=model))
    reply = raw.parse()
    message = reply.choices[0].message
    assert reply.usage is not None
    return Reply(
        message.content or "",
        [c.function.name for c in message.tool_calls or [] if c.type == "function"],
        (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _messages(base: str, texts: list[str], model: str = "") -> Reply:
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0)
    raw = sdk.messages.with_raw_response.create(**messages_body(texts, model=model))
    reply = raw.parse()
    return Reply(
        "".join(b.text for b in reply.content if b.type == "text"),
        [b.name for b in reply.content if b.type == "tool_use"],
        (reply.usage.input_tokens, reply.usage.output_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _responses(base: str, texts: list[str], model: str = "") -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.responses.with_raw_response.create(**responses_body(texts, model=model))
    reply = raw.parse()
    assert reply.usage is not None
    return Reply(
        reply.output_text,
        [item.name for item in reply.output if item.type == "function_call"],
        (reply.usage.input_tokens, reply.usage.output_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _gemini(base: str, texts: list[str], model: str = "") -> Reply:
    raw = httpx.post(
        f"{base}/v1beta/models/{model or MODELS['gemini']}:generateContent",
        json=gemini_body(texts),
        headers={"x-goog-api-key": "AIza-client"},
        timeout=60,
    )
    assert raw.status_code == 200, raw.text
    reply = raw.json()
    parts = reply["candidates"][0]["content"]["parts"]
    usage = reply["usageMetadata"]
    return Reply(
        "".join(p.get("text", "") for p in parts),
        [p["functionCall"]["name"] for p in parts if "functionCall" in p],
        (usage["promptTokenCount"], usage["candidatesTokenCount"]),
        raw.headers,
        raw.text,
    )


APIS = [
    Api("chat", _chat),
    Api("messages", _messages),
    Api("responses", _responses),
    Api("gemini", _gemini),
]
each_api = pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])


# The guard clears results rather than evicting their turns, every one but the newest three: the
# model then sees a key of a result of its own to ask for.
CLEARING = {"clear_tool_results": {"recent": 0}}


def config(url: str, tmp_path: Path, **sections: Any) -> BrimConfig:
    """brim in front of the scripted provider on all four APIs, restore on, audited."""
    return brim_config(
        url,
        server={"admin_keys_env": "RESTORE_ADMIN_KEYS"},
        audit={"path": str(tmp_path / "audit.jsonl")},
        **sections,
    )


@pytest.fixture
def serve(loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Starts a scripted provider's app, or a brim (a config, and span processors), on loopback;
    returns its base URL."""
    monkeypatch.setenv("RESTORE_ADMIN_KEYS", ADMIN)
    runners: list[Any] = []

    def make(what: Restoring | BrimConfig, processors: Any = ()) -> str:
        if isinstance(what, Restoring):
            runner, url = loop_thread.run(start_app(what.app()))
            runners.append(runner)
            what.url = url
            return str(url)
        runner = loop_thread.run(start(what, "127.0.0.1", 0, span_processors=processors))
        runners.append(runner)
        return f"http://127.0.0.1:{bound_port(runner)}"

    yield make
    for runner in reversed(runners):
        loop_thread.run(runner.cleanup())


def root_span(spans: InMemorySpanExporter) -> ReadableSpan:
    def ended() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if "brim.outcome" in (s.attributes or {})]

    wait_for(ended)  # a request's span ends just after its reply is written
    (root,) = ended()
    return root


def counters(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every counter at /metrics (read with the admin key, as Prometheus does where admin keys
    are set): family → its own labels (not the scope's) → value."""
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    return {
        family.name: {
            tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("otel_"))): s.value
            for s in family.samples
            if s.name.endswith("_total")
        }
        for family in text_string_to_metric_families(text)
    }


@each_api
def test_a_restore_is_answered_hidden_and_recorded(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    fake = Restoring()
    spans = InMemorySpanExporter()
    base = serve(config(serve(fake), tmp_path), [SimpleSpanProcessor(spans)])
    texts = logs("build")

    reply = api.send(base, texts)

    # Upstream: the cut request offered brim_restore and named keys; the model asked for the
    # first; the second round carries the original as that call's result, validly paired.
    assert [c.reply for c in fake.calls] == ["read 1", "final"], fake.rejections
    first, second = fake.calls
    assert RESTORE_TOOL.name in orjson.dumps(first.body).decode()
    (asked,) = tool_uses(api.name, second.body, RESTORE_TOOL.name)
    key = str(asked.arguments["key"])
    original = original_of(key, texts)
    assert not shows(first.body, original)  # it was cut...
    assert restored(api.name, second.body) == [original]  # ...and came back whole
    # The client: only the final answer, quoting it; no trace of the hidden round.
    assert reply.text == QUOTE + original
    assert reply.calls == []
    assert RESTORE_TOOL.name not in reply.dump and key not in reply.dump
    assert reply.usage == (first.tokens + second.tokens, 2 * OUTPUT_TOKENS)
    assert reply.headers["x-brim-restored"] == "1"
    assert reply.headers["x-brim-actions"] != "none"

    # The span: offered, one restore event naming the key; usage summed there too.
    root = root_span(spans)
    attributes = dict(root.attributes or {})
    assert attributes["brim.restore_offered"] is True
    assert attributes["gen_ai.usage.input_tokens"] == first.tokens + second.tokens
    events = [dict(e.attributes or {}) for e in root.events if e.name == "brim.restore"]
    assert events == [{"brim.restore.key": key, "brim.restore.found": True}]
    # Metrics, labelled like the others.
    metrics = counters(base)
    assert metrics["brim_restores"] == {(("found", "true"), ("model", api.model)): 1}
    assert metrics["brim_restores_offered"] == {(("model", api.model),): 1}
    # The audit line names the key, never the content.
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()
    audit = json.loads(line)
    assert audit["restored"] == [key] and audit["restore_missing"] == []
    assert "compiled module" not in line
    # The status board.
    status = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}).json()
    assert (status["totals"]["restore_offered"], status["totals"]["restored"]) == (1, 1)
    assert status["models"][api.model]["restored"] == 1
    assert status["recent_events"][-1]["restored"] == [key]


@each_api
def test_a_request_that_fits_is_not_offered_restore_and_records_none(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    fake = Restoring()
    spans = InMemorySpanExporter()
    base = serve(config(serve(fake), tmp_path), [SimpleSpanProcessor(spans)])

    reply = api.send(base, logs("build", turns=2))

    assert [c.reply for c in fake.calls] == ["text"]  # not offered: nothing to call
    assert reply.text == "ok" and "x-brim-restored" not in reply.headers
    root = root_span(spans)
    assert dict(root.attributes or {})["brim.restore_offered"] is False
    assert [e for e in root.events if e.name == "brim.restore"] == []
    metrics = counters(base)
    assert "brim_restores" not in metrics and "brim_restores_offered" not in metrics


# --- what the retry cuts comes back too -------------------------------------------------------


@each_api
def test_what_the_retry_cuts_is_offered_and_restored(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    """The provider refuses, in its own words, a request brim thought would fit; brim's retry
    cuts it and offers brim_restore in the request it sends again, answers the model's call of
    it from the store and asks once more, going on from the cut request."""
    # A short result and a long one first: the short one comes back whole where the cut made
    # room for it (`came_back`).
    texts = [logs("short", 1, lines=20)[0], logs("long", 1, lines=200)[0], *logs("retry", 8)]
    fake = Restoring(among=frozenset(key_of(text) for text in texts))
    base = serve(config(serve(fake), tmp_path))

    reply = api.send(base, texts, api.retry_model)

    assert [c.reply for c in fake.calls] == ["overflow", "read 1", "final"], fake.rejections
    refused, cut, last = fake.calls
    assert refused.tokens > WINDOW and all(shows(refused.body, text) for text in texts)
    assert RESTORE_TOOL.name not in dumped(refused.body)  # the guard let it through whole
    # The retry's cut: its placeholders name keys, brim_restore is offered once, at the end.
    assert cut.tokens <= WINDOW
    assert tool_names(api.name, cut.body) == ["read_file", RESTORE_TOOL.name]
    (asked,) = tool_uses(api.name, last.body, RESTORE_TOOL.name)
    key = str(asked.arguments["key"])
    original = original_of(key, texts)
    assert key in dumped(cut.body) and not shows(cut.body, original)
    # The next round goes on from the cut request, the original the call's result, paired (the
    # provider refuses a request whose calls and results are not).
    assert conversation(api.name, last.body)[: len(conversation(api.name, cut.body))] == (
        conversation(api.name, cut.body)
    )
    assert tool_names(api.name, last.body) == tool_names(api.name, cut.body)
    (result,) = restored(api.name, last.body)
    assert came_back(result, original)  # whole, or cut to the room the retry's cut left
    # The client: only the final answer, usage summed over the rounds the provider answered.
    assert reply.text == QUOTE + result
    assert reply.calls == []
    assert RESTORE_TOOL.name not in reply.dump and key not in reply.dump
    assert reply.usage == (cut.tokens + last.tokens, 2 * OUTPUT_TOKENS)
    assert reply.headers["x-brim-retries"] == "1"
    assert reply.headers["x-brim-restored"] == "1"


@each_api
def test_a_retry_after_the_guard_offered_restore_offers_it_once(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    """The guard cut the request and offered brim_restore; the provider, whose window is smaller
    than brim was told, refuses even that; the retry cuts further without adding the tool again,
    and the model's call of it is answered within the window the retry learned: older results
    cleared to make room, the original whole, in a request the provider takes."""
    texts = logs("guarded")
    fake = Restoring(among=frozenset(key_of(text) for text in texts))
    # The provider states no window: the retry cuts by its first step, to 80 % of the guarded
    # request (~5 000 tokens), which this window takes with room for the round to fill it.
    model = f"{api.model}-{WINDOW * 5 // 8 + 150}"
    base = serve(config(serve(fake), tmp_path, windows={model: WINDOW}, guard=CLEARING))

    reply = api.send(base, texts, model)

    assert [c.reply for c in fake.calls] == ["overflow", "read 1", "final"], fake.rejections
    guarded, cut, last = fake.calls
    assert tool_names(api.name, guarded.body) == ["read_file", RESTORE_TOOL.name]
    assert tool_names(api.name, cut.body) == ["read_file", RESTORE_TOOL.name]
    assert cut.tokens < guarded.tokens
    (asked,) = tool_uses(api.name, last.body, RESTORE_TOOL.name)
    original = original_of(str(asked.arguments["key"]), texts)
    # The retry's cut left less room than the original takes: older results were cleared to
    # make it (each in place, its placeholder naming its key), and the original went whole.
    before, after = conversation(api.name, cut.body), conversation(api.name, last.body)
    assert len(after) > len(before)
    changed = [b for a, b in zip(before, after, strict=False) if a != b]
    assert changed and all("brim cleared this" in dumped(b) for b in changed)
    assert last.tokens <= WINDOW
    (result,) = restored(api.name, last.body)
    assert result == original
    assert reply.text == QUOTE + result
    assert reply.usage == (cut.tokens + last.tokens, 2 * OUTPUT_TOKENS)
    assert reply.headers["x-brim-retries"] == "1"


@each_api
def test_a_restore_round_the_provider_refuses_is_cut_from_its_own_size(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    """The provider's window is smaller than brim was told: the guard's cut fits it, the round
    that answers the model's brim_restore (the original filling the room the cut left) does
    not. The retry cuts that round as the request it is — its own size, not the first one's."""
    texts = [logs("long", 1, lines=200)[0], *logs("round")]
    fake = Restoring(among=frozenset(key_of(text) for text in texts))
    model = f"{api.model}-6500"
    base = serve(config(serve(fake), tmp_path, windows={model: WINDOW}))

    reply = api.send(base, texts, model)

    assert [c.reply for c in fake.calls] == ["read 1", "overflow", "final"], fake.rejections
    first, refused, cut = fake.calls
    assert first.tokens < 6500 < refused.tokens
    assert cut.tokens >= 0.8 * 0.9 * refused.tokens  # not 80 % of the first request
    (result,) = restored(api.name, cut.body)
    (asked,) = tool_uses(api.name, cut.body, RESTORE_TOOL.name)
    assert came_back(result, original_of(str(asked.arguments["key"]), texts))
    assert reply.text == QUOTE + result
    assert reply.headers["x-brim-retries"] == "1"


@dataclass
class Refusing(Restoring):
    """A provider that counts higher than brim: it refuses the requests numbered in `refuse`
    (from 1) as too long, in its API's own words, whatever their size."""

    refuse: frozenset[int] = frozenset()

    def _admit(
        self, api: str, model: str, body: dict[str, Any], offered: bool, problems: list[str]
    ) -> Call:
        call = super()._admit(api, model, body, offered, problems)
        if len(self.calls) in self.refuse and call.reply not in ("invalid", "overflow"):
            if call.reply.startswith("read "):
                self.steps -= 1  # not answered: the next request gets this step
            call.reply = "overflow"
        return call


@each_api
def test_retries_are_counted_over_every_restore_round(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    """The provider refuses the request and then the round that answers brim_restore: the retry
    cuts each, and x-brim-retries counts both."""
    texts = logs("counted")
    fake = Refusing(refuse=frozenset({1, 3}))
    model = f"{api.model}-{WINDOW}"
    base = serve(config(serve(fake), tmp_path, windows={model: WINDOW}))

    reply = api.send(base, texts, model)

    assert [c.reply for c in fake.calls] == ["overflow", "read 1", "overflow", "final"]
    assert len(restored(api.name, fake.calls[-1].body)) == 1
    assert reply.text.startswith(QUOTE)
    assert reply.headers["x-brim-retries"] == "2"


STREAMED: dict[str, Callable[..., tuple[str, dict[str, Any]]]] = {
    # the scripted provider's name of an API → (path, body) of a streamed request for a model
    "chat": lambda texts, model: (
        "/v1/chat/completions",
        chat_body(texts, stream=True, model=model),
    ),
    "messages": lambda texts, model: (
        "/v1/messages",
        messages_body(texts, stream=True, model=model),
    ),
    "responses": lambda texts, model: (
        "/v1/responses",
        responses_body(texts, stream=True, model=model),
    ),
    "gemini": lambda texts, model: (
        f"/v1beta/models/{model}:streamGenerateContent?alt=sse",
        gemini_body(texts),
    ),
}


@each_api
def test_a_restore_after_text_in_a_retried_stream_streams_on_as_the_same_reply(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    """Streamed: the retried request's turn starts with text the client gets at once, then
    calls brim_restore; brim answers it on the retry's cut and streams the next round on as
    more of the same reply (read with the SDK's own stream accumulator)."""
    texts = [logs("short", 1, lines=20)[0], logs("long", 1, lines=200)[0], *logs("retry", 8)]
    fetch = shapes.Turn(
        (shapes.Say("Let me fetch it. "), shapes.Call("call_r", RESTORE_TOOL.name, {})),
        Usage(3000, 40, 0),
    )
    found = shapes.Turn((shapes.Say("Found it."),), Usage(3500, 30, 0))
    # (the first request is refused before the script is read)
    fake = Restoring(script=[fetch, fetch, found], among=frozenset(map(key_of, texts)))
    base = serve(config(serve(fake), tmp_path))
    path, body = STREAMED[api.name](texts, api.retry_model)

    headers = {"authorization": "Bearer sk-client", "x-api-key": "sk-ant-client"}
    with httpx.stream("POST", base + path, json=body, headers=headers, timeout=60) as got:
        assert got.status_code == 200, got.read()
        stream = got.read()

    assert [c.reply for c in fake.calls] == ["overflow", "read 1", "final"], fake.rejections
    _, cut, last = fake.calls
    assert tool_names(api.name, cut.body) == ["read_file", RESTORE_TOOL.name]
    assert conversation(api.name, last.body)[: len(conversation(api.name, cut.body))] == (
        conversation(api.name, cut.body)
    )
    (asked,) = tool_uses(api.name, last.body, RESTORE_TOOL.name)
    (result,) = restored(api.name, last.body)
    assert came_back(result, original_of(str(asked.arguments["key"]), texts))
    heard, errors = shapes.HEARD[WIRE_OF[api.name]](stream)
    assert errors == []
    assert (heard.text, heard.calls) == ("Let me fetch it. Found it.", [])
    assert (heard.usage.input, heard.usage.output) == (6500, 70)
    assert RESTORE_TOOL.name.encode() not in stream


WHOLE: dict[str, Callable[[list[str], str], tuple[str, dict[str, Any]]]] = {
    # the scripted provider's name of an API → (path, body) of a whole request for a model
    "chat": lambda texts, model: ("/v1/chat/completions", chat_body(texts, model=model)),
    "messages": lambda texts, model: ("/v1/messages", messages_body(texts, model=model)),
    "responses": lambda texts, model: ("/v1/responses", responses_body(texts, model=model)),
    "gemini": lambda texts, model: (f"/v1beta/models/{model}:generateContent", gemini_body(texts)),
}
OWN = {"name": RESTORE_TOOL.name, "parameters": {"type": "object", "properties": {}}}
OWN_TOOL: dict[str, Callable[[dict[str, Any]], None]] = {
    # adds a tool of the client's own named brim_restore to a request, as each API defines one
    "chat": lambda body: body["tools"].append({"type": "function", "function": OWN}),
    "messages": lambda body: body["tools"].append(
        {"name": OWN["name"], "input_schema": OWN["parameters"]}
    ),
    "responses": lambda body: body["tools"].append({"type": "function", **OWN}),
    "gemini": lambda body: body["tools"][0]["functionDeclarations"].append(OWN),
}
TEXT_OF: dict[str, Callable[[dict[str, Any]], str]] = {
    # a whole reply's text
    "chat": lambda reply: reply["choices"][0]["message"]["content"] or "",
    "messages": lambda reply: "".join(b["text"] for b in reply["content"] if b["type"] == "text"),
    "responses": lambda reply: "".join(
        part["text"]
        for item in reply["output"]
        if item["type"] == "message"
        for part in item["content"]
    ),
    "gemini": lambda reply: "".join(
        part.get("text", "") for part in reply["candidates"][0]["content"]["parts"]
    ),
}


@each_api
@pytest.mark.parametrize("case", ["restore off", "client rule", "client's own tool"])
def test_the_retry_offers_restore_only_where_the_guard_would(
    api: Api, case: str, serve: Callable[..., str], tmp_path: Path
) -> None:
    """Not with `[restore] enabled = false`, not to a client whose rule says `restore = false`,
    and not over a tool of the client's own that has the name (its calls are the client's)."""
    fake = Restoring()
    sections: dict[str, Any] = {
        "restore off": {"restore": {"enabled": False}},
        "client rule": {"clients": {"quiet": {"user_agent": "quiet-agent/*", "restore": False}}},
        "client's own tool": {},
    }[case]
    base = serve(config(serve(fake), tmp_path, **sections))
    path, body = WHOLE[api.name](logs("retry", turns=14), api.retry_model)
    if case == "client's own tool":
        OWN_TOOL[api.name](body)
    headers = {
        "authorization": "Bearer sk-client",
        "x-api-key": "sk-ant-client",
        "x-goog-api-key": "AIza-client",
        "user-agent": "quiet-agent/1.0",
    }

    raw = httpx.post(base + path, json=body, headers=headers, timeout=60)

    assert raw.status_code == 200, raw.text
    assert raw.headers["x-brim-retries"] == "1"
    refused, cut = fake.calls  # no hidden round
    assert refused.reply == "overflow" and KEY_SHOWN.search(dumped(cut.body))
    reply = raw.json()
    calls = [call.name for call in SHAPE_OF[WIRE_OF[api.name]].wire.reply_calls(reply)]
    if case == "client's own tool":
        assert tool_names(api.name, cut.body) == ["read_file", RESTORE_TOOL.name]  # the client's
        assert calls == [RESTORE_TOOL.name]  # the call goes to the client, who defined it
    else:
        assert tool_names(api.name, cut.body) == ["read_file"]
        assert (calls, TEXT_OF[api.name](reply)) == ([], "ok")


# --- two instances, one Redis ------------------------------------------------------------------


@each_api
def test_a_restore_arriving_at_another_instance_is_answered_from_redis(
    api: Api, serve: Callable[..., str], tmp_path: Path, redis_url: str
) -> None:
    fake = Restoring(reads=0)  # the model answers A without asking for anything
    url = serve(fake)
    shared = {"cache": {"url": redis_url}}
    first = serve(config(url, tmp_path / "a", **shared))
    second = serve(config(url, tmp_path / "b", **shared))
    alone = serve(config(url, tmp_path / "c"))  # its own store only

    texts = logs("first")
    assert api.send(first, texts).text == "ok"
    key = KEY_SHOWN.findall(orjson.dumps(fake.calls[-1].body).decode())[0]
    original = original_of(key, texts)

    # The model's call of A's key comes back in a request that B cut (other content).
    fake.key, fake.reads = key, fake.steps + 1
    others = logs("second")
    reply = api.send(second, others)
    assert [c.reply for c in fake.calls[-2:]] == ["read 1", "final"]
    cut_by_b = fake.calls[-2].body
    assert not shows(cut_by_b, original) and key not in dumped(cut_by_b)  # B never had it
    assert reply.text == QUOTE + original
    assert reply.headers["x-brim-restored"] == "1"

    # An instance without the shared store cannot know it.
    fake.reads = fake.steps + 1
    lost = api.send(alone, logs("third"))
    assert "no longer available" in lost.text and key in lost.text
    assert "x-brim-restored" not in lost.headers
