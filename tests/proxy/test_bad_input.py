"""A corpus of bad requests, on every wire API: never a 500, never a traceback, never anything
invalid sent upstream — an answer in the client's own format that names the problem."""

from __future__ import annotations

import socket
from copy import deepcopy
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import BrimFactory
from tests.fake_anthropic import FakeAnthropic
from tests.fakes import FakeProvider, pairing_errors

JSON = {"content-type": "application/json"}
PATHS = {
    "openai": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/gem-x:generateContent",
}


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider, anthropic_fake: FakeAnthropic) -> str:
    return brim(
        upstreams={
            "openai": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "claude": {"api": "anthropic", "base_url": anthropic_fake.url},
            "gemini": {"api": "gemini", "base_url": provider.url},
        },
        models={
            "tiny": {"context_window": 3_000, "max_output": 256},
            "claude-tiny": {"context_window": 3_000, "max_output": 256},
        },
        server={"max_body_mb": 32},
        guard={"loop_limit": 0},  # the fuzzers repeat requests on purpose
    )


def shaped(wire: str, reply: httpx.Response) -> str:
    """The error message, after checking the reply is in the wire's own error shape."""
    assert reply.status_code < 500, reply.text[:300]
    assert "Traceback" not in reply.text
    body = reply.json()
    if wire == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return str(body["error"]["message"])
    if wire == "gemini":
        assert set(body["error"]) == {"code", "message", "status"}
        return str(body["error"]["message"])
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["message"])


CORPUS: list[tuple[str, bytes, str]] = [
    ("invalid JSON", b'{"model": ', "JSON"),
    ("invalid UTF-8", b'{"model": "m\xff\xfe", "messages": []}', "JSON"),
    ("nested 10 000 deep", b"[" * 10_000 + b"]" * 10_000, "depth"),
    (
        "nested 150 deep",
        b'{"model": "m", "messages": [{"role": "user", "content": "x", "meta": '
        + b"[" * 150
        + b"]" * 150
        + b"}]}",
        "levels deep",
    ),
    ("a number too big for a double", b'{"model": "m", "max_tokens": 1e999}', "infinity"),
    ("not an object", b'"just a string"', "object"),
    ("empty body", b"", "empty"),
]


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize(("name", "raw", "fragment"), CORPUS, ids=[c[0] for c in CORPUS])
def test_unreadable_bodies(
    base: str, provider: FakeProvider, wire: str, name: str, raw: bytes, fragment: str
) -> None:
    reply = httpx.post(
        f"{base}{PATHS[wire]}", content=raw, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400
    assert fragment in shaped(wire, reply)
    assert provider.requests == []


# Required fields left out (wrong values in present fields are in WRONG_TYPES below).
MISSING: list[tuple[str, dict[str, Any], str]] = [
    ("openai", {"model": "fake-model"}, "messages"),
    ("responses", {"input": "hi"}, "model"),
    (
        "anthropic",
        {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]},
        "max_tokens",
    ),
    (
        "anthropic",
        {
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"no_type": 1}]}],
        },
        "type",
    ),
]


@pytest.mark.parametrize(("wire", "body", "named"), MISSING)
def test_missing_fields_are_named(
    base: str, provider: FakeProvider, wire: str, body: dict[str, Any], named: str
) -> None:
    reply = httpx.post(f"{base}{PATHS[wire]}", json=body)
    assert reply.status_code == 400
    assert named in shaped(wire, reply)
    assert provider.requests == []


# Every field brim reads, given a value of the wrong type: each wire's own minimal valid body, a
# path into it, and what the error must name.
VALID: dict[str, dict[str, Any]] = {
    "openai": {
        "model": "fake-model",
        "max_tokens": 5,
        "stream": False,
        "messages": [
            {"role": "user", "content": "x", "name": "me"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    },
    "responses": {"model": "fake-model", "input": "hi", "stream": False, "max_output_tokens": 9},
    "anthropic": {
        "model": "claude-x",
        "max_tokens": 5,
        "system": "be brief",
        "stream": False,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
    },
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
}
WRONG_TYPES: list[tuple[str, tuple[str | int, ...], Any, str]] = [
    ("openai", ("model",), 7, "model"),
    ("openai", ("model",), "", "model"),
    ("openai", ("messages",), {"role": "user"}, "messages"),
    ("openai", ("messages",), "hello", "messages"),
    ("openai", ("messages",), [], "messages"),
    ("openai", ("messages", 0), "hello", "messages[0]"),
    ("openai", ("messages", 0, "role"), 1, "messages[0].role"),
    ("openai", ("messages", 0, "role"), "robot", "messages[0].role"),
    ("openai", ("messages", 0, "content"), 5, "messages[0].content"),
    ("openai", ("messages", 0, "content"), [1, 2], "messages[0].content"),
    ("openai", ("messages", 0, "content"), {"nested": True}, "messages[0].content"),
    ("openai", ("messages", 0, "name"), ["me"], "messages[0].name"),
    ("openai", ("messages", 1, "tool_calls"), "call", "messages[1].tool_calls"),
    ("openai", ("messages", 1, "tool_calls", 0, "id"), 9, "messages[1].tool_calls[0].id"),
    ("openai", ("messages", 1, "tool_calls", 0, "function", "arguments"), {}, "arguments"),
    ("openai", ("messages", 2, "tool_call_id"), 3, "messages[2].tool_call_id"),
    ("openai", ("messages", 2, "tool_call_id"), None, "messages[2].tool_call_id"),
    ("openai", ("max_tokens",), "lots", "max_tokens"),
    ("openai", ("max_tokens",), -5, "max_tokens"),
    ("openai", ("max_tokens",), 2.5, "max_tokens"),
    ("openai", ("stream",), "yes", "stream"),
    ("responses", ("model",), ["m"], "model"),
    ("responses", ("model",), 3, "model"),
    ("responses", ("input",), 42, "input"),
    ("responses", ("stream",), 1, "stream"),
    ("responses", ("max_output_tokens",), 0, "max_output_tokens"),
    ("anthropic", ("model",), None, "model"),
    ("anthropic", ("messages",), [], "messages"),
    ("anthropic", ("messages", 0, "role"), "tool", "messages.0.role"),
    ("anthropic", ("messages", 0, "content"), 12, "messages.0.content"),
    ("anthropic", ("messages", 0, "content", 0, "type"), 3, "messages.0.content.0.type"),
    ("anthropic", ("max_tokens",), "lots", "max_tokens"),
    ("anthropic", ("max_tokens",), 0, "max_tokens"),
    ("anthropic", ("system",), 4, "system"),
    ("anthropic", ("stream",), "no", "stream"),
    ("gemini", ("contents",), {}, "contents"),
    ("gemini", ("contents",), [], "contents"),
    ("gemini", ("contents", 0, "role"), "wizard", "contents.0.role"),
    ("gemini", ("contents", 0, "parts"), "text", "contents.0.parts"),
    ("gemini", ("contents", 0, "parts"), [], "contents.0.parts"),
]


def with_value(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    copy = deepcopy(body)
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


def test_the_valid_bodies_are_valid(base: str) -> None:
    for wire in PATHS:
        assert httpx.post(f"{base}{PATHS[wire]}", json=VALID[wire]).status_code == 200, wire


@pytest.mark.parametrize(
    ("wire", "path", "value", "named"),
    WRONG_TYPES,
    ids=[f"{w}:{'.'.join(map(str, p))}={v!r}"[:60] for w, p, v, _ in WRONG_TYPES],
)
def test_a_wrong_type_in_every_field_is_named(
    base: str,
    provider: FakeProvider,
    wire: str,
    path: tuple[str | int, ...],
    value: Any,
    named: str,
) -> None:
    reply = httpx.post(f"{base}{PATHS[wire]}", json=with_value(VALID[wire], path, value))
    assert reply.status_code == 400
    assert named in shaped(wire, reply)
    assert provider.requests == []


def test_huge_numbers(base: str, provider: FakeProvider) -> None:
    def send(raw: bytes) -> httpx.Response:
        return httpx.post(
            f"{base}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )

    hello = b'"messages": [{"role": "user", "content": "hi"}]'
    beyond = send(
        b'{"model": "fake-model", "max_tokens": 123456789012345678901234567890, ' + hello + b"}"
    )
    assert beyond.status_code == 400 and "max_tokens" in shaped("openai", beyond)
    assert provider.requests == []
    # Numbers brim does not read are the provider's to judge: the bytes go through untouched.
    raw = (
        b'{"model": "fake-model", "seed": 123456789012345678901234567890, "temperature": -1e308, "max_tokens": 9007199254740993, '
        + hello
        + b"}"
    )
    reply = send(raw)
    assert reply.status_code == 200 and provider.last.body == raw
    assert 0 < int(reply.headers["x-brim-budget"]) < 128_000  # the reservation was capped


def test_depth_past_what_brim_can_rewrite_is_refused_before_compression(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    """A 300-deep field in a message that had to be compressed once crashed re-encoding (orjson
    writes at most 254 levels). It is refused up front now, naming the limit; the limit is set
    in `[server] max_json_depth`."""
    raw = (
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
        + b"x " * 200_000
        + b'", "meta": '
        + b"[" * 300
        + b"]" * 300
        + b'}, {"role": "user", "content": "go"}]}'
    )
    for base, limit in ((brim(), 128), (brim(server={"max_json_depth": 20}), 20)):
        reply = httpx.post(f"{base}/v1/chat/completions", content=raw, headers=JSON)
        assert reply.status_code == 400
        assert f"{limit} levels deep" in shaped("openai", reply)
    assert provider.requests == []
    shallow = orjson.dumps(
        {
            "model": "fake-model",
            "messages": [
                {"role": "user", "content": "x", "meta": orjson.loads(b"[" * 30 + b"]" * 30)}
            ],
        }
    )
    assert (
        httpx.post(f"{brim()}/v1/chat/completions", content=shallow, headers=JSON).status_code
        == 200
    )
    narrow = httpx.post(
        f"{brim(server={'max_json_depth': 20})}/v1/messages", content=shallow, headers=JSON
    )
    assert narrow.status_code == 400 and "20 levels deep" in shaped("anthropic", narrow)


def test_deep_json_inside_an_old_tool_result_is_cut_as_text(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    # Every turn kept from eviction, so the cut has to go into the deep result's text.
    base = brim(
        models={"fake-model": {"context_window": 8_000, "max_output": 1_000}},
        guard={"evict": {"keep_recent_turns": 10}},
    )
    deep_text = '{"a":' * 600 + "[" + '"line",' * 4_000 + "1]" + "}" * 600
    messages: list[dict[str, Any]] = [{"role": "user", "content": "read them"}]
    for n in range(3):
        messages += [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{n}", "content": deep_text if n == 0 else "ok"},
        ]
    messages.append({"role": "user", "content": "next"})
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "fake-model", "messages": messages},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text[:300]
    assert reply.headers["x-brim-actions"] == "prune:1"  # and within the limit: no eviction
    sent = orjson.loads(provider.last.body)["messages"]
    assert pairing_errors(sent) == [] and "cut from the middle" in sent[2]["content"]


def test_header_limits(brim: BrimFactory, provider: FakeProvider) -> None:
    ok = {"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    base = brim(
        upstreams={
            "fake": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "claude": {"api": "anthropic", "base_url": "http://127.0.0.1:9"},
        }
    )
    for wire in ("openai", "anthropic"):
        long_header = httpx.post(f"{base}{PATHS[wire]}", json=ok, headers={"x-trace": "t" * 9_000})
        assert long_header.status_code == 431
        assert "'x-trace'" in shaped(wire, long_header) and "ttt" not in long_header.text
    many = httpx.post(
        f"{base}/v1/chat/completions", json=ok, headers={f"x-h{n}": "v" for n in range(200)}
    )
    assert many.status_code == 431 and "max_headers" in shaped("openai", many)
    long_url = httpx.post(f"{base}/v1/chat/completions?pad={'p' * 9_000}", json=ok)
    assert long_url.status_code == 431 and "URL" in shaped("openai", long_url)
    # Far past every limit, aiohttp's own parser answers; it never gets a 500 either.
    absurd = httpx.post(
        f"{base}/v1/chat/completions", json=ok, headers={"x-trace": "t" * 2_000_000}
    )
    assert absurd.status_code == 400 and "Traceback" not in absurd.text
    assert provider.requests == []
    strict = brim(server={"max_header_kb": 4})
    header = {"x-trace": "t" * 6_000}
    assert httpx.post(f"{strict}/v1/chat/completions", json=ok, headers=header).status_code == 431
    assert httpx.post(f"{base}/v1/chat/completions", json=ok, headers=header).status_code == 200
    assert provider.last.headers["x-trace"] == header["x-trace"]


def test_large_and_many(base: str, provider: FakeProvider) -> None:
    too_big = httpx.post(
        f"{base}/v1/chat/completions",
        content=b"x" * (50 * 1024 * 1024),
        headers={"content-type": "application/json"},
    )
    assert too_big.status_code == 413 and shaped("openai", too_big)
    many = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": f"m{i}"} for i in range(10_000)],
    }
    assert httpx.post(f"{base}/v1/chat/completions", json=many, timeout=60).status_code == 200
    one_big = {"model": "fake-model", "messages": [{"role": "user", "content": "y" * 5_000_000}]}
    reply = httpx.post(f"{base}/v1/chat/completions", json=one_big, timeout=60)
    assert reply.status_code == 200  # cut to fit the default 128k budget, then sent
    assert len(orjson.loads(provider.last.body)["messages"][0]["content"]) < 5_000_000


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize("declared", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_declared_json_is_refused(
    base: str, provider: FakeProvider, wire: str, declared: str | None
) -> None:
    """What a web page can send without a preflight (tests/security/test_edge_browser.py)."""
    body = orjson.dumps(VALID[wire])
    headers = {} if declared is None else {"content-type": declared}
    reply = httpx.post(f"{base}{PATHS[wire]}", content=body, headers=headers)
    assert reply.status_code == 415
    assert "application/json" in shaped(wire, reply)
    assert provider.requests == []


def test_json_with_a_charset_is_json(base: str, provider: FakeProvider) -> None:
    body = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    declared = {"content-type": "Application/JSON; charset=utf-8"}
    reply = httpx.post(f"{base}/v1/chat/completions", content=body, headers=declared)
    assert reply.status_code == 200 and provider.last.body == body


def test_broken_pairings_and_broken_images_are_never_sent_broken(
    base: str, provider: FakeProvider
) -> None:
    body = {
        "model": "fake-model",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,@@not-base64@@"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "orphan", "content": "x"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "dup", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "user", "content": "next"},
        ],
    }
    assert httpx.post(f"{base}/v1/chat/completions", json=body).status_code == 200
    assert pairing_errors(orjson.loads(provider.last.body)["messages"]) == []


def test_a_conversation_of_orphan_results_is_refused_not_sent_empty(
    base: str, provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> None:
    chat = {
        "model": "fake-model",
        "messages": [{"role": "tool", "tool_call_id": "x", "content": "?"}],
    }
    reply = httpx.post(f"{base}{PATHS['openai']}", json=chat)
    assert reply.status_code == 400 and "Nothing is left to send" in shaped("openai", reply)
    messages = {
        "model": "claude-x",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}],
    }
    reply = httpx.post(f"{base}{PATHS['anthropic']}", json=messages)
    assert reply.status_code == 400 and "answers no tool" in shaped("anthropic", reply)
    assert provider.requests == [] and anthropic_fake.requests == []


def test_http_1_0_and_chunked_bodies(base: str, provider: FakeProvider) -> None:
    host, port = base.removeprefix("http://").split(":")
    body = orjson.dumps(
        {"model": "fake-model", "messages": [{"role": "user", "content": "old client"}]}
    )
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0]
    assert provider.last.body == body

    def chunks() -> Any:
        yield body[:10]
        yield body[10:]

    assert (
        httpx.post(
            f"{base}/v1/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
        ).status_code
        == 200
    )
    assert provider.last.body == body


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "model",
                    "messages",
                    "role",
                    "content",
                    "max_tokens",
                    "input",
                    "contents",
                    "parts",
                    "text",
                    "type",
                    "tool_calls",
                    "stream",
                    "system",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(wire=st.sampled_from(list(PATHS)), body=json_values)
def test_fuzzed_bodies_never_break_brim(base: str, wire: str, body: Any) -> None:
    reply = httpx.post(
        f"{base}{PATHS[wire]}",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code != 500 and "Traceback" not in reply.text
    if reply.status_code >= 400:
        shaped(wire, reply)


# Conversations with every pairing mistake a client makes: tool-call ids from a three-letter
# alphabet, so orphans, duplicates, unanswered calls and answers in the wrong place are common;
# some texts large enough that the 3 000-token models must be compressed.
ids = st.sampled_from(["a", "b", "c"])
texts = st.sampled_from(["ok", "", "a longer line of tool output", "word " * 2_500])
chat_messages = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, texts),
    st.builds(lambda t: {"role": "system", "content": t}, texts),
    st.builds(lambda t: {"role": "assistant", "content": t}, texts),
    st.builds(
        lambda calls: {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in calls
            ],
        },
        st.lists(ids, min_size=1, max_size=3),
    ),
    st.builds(lambda i, t: {"role": "tool", "tool_call_id": i, "content": t}, ids, texts),
)
anthropic_blocks = {
    "user": st.one_of(
        st.builds(lambda t: {"type": "text", "text": t or "."}, texts),
        st.builds(lambda i, t: {"type": "tool_result", "tool_use_id": i, "content": t}, ids, texts),
    ),
    "assistant": st.one_of(
        st.builds(lambda t: {"type": "text", "text": t or "."}, texts),
        st.builds(lambda i: {"type": "tool_use", "id": i, "name": "f", "input": {}}, ids),
    ),
    # Mid-conversation system messages, anywhere: often where Anthropic does not take them.
    "system": st.builds(lambda t: {"type": "text", "text": t or "."}, texts),
}
anthropic_messages = st.sampled_from(["user", "user", "assistant", "assistant", "system"]).flatmap(
    lambda role: st.builds(
        lambda blocks: {"role": role, "content": blocks},
        st.lists(anthropic_blocks[role], min_size=1, max_size=3),
    )
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    wire=st.sampled_from(["openai", "anthropic"]),
    small=st.booleans(),
    chat=st.lists(chat_messages, min_size=1, max_size=10),
    messages=st.lists(anthropic_messages, min_size=1, max_size=10),
)
def test_fuzzed_conversations_never_reach_the_provider_broken(
    base: str,
    provider: FakeProvider,
    anthropic_fake: FakeAnthropic,
    wire: str,
    small: bool,
    chat: list[dict[str, Any]],
    messages: list[dict[str, Any]],
) -> None:
    provider.reset()
    anthropic_fake.reset()
    if wire == "openai":
        body: dict[str, Any] = {"model": "tiny" if small else "fake-model", "messages": chat}
    else:
        model = "claude-tiny" if small else "claude-x"
        body = {"model": model, "max_tokens": 64, "messages": messages}
    reply = httpx.post(f"{base}{PATHS[wire]}", json=body, timeout=30)
    assert reply.status_code in (200, 400), reply.text[:300]
    if reply.status_code == 400:
        shaped(wire, reply)  # brim's refusal (it could not make it fit), in the client's shape
    for seen in provider.requests:
        assert pairing_errors(orjson.loads(seen.body)["messages"]) == []
    assert anthropic_fake.rejections == []  # it checks each request as Anthropic does
