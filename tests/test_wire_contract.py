"""Every feature over every wire API: one contract, parametrized by the registry.

Each wire API in `policies.wires.WIRES` needs a `Case` here: how to write a conversation in it,
where its fake provider lives and which model names make that fake refuse, how the provider's
own rules check a forwarded conversation (written apart from brim's dialects), and what its
errors look like. A fifth API fails `test_every_registered_wire_api_has_a_case` until it has
one, and then runs every test below.

The requests go over plain HTTP (httpx), as any client of the API would send them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from brim.policies.evict import GISTS_HEADER
from brim.policies.wires import WIRES
from brim.policies.wires.base import NOTICE_PREFIX, Wire
from brim.proxy.commands import main
from tests.conftest import BrimFactory, every_api
from tests.fake_anthropic import FakeAnthropic, anthropic_errors
from tests.fakes import (
    FakeProvider,
    gemini_errors,
    pairing_errors,
    responses_errors,
    wait_for,
)

ADMIN = "contract-admin-key-0123456789"
SUMMARY = "[brim: a summary of earlier messages"
FACT = "FACT: the release branch is frozen until the 14th"
Items = list[dict[str, Any]]


@dataclass(frozen=True)
class Case:
    api: str
    refusing: str  # model prefix the fake refuses with an error status past N tokens
    refusing_in_stream: str  # …and inside a 200 stream
    provider_name: str  # gen_ai.provider.name expected on its spans
    user: Callable[[str], dict[str, Any]]
    tool_turn: Callable[[str, str], Items]
    orphan: Callable[[str], dict[str, Any]]
    body: Callable[[str, Items, bool], dict[str, Any]]
    path: Callable[[str, bool], str]
    violations: Callable[[Items], list[str]]  # the provider's own rules, not brim's
    error_message: Callable[[dict[str, Any], int], str]  # checks the shape, returns the text
    refused: Callable[[dict[str, Any]], bool]  # the error body says "too long" the API's way
    bad_body: dict[str, Any]
    bad_field: str

    @property
    def wire(self) -> Wire:
        return WIRES[self.api]

    def model(self, window: int, *, in_stream: bool = False) -> str:
        """A model whose fake provider holds `window` tokens and refuses past it — with an
        error status, or (`in_stream`) inside a 200 stream."""
        return f"{self.refusing_in_stream if in_stream else self.refusing}{window}"


def _openai_error(body: dict[str, Any], status: int) -> str:
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, body
    return str(error["message"])


def _anthropic_error(body: dict[str, Any], status: int) -> str:
    assert body["type"] == "error" and isinstance(body["error"]["type"], str), body
    return str(body["error"]["message"])


def _openai_refusal(body: dict[str, Any], field: str) -> bool:
    error = body["error"]
    return bool(error["code"] == "context_length_exceeded" and error["param"] == field)


def _gemini_error(body: dict[str, Any], status: int) -> str:
    error = body["error"]
    assert error["code"] == status and isinstance(error["status"], str), body
    return str(error["message"])


def _chat_call(call_id: str, result: str) -> Items:
    call = {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def _messages_call(call_id: str, result: str) -> Items:
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": "read_file", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}],
        },
    ]


def _responses_call(call_id: str, result: str) -> Items:
    return [
        {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": result},
    ]


def _gemini_call(call_id: str, result: str) -> Items:
    name = f"read_{call_id}"
    return [
        {"role": "model", "parts": [{"functionCall": {"name": name, "args": {}}}]},
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": name, "response": {"output": result}}}],
        },
    ]


CASES: dict[str, Case] = {
    "openai.chat": Case(
        api="openai.chat",
        refusing="tight-",
        refusing_in_stream="streamtight-",
        provider_name="openai",
        user=lambda text: {"role": "user", "content": text},
        tool_turn=_chat_call,
        orphan=lambda call_id: {"role": "tool", "tool_call_id": call_id, "content": "stray"},
        body=lambda model, items, stream: {
            "model": model,
            "messages": items,
            "max_tokens": 256,
            "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        },
        path=lambda model, stream: "/v1/chat/completions",
        violations=pairing_errors,
        error_message=_openai_error,
        refused=lambda body: _openai_refusal(body, "messages"),
        bad_body={"model": "m"},
        bad_field="messages",
    ),
    "anthropic.messages": Case(
        api="anthropic.messages",
        refusing="claude-window-",
        refusing_in_stream="claude-streamerr-",
        provider_name="anthropic",
        user=lambda text: {"role": "user", "content": text},
        tool_turn=_messages_call,
        orphan=lambda call_id: {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "stray"}],
        },
        body=lambda model, items, stream: {
            "model": model,
            "max_tokens": 256,
            "messages": items,
            "stream": stream,
        },
        path=lambda model, stream: "/v1/messages",
        violations=anthropic_errors,
        error_message=_anthropic_error,
        # What Claude Code recognises and offers to compact on.
        refused=lambda body: body["error"]["message"].startswith("prompt is too long:"),
        bad_body={"model": "claude-x", "max_tokens": 5},
        bad_field="messages",
    ),
    "openai.responses": Case(
        api="openai.responses",
        refusing="resp-",
        refusing_in_stream="respstream-",
        provider_name="openai",
        user=lambda text: {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        },
        tool_turn=_responses_call,
        orphan=lambda call_id: {
            "type": "function_call_output",
            "call_id": call_id,
            "output": "stray",
        },
        body=lambda model, items, stream: {
            "model": model,
            "input": items,
            "max_output_tokens": 256,
            "stream": stream,
        },
        path=lambda model, stream: "/v1/responses",
        violations=responses_errors,
        error_message=_openai_error,
        refused=lambda body: _openai_refusal(body, "input"),
        bad_body={"model": "resp-x", "input": 5},
        bad_field="input",
    ),
    "gemini.generate": Case(
        api="gemini.generate",
        refusing="gem-",
        refusing_in_stream="gemstream-",
        provider_name="gcp.gemini",
        user=lambda text: {"role": "user", "parts": [{"text": text}]},
        tool_turn=_gemini_call,
        orphan=lambda call_id: {
            "role": "user",
            "parts": [{"functionResponse": {"name": "ghost", "response": {"output": "x"}}}],
        },
        body=lambda model, items, stream: {"contents": items},
        path=lambda model, stream: (
            f"/v1beta/models/{model}:streamGenerateContent?alt=sse"
            if stream
            else f"/v1beta/models/{model}:generateContent"
        ),
        violations=gemini_errors,
        error_message=_gemini_error,
        refused=lambda body: (
            body["error"]["status"] == "INVALID_ARGUMENT"
            and body["error"]["message"].startswith("The input token count")
        ),
        bad_body={"contents": []},
        bad_field="contents",
    ),
}


def test_every_registered_wire_api_has_a_case() -> None:
    assert set(CASES) == set(WIRES)


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def serve(
    brim: BrimFactory,
    provider: FakeProvider,
    anthropic_fake: FakeAnthropic,
    spans: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., str]:
    """brim in front of the fakes of all four APIs; keyword arguments add proxy.toml sections."""
    monkeypatch.setenv("CONTRACT_ADMIN_KEYS", ADMIN)

    def start(**sections: Any) -> str:
        sections.setdefault("server", {"admin_keys_env": "CONTRACT_ADMIN_KEYS"})
        sections = {**every_api(provider, anthropic_fake.url), **sections}
        sections.setdefault("archive", {"enabled": True, "dir": str(tmp_path / "archive")})
        return brim(span_processors=[SimpleSpanProcessor(spans)], **sections)

    return start


def windows(*models: tuple[str, int]) -> dict[str, Any]:
    return {model: {"context_window": window, "max_output": 1_000} for model, window in models}


def session(case: Case, turns: int, *, fact: bool = False) -> Items:
    """A task, then `turns` tool calls whose results are ~700 tokens each, then a question."""
    items = [case.user("Find out why the nightly build fails.")]
    for turn in range(turns):
        lines = [f"build log {turn}.{i}: compiled module without warnings" for i in range(70)]
        if fact and turn == 0:
            lines.insert(0, FACT)
        items += case.tool_turn(f"call_{turn}", "\n".join(lines))
    items.append(case.user("What should we fix first?"))
    return items


def send(base: str, case: Case, model: str, items: Items, stream: bool = False) -> httpx.Response:
    body = case.body(model, items, stream)
    return httpx.post(f"{base}{case.path(model, stream)}", json=body, timeout=60)


def fake_of(
    case: Case, provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> FakeProvider | FakeAnthropic:
    """The fake provider the case's requests go to."""
    return anthropic_fake if case.api == "anthropic.messages" else provider


def forwarded(case: Case, provider: FakeProvider, anthropic_fake: FakeAnthropic) -> Items:
    """The conversation the fake provider received last."""
    body = orjson.loads(fake_of(case, provider, anthropic_fake).requests[-1].body)
    return list(case.wire.conversation(body))


def texts(case: Case, items: Items) -> list[str]:
    return [case.wire.dialect.text(item) for item in items]


def test_the_guard_makes_a_long_session_fit_and_keeps_every_pair(
    case: Case, serve: Callable[..., str], provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    model = case.model(6_000)
    base = serve(models=windows((model, 6_000)))
    reply = send(base, case, model, session(case, 10))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] != "none"
    assert int(reply.headers["x-brim-tokens-out"]) <= int(reply.headers["x-brim-budget"])
    assert int(reply.headers["x-brim-tokens-in"]) > int(reply.headers["x-brim-budget"])
    assert case.violations(forwarded(case, provider, anthropic_fake)) == []


def test_a_growing_session_keeps_its_compressed_prefix_until_it_must_cut_again(
    case: Case,
    serve: Callable[..., str],
    provider: FakeProvider,
    anthropic_fake: FakeAnthropic,
    spans: InMemorySpanExporter,
) -> None:
    model = case.model(6_000)
    base = serve(models=windows((model, 6_000)))
    items = session(case, 10)
    first = send(base, case, model, items)
    assert first.status_code == 200, first.text
    assert first.headers["x-brim-actions"] != "none"
    sent = forwarded(case, provider, anthropic_fake)

    # A small next turn: the last compressed request, byte for byte, then what is new.
    added = [*case.tool_turn("call_small", "3 files changed"), case.user("And now?")]
    items += added
    second = send(base, case, model, items)
    assert second.status_code == 200, second.text
    again = forwarded(case, provider, anthropic_fake)
    assert [orjson.dumps(item) for item in again[: len(sent)]] == [
        orjson.dumps(item) for item in sent
    ]
    assert again[len(sent) :] == added
    assert second.headers["x-brim-actions"] == first.headers["x-brim-actions"]
    assert case.violations(again) == []
    name = f"{case.wire.operation} {model}"
    # a request's span ends just after its reply is written
    wait_for(lambda: len([s for s in spans.get_finished_spans() if s.name == name]) >= 2)
    requests = [s for s in spans.get_finished_spans() if s.name == name]
    assert [(s.attributes or {}).get("brim.carried_forward") for s in requests] == [None, True]

    # Turns that no longer fit beside it: cut again, from the client's own items, deep enough
    # to leave room for more turns like them (room_for_turns = 4 of ~700 tokens each).
    grown = 0
    while True:
        grown += 1
        big = "\n".join(f"test log {grown}.{i}: passed without warnings" for i in range(70))
        items += [*case.tool_turn(f"call_big_{grown}", big), case.user("Next?")]
        reply = send(base, case, model, items)
        assert reply.status_code == 200, reply.text
        latest = forwarded(case, provider, anthropic_fake)
        if orjson.dumps(latest[: len(again)]) != orjson.dumps(again):
            break
        assert grown < 8, "the session never had to be cut again"
    budget = int(reply.headers["x-brim-budget"])
    assert int(reply.headers["x-brim-tokens-out"]) <= budget * 0.85 - 700
    assert case.violations(latest) == []
    assert texts(case, latest)[-1] == "Next?"


def test_brim_restore_is_offered_only_when_something_was_cut(
    case: Case, serve: Callable[..., str], provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    model = case.model(6_000)
    base = serve(
        models=windows((model, 6_000)),
        restore={"enabled": True},
        clients={"quiet": {"user_agent": "quiet-agent/*", "restore": False}},
    )
    fake = fake_of(case, provider, anthropic_fake)

    def tools_sent() -> frozenset[str]:
        return case.wire.tool_names(orjson.loads(fake.requests[-1].body))

    assert send(base, case, model, session(case, 1)).headers["x-brim-actions"] == "none"
    assert "brim_restore" not in tools_sent()
    cut = send(base, case, model, session(case, 10))
    assert cut.status_code == 200, cut.text
    assert "brim_restore" in tools_sent()
    assert int(cut.headers["x-brim-tokens-out"]) <= int(cut.headers["x-brim-budget"])
    body = case.body(model, session(case, 10), False)
    quiet = httpx.post(
        f"{base}{case.path(model, False)}",
        json=body,
        headers={"user-agent": "quiet-agent/1.0"},
        timeout=60,
    )
    assert quiet.status_code == 200, quiet.text
    assert quiet.headers["x-brim-actions"] != "none"
    assert "brim_restore" not in tools_sent()
    # "as received": the client's own request, not counting the tool brim added to it
    assert cut.headers["x-brim-tokens-in"] == quiet.headers["x-brim-tokens-in"]


def test_a_broken_pairing_is_repaired_before_it_goes_out(
    case: Case, serve: Callable[..., str], provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    model = case.model(50_000)
    base = serve(models=windows((model, 50_000)))
    items = session(case, 2)
    items.insert(1, case.orphan("call_nobody_made"))
    assert case.violations(items) != []
    reply = send(base, case, model, items)
    assert reply.status_code == 200, reply.text
    assert "repair:" in reply.headers["x-brim-actions"]
    assert case.violations(forwarded(case, provider, anthropic_fake)) == []


@pytest.mark.parametrize("stream", [False, True], ids=["status", "in-stream"])
def test_an_overflow_the_provider_reports_is_retried(
    case: Case,
    stream: bool,
    serve: Callable[..., str],
    provider: FakeProvider,
    anthropic_fake: FakeAnthropic,
) -> None:
    model = case.model(3_000, in_stream=stream)
    base = serve(models={model: {"context_window": 24_000}})  # brim believes it is 8x larger
    reply = send(base, case, model, session(case, 5), stream=stream)
    assert reply.status_code == 200, reply.text
    assert int(reply.headers["x-brim-retries"]) >= 1
    assert case.violations(forwarded(case, provider, anthropic_fake)) == []
    assert "error" not in reply.text[:200].lower()  # a real reply, not a relayed refusal


def test_evicted_turns_are_summarized_in_place_of_the_notice(
    case: Case,
    serve: Callable[..., str],
    provider: FakeProvider,
    anthropic_fake: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = case.model(6_000)
    # The summarizer's own upstream, with its own key: a client's key goes to no other upstream
    # than the one its request addressed (tests/security/test_credentials.py).
    monkeypatch.setenv("CONTRACT_SUMMARY_KEY", "sk-summaries")
    sections = every_api(provider, anthropic_fake.url)
    sections["upstreams"]["summaries"] = {
        "api": "openai",
        "base_url": f"{provider.url}/v1",
        "api_key_env": "CONTRACT_SUMMARY_KEY",
    }
    base = serve(
        upstreams=sections["upstreams"],
        routes={"summarizer-*": "summaries", **sections["routes"]},
        models=windows((model, 6_000)),
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    )
    reply = send(base, case, model, session(case, 10, fact=True))
    assert reply.status_code == 200, reply.text
    sent = texts(case, forwarded(case, provider, anthropic_fake))
    summaries = [text for text in sent if text.startswith(SUMMARY)]
    # One summary per eviction batch, one summarizer call each; the header counts them.
    assert summaries
    assert f"summarize:{len(summaries)}" in reply.headers["x-brim-actions"].split(",")
    assert provider.summarizer_calls == ["summarizer-good"] * len(summaries)
    # The tool result with the fact was in the oldest batch: its summary, and only it, has it
    # (the last one ends with the lines the notice quoted: not the summary's own).
    own = [text.partition("\n" + GISTS_HEADER)[0] for text in summaries]
    assert [FACT in text for text in own] == [True] + [False] * (len(summaries) - 1)
    assert not any(text.startswith(NOTICE_PREFIX) for text in sent)
    calls = len(provider.summarizer_calls)
    assert send(base, case, model, session(case, 10, fact=True)).status_code == 200
    assert len(provider.summarizer_calls) == calls  # the same request again: all from the cache
    assert texts(case, forwarded(case, provider, anthropic_fake)) == sent


def test_what_was_cut_is_archived_and_fetched_back(case: Case, serve: Callable[..., str]) -> None:
    model = case.model(6_000)
    base = serve(models=windows((model, 6_000)))
    assert send(base, case, model, session(case, 10)).status_code == 200
    admin = {"x-brim-admin-key": ADMIN}
    status = httpx.get(f"{base}/admin/status", headers=admin).json()
    keys = status["recent_events"][-1]["archive_keys"]
    assert keys
    for key in keys[:3]:
        original = httpx.get(f"{base}/admin/archive/{key}", headers=admin)
        assert original.status_code == 200
        assert hashlib.sha256(original.content).hexdigest() == key


def root_span(spans: InMemorySpanExporter, case: Case, model: str, nth: int = 1) -> dict[str, Any]:
    """The root span of the `nth` request to `model` (waited for: a request's span ends just
    after its reply is written)."""
    name = f"{case.wire.operation} {model}"
    wait_for(lambda: len([s for s in spans.get_finished_spans() if s.name == name]) >= nth)
    found = [s for s in spans.get_finished_spans() if s.name == name]
    assert len(found) >= nth, [s.name for s in spans.get_finished_spans()]
    span: ReadableSpan = found[nth - 1]
    return dict(span.attributes or {})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_usage_and_provider_are_on_the_span(
    case: Case, stream: bool, serve: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    model = case.model(50_000)
    base = serve(models=windows((model, 50_000)))
    reply = send(base, case, model, session(case, 1), stream=stream)
    assert reply.status_code == 200, reply.text
    attributes = root_span(spans, case, model)
    assert attributes["gen_ai.operation.name"] == case.wire.operation
    assert attributes["gen_ai.provider.name"] == case.provider_name
    assert attributes["gen_ai.request.model"] == model
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0


def test_captured_content_is_the_conversation_as_valid_json(
    case: Case, serve: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    model = case.model(500_000)
    base = serve(
        models=windows((model, 500_000)), telemetry={"capture_content": True, "traces": "none"}
    )
    items = session(case, 2)
    items[0] = case.user("PLANTED-17: find the flaky test")
    assert send(base, case, model, items).status_code == 200
    captured = json.loads(root_span(spans, case, model)["gen_ai.input.messages"])
    assert "PLANTED-17" in json.dumps(captured)
    assert any(p.get("type") == "tool_call_response" for m in captured for p in m["parts"])
    huge = [*items, *case.tool_turn("call_big", "y" * 200_000), case.user("and now?")]
    assert send(base, case, model, huge).status_code == 200
    text = root_span(spans, case, model, nth=2)["gen_ai.input.messages"]
    assert len(text) <= 64 * 1024
    assert isinstance(json.loads(text), list)  # cut to fit, and still JSON


def test_inspect_reads_the_request(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = case.model(6_000)
    config = tmp_path / "proxy.toml"
    config.write_text(f'[models."{model}"]\ncontext_window = 6000\nmax_output = 1000\n')
    items = session(case, 10)
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(case.body(model, items, False)))
    code = main(["inspect", str(request), "--model", model, "--config", str(config), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["fits"] is False  # over its 6 000-token window
    assert report["api"] == case.api
    assert len(report["tokens"]["messages"]) == len(items)
    assert report["guard"]["action"] == "compress"
    assert report["tokens"]["upper_bound"] >= report["tokens"]["total"]


def test_a_request_that_cannot_fit_is_refused_in_the_apis_own_words(
    case: Case, serve: Callable[..., str]
) -> None:
    model = case.model(3_000)
    base = serve(models=windows((model, 3_000)), guard={"policies": ["evict"]})
    huge = [case.user("word " * 20_000)]
    reply = send(base, case, model, huge)
    assert reply.status_code == 400
    message = case.error_message(reply.json(), 400)
    assert reply.headers["x-brim-tokens-in"] in message  # the size, stated
    assert case.refused(reply.json())


def test_bad_input_is_refused_in_the_apis_own_shape(
    case: Case, serve: Callable[..., str], provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    base = serve()
    model = case.model(1_000)
    path = case.path(model, False)
    fake = fake_of(case, provider, anthropic_fake)
    assert send(base, case, model, [case.user("ping")]).status_code == 200
    before = len(fake.requests)  # the case's fake provider is the one that saw the good body
    assert before >= 1
    reply = httpx.post(f"{base}{path}", json=case.bad_body)
    assert reply.status_code == 400
    assert case.bad_field in case.error_message(reply.json(), 400)
    assert len(fake.requests) == before  # nothing broken went upstream


def test_every_route_a_wire_lists_is_served_and_refuses_in_its_shape(
    case: Case, serve: Callable[..., str], provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    """The conversation routes are generated from the wire registry (`Wire.routes`): every
    path a wire lists answers (no 404), a bad body in that wire's own error shape, and nothing
    goes upstream."""
    base = serve()
    fake = fake_of(case, provider, anthropic_fake)
    assert case.wire.routes
    for route in case.wire.routes:
        path = route.replace("{target}", f"{case.model(1_000)}:generateContent")
        reply = httpx.post(f"{base}{path}", json=case.bad_body)
        assert reply.status_code == 400, (path, reply.text)
        assert case.bad_field in case.error_message(reply.json(), 400), path
    assert fake.requests == []
