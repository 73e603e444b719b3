"""Strict inputs at the edge (issue 34, attacks 3 and 8): a path parameter cannot steer brim's
upstream request elsewhere, a body that repeats a key is refused before it is routed, and a
client's `x-request-id` reaches brim's logs and headers only as a short token."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import orjson
import pytest
from aiohttp import web

from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider, LoopThread, start_app, wait_for
from tests.proxy.test_bad_input import PATHS, shaped

JSON = {"content-type": "application/json"}
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
OWN_KEY = "AIza-brims-own-key-for-gemini"


# --- the Gemini route's model segment (attack 3) ---------------------------------------------------


@pytest.fixture
def seen_upstream(loop_thread: LoopThread) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """An upstream that answers every path (a Gemini reply) and records each request's path and
    key, so that a request steered to another path shows up here."""
    seen: list[tuple[str, str]] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("x-goog-api-key", "")))
        await request.read()
        reply = {"candidates": [{"content": {"role": "model", "parts": [{"text": "pong"}]}}]}
        return web.json_response(reply)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner, url = loop_thread.run(start_app(app))
    yield url, seen
    loop_thread.run(runner.cleanup())


TRAVERSALS = [
    "gemini-2.5-flash%2F..%2F..%2F..%2Fv1beta%2FcachedContents",
    "gemini-2.5-flash%2F..%2Fgemini-pro",
    "..%2Fcorpora",
    "gemini%252F..%252Fx",
    "-gemini",
    "gemini%3Fkey=x",
]


@pytest.mark.parametrize("prefix", ["/v1beta", "/v1"])
@pytest.mark.parametrize("model", TRAVERSALS)
def test_a_model_segment_cannot_reach_another_upstream_path(
    brim: BrimFactory,
    seen_upstream: tuple[str, list[tuple[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
    prefix: str,
    model: str,
) -> None:
    """With brim's own key configured, an escaped slash in the model segment once reached
    `/v1beta/cachedContents` upstream with that key. Now: 400 in Gemini's shape, naming the
    model, and nothing sent."""
    url, seen = seen_upstream
    monkeypatch.setenv("EDGE_GEMINI_KEY", OWN_KEY)
    base = brim(
        upstreams={"gemini": {"api": "gemini", "base_url": url, "api_key_env": "EDGE_GEMINI_KEY"}}
    )
    raw_url = f"{base}{prefix}/models/{model}:generateContent"
    reply = httpx.post(httpx.URL(raw_url), json=GEMINI_BODY)
    assert reply.status_code == 400, reply.text
    assert "is not a model id" in shaped("gemini", reply)
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert seen == []
    # The same route with a plain model id goes where it should, with brim's key.
    fine = httpx.post(f"{base}{prefix}/models/gemini-2.5-flash:generateContent", json=GEMINI_BODY)
    assert fine.status_code == 200
    assert seen == [("/v1beta/models/gemini-2.5-flash:generateContent", OWN_KEY)]


# --- repeated keys (attack 8) ----------------------------------------------------------------------


def _repeat(raw: bytes, key: bytes, value: bytes) -> bytes:
    """`raw` (a JSON object) with `"key": value` added again after its first `{`."""
    return b'{"' + key + b'": ' + value + b", " + raw[1:]


def _repeat_in_first_message(raw: bytes, field: bytes) -> bytes:
    """`raw` with its first message object (or Gemini content) repeating `field`."""
    at = raw.index(b'{"role"') + 1
    return raw[:at] + b'"' + field + b'": "user", ' + raw[at:]


HI = {"role": "user", "content": "hi"}
BODIES: dict[str, dict[str, object]] = {
    "openai": {"model": "fake-model", "messages": [HI]},
    "responses": {"model": "fake-model", "input": [HI]},
    "anthropic": {"model": "claude-x", "max_tokens": 5, "messages": [HI]},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
}
# What each wire's body repeats at the top level: the model (Gemini's is in the URL: its
# conversation), and within a message object.
TOP = {"openai": b"model", "responses": b"model", "anthropic": b"model", "gemini": b"contents"}


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(**every_api(provider))


@pytest.mark.parametrize("wire", list(PATHS))
def test_a_body_that_repeats_a_key_is_refused_before_it_is_routed(
    base: str, provider: FakeProvider, wire: str
) -> None:
    """`"model"` twice was routed on the last and forwarded with both (a provider that reads the
    first answers for a model brim did not count or guard for). Now 400, nothing sent."""
    raw = orjson.dumps(BODIES[wire])
    value = b'"gpt-4o"' if wire != "gemini" else b"[]"
    for repeated in (
        _repeat(raw, TOP[wire], value),
        _repeat_in_first_message(raw, b"role"),
    ):
        reply = httpx.post(f"{base}{PATHS[wire]}", content=repeated, headers=JSON)
        assert reply.status_code == 400, reply.text
        assert "repeats the key" in shaped(wire, reply)
    assert provider.requests == []
    # Spaced out, and with a colon written as an escape in a string: still found.
    spaced = json.dumps(BODIES[wire], indent=1).encode()
    sneaky = _repeat(spaced, TOP[wire], value + b', "x": "\\u003a"')
    reply = httpx.post(f"{base}{PATHS[wire]}", content=sneaky, headers=JSON)
    assert reply.status_code == 400 and "repeats the key" in shaped(wire, reply)
    assert provider.requests == []
    # The body as written, once, goes through untouched.
    assert httpx.post(f"{base}{PATHS[wire]}", content=raw, headers=JSON).status_code == 200
    assert provider.last.body == raw


# --- x-request-id (attack 8) -----------------------------------------------------------------------

TOKEN = "req_01J9Z:retry-2.a"
FORGERIES = [
    "x 127.0.0.1 GET /admin/status 200 0.1ms",  # a second request, in the access log's words
    "a" * 129,
    "id\tPOST",
    "<script>alert(1)</script>",
    "",
]
ACCESS_LINE = re.compile(r"^(\S+) (GET|POST) (/\S*) (\d{3}) [\d.]+ms$")


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]


@pytest.mark.parametrize("given", FORGERIES)
def test_a_request_id_that_is_not_a_short_token_is_replaced(
    base: str, caplog: pytest.LogCaptureFixture, given: str
) -> None:
    """Through the SDKs, as each client sets it: brim's id for the request (its access log line,
    its `x-brim-request-id`) is the client's only when it is a token of at most 128 characters
    of `[A-Za-z0-9._:-]`."""
    headers = {"x-request-id": given}
    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        chat = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-x", max_retries=0)
        sent = chat.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
        messages = anthropic.Anthropic(base_url=base, api_key="sk-ant-x", max_retries=0)
        told = messages.messages.with_raw_response.create(
            model="claude-x",
            max_tokens=5,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers=headers,
        )
        wait_for(lambda: len(access_lines(caplog)) == 2)  # written once each reply is sent
    ids = [sent.headers["x-brim-request-id"], told.headers["x-brim-request-id"]]
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids), ids
    lines = access_lines(caplog)
    assert len(lines) == 2 and all(ACCESS_LINE.match(line) for line in lines), lines
    assert [line.split(" ", 1)[0] for line in lines] == ids


def test_a_short_token_is_kept_as_the_request_id(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-request-id": TOKEN},
        )
        assert wait_for(lambda: access_lines(caplog))
    assert reply.headers["x-brim-request-id"] == TOKEN
    assert access_lines(caplog)[0].startswith(f"{TOKEN} POST /v1/chat/completions 200 ")
