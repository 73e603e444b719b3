"""A corpus of bad requests, on every wire API: never a 500, never a traceback, never anything
invalid sent upstream — an answer in the client's own format that names the problem."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider, pairing_errors

PATHS = {
    "openai": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/gem-x:generateContent",
}


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(
        upstreams={
            "openai": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "claude": {"api": "anthropic", "base_url": "http://127.0.0.1:9"},
            "gemini": {"api": "gemini", "base_url": provider.url},
        },
        server={"max_body_mb": 32},
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


WRONG: list[tuple[str, dict[str, Any]]] = [
    ("openai", {"model": "fake-model"}),
    ("openai", {"model": ["a"], "messages": [{"role": "user", "content": "x"}]}),
    ("openai", {"model": "fake-model", "messages": [{"role": "robot", "content": "x"}]}),
    (
        "openai",
        {"model": "fake-model", "messages": [{"role": "user", "content": {"nested": True}}]},
    ),
    ("openai", {"model": "fake-model", "messages": "hello"}),
    ("responses", {"input": "hi"}),
    ("responses", {"model": 3, "input": "hi"}),
    ("anthropic", {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}),
    (
        "anthropic",
        {"model": "claude-x", "max_tokens": "lots", "messages": [{"role": "user", "content": "x"}]},
    ),
    (
        "anthropic",
        {
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"no_type": 1}]}],
        },
    ),
    ("gemini", {"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]}),
    ("gemini", {"contents": [{"role": "user", "parts": []}]}),
]


@pytest.mark.parametrize(("wire", "body"), WRONG)
def test_wrong_fields_are_named(
    base: str, provider: FakeProvider, wire: str, body: dict[str, Any]
) -> None:
    reply = httpx.post(f"{base}{PATHS[wire]}", json=body)
    assert reply.status_code == 400
    assert shaped(wire, reply)
    assert provider.requests == []


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


def test_a_wrong_content_type_is_still_read_as_json(base: str, provider: FakeProvider) -> None:
    body = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    reply = httpx.post(
        f"{base}/v1/chat/completions", content=body, headers={"content-type": "text/plain"}
    )
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
