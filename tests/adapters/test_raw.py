"""RawHttpAdapter's mapping of transport failures and replies onto adapters.errors."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import types
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import orjson
import pytest
from aiohttp import web
from aioresponses import aioresponses
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import SecretStr, ValidationError

from brim.adapters.errors import (
    AuthFailed,
    ContextOverflow,
    RateLimited,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from brim.adapters.exchange import Exchange
from brim.adapters.raw import RawHttpAdapter
from brim.adapters.upstream_config import UpstreamConfig
from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider

URL = "https://provider.test/v1/chat/completions"
HELLO = [{"role": "user", "content": "ping"}]


def exchange(headers: dict[str, str] | None = None, query: str = "") -> Exchange:
    return Exchange(
        api="openai.chat",
        method="POST",
        endpoint="/chat/completions",
        query=query,
        model="m",
        body={"model": "m"},
        raw=b'{"model": "m"}',
        headers=CIMultiDictProxy(CIMultiDict(headers or {})),
        stream=False,
        upstream="p",
        request_id="r1",
        addressed="p",
    )


@pytest.fixture
async def adapter() -> AsyncIterator[RawHttpAdapter]:
    raw = RawHttpAdapter("p", UpstreamConfig(api="openai", base_url="https://provider.test/v1"))
    yield raw
    await raw.aclose()


@pytest.mark.parametrize(
    ("failure", "expected", "status", "message"),
    [
        (aiohttp.ClientConnectionError("refused"), UpstreamUnreachable, 502, "is unreachable"),
        (OSError("Name or service not known"), UpstreamUnreachable, 502, "is unreachable"),
        (
            aiohttp.ConnectionTimeoutError(),
            UpstreamTimeout,
            504,
            "could not be connected to within connect_timeout_s (10 s)",
        ),
        (
            aiohttp.SocketTimeoutError(),
            UpstreamTimeout,
            504,
            "did not answer within timeout_s (600 s)",
        ),
        (TimeoutError(), UpstreamTimeout, 504, "longer than max_duration_s (3600 s)"),
        (aiohttp.ServerDisconnectedError(), UpstreamProtocolError, 502, "broke off its reply"),
    ],
)
async def test_transport_failures_map_to_the_tree(
    adapter: RawHttpAdapter,
    failure: Exception,
    expected: type[Exception],
    status: int,
    message: str,
) -> None:
    with aioresponses() as mocked:
        mocked.post(URL, exception=failure)
        with pytest.raises(expected) as caught:
            await adapter.send(exchange())
    assert caught.value.status == status  # type: ignore[attr-defined]
    assert caught.value.upstream == "p"  # type: ignore[attr-defined]
    assert message in str(caught.value)


def test_max_duration_defaults_to_an_hour_and_must_be_positive() -> None:
    assert UpstreamConfig(api="openai", base_url="https://p/v1").max_duration_s == 3600
    with pytest.raises(ValidationError, match="max_duration_s"):
        UpstreamConfig(api="openai", base_url="https://p/v1", max_duration_s=0)


class Recorder:
    """A real provider on 127.0.0.1 that answers with whatever the test sets."""

    def __init__(self) -> None:
        self.seen: list[web.Request] = []
        self.bodies: list[bytes] = []
        self.reply = web.json_response({})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request)
        self.bodies.append(await request.read())
        return self.reply


@pytest.fixture
async def served(aiohttp_server: Any) -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    server = await aiohttp_server(app)
    yield recorder, str(server.make_url("")).rstrip("/")


def adapter_for(base_url: str, api: str = "openai", key: str | None = None) -> RawHttpAdapter:
    config = UpstreamConfig(api=api, base_url=base_url)  # type: ignore[arg-type]
    if key is not None:
        config = config.model_copy(update={"api_key": SecretStr(key)})
    return RawHttpAdapter("p", config)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (401, AuthFailed),
        (403, AuthFailed),
        (429, RateLimited),
        (400, UpstreamError),
        (500, UpstreamError),
    ],
)
async def test_error_replies_keep_status_and_body(
    served: tuple[Recorder, str], status: int, expected: type[UpstreamError]
) -> None:
    recorder, base = served
    recorder.reply = web.Response(status=status, body=b'{"error": "exact"}', headers={"x-a": "1"})
    adapter = adapter_for(f"{base}/v1")
    with pytest.raises(expected) as caught:
        await adapter.send(exchange())
    await adapter.aclose()
    assert type(caught.value) is expected
    assert caught.value.status == status
    assert caught.value.body == b'{"error": "exact"}'
    assert caught.value.headers["x-a"] == "1"


async def test_query_string_and_headers_are_forwarded(served: tuple[Recorder, str]) -> None:
    recorder, base = served
    recorder.reply = web.json_response({"ok": True})
    adapter = adapter_for(f"{base}/v1")
    reply = await adapter.send(
        exchange({"Authorization": "Bearer c", "Connection": "close", "X-Trace": "t"}, "beta=true")
    )
    await adapter.aclose()
    assert reply.status == 200 and reply.body == b'{"ok": true}'
    (request,) = recorder.seen
    assert request.path_qs == "/v1/chat/completions?beta=true"
    assert request.headers["Authorization"] == "Bearer c"
    assert request.headers["X-Trace"] == "t"
    assert recorder.bodies == [b'{"model": "m"}']


async def test_anthropic_upstream_gets_its_configured_key_as_x_api_key(
    served: tuple[Recorder, str],
) -> None:
    recorder, base = served
    adapter = adapter_for(base, api="anthropic", key="sk-ant")
    await adapter.send(exchange({"x-api-key": "client", "Authorization": "Bearer client"}))
    await adapter.aclose()
    (request,) = recorder.seen
    assert request.headers["x-api-key"] == "sk-ant"
    assert "Authorization" not in request.headers


CLIENT_CREDENTIALS = {
    "Authorization": "Bearer sk-client",
    "x-api-key": "sk-client",
    "x-goog-api-key": "AIza-client",
    "Cookie": "session=client",
    "X-Trace": "t",
}


@pytest.mark.parametrize("key", [None, "sk-own"], ids=["without-key", "with-own-key"])
async def test_a_request_for_another_upstream_carries_no_client_credential(
    served: tuple[Recorder, str], key: str | None
) -> None:
    """A request that addressed another upstream (a fallback sent here) goes without the
    client's credential headers, cookies and `key=`; with this upstream's own key if it has
    one. Whatever a stage does, the adapter does not pass a client's key on."""
    recorder, base = served
    adapter = adapter_for(base, api="gemini", key=key)
    elsewhere = dataclasses.replace(
        exchange(CLIENT_CREDENTIALS, "alt=sse&key=AIza-client&x=1"), addressed="home"
    )
    await adapter.send(elsewhere)
    await adapter.aclose()
    (request,) = recorder.seen
    assert request.query_string == "alt=sse&x=1"
    sent = {name.lower() for name in request.headers}
    assert not sent & {"authorization", "x-api-key", "cookie"}
    assert request.headers.get("x-goog-api-key") == key
    assert request.headers["X-Trace"] == "t"  # not a credential: it goes


async def test_the_configured_key_replaces_a_client_key_in_the_query_too(
    served: tuple[Recorder, str],
) -> None:
    recorder, base = served
    adapter = adapter_for(base, api="gemini", key="AIza-own")
    await adapter.send(exchange({"x-goog-api-key": "AIza-client"}, "key=AIza-client&alt=sse"))
    await adapter.aclose()
    (request,) = recorder.seen
    assert request.query_string == "alt=sse"
    assert request.headers["x-goog-api-key"] == "AIza-own"


async def test_event_streams_are_returned_as_chunks(served: tuple[Recorder, str]) -> None:
    recorder, base = served
    recorder.reply = web.Response(
        body=b"data: 1\n\ndata: [DONE]\n\n", content_type="text/event-stream"
    )
    adapter = adapter_for(f"{base}/v1")
    reply = await adapter.send(exchange())
    assert reply.body is None and reply.chunks is not None
    received = b"".join([chunk async for chunk in reply.chunks])
    await reply.aclose()
    await adapter.aclose()
    assert received == b"data: 1\n\ndata: [DONE]\n\n"


OVERFLOW_EVENT = b'data: {"error": {"message": "This model\'s maximum context length is 4096 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}\n\n'


async def test_an_overflow_as_the_first_stream_event_is_an_overflow(
    served: tuple[Recorder, str],
) -> None:
    recorder, base = served
    recorder.reply = web.Response(
        body=b": keep-alive\n\n" + OVERFLOW_EVENT, content_type="text/event-stream"
    )
    adapter = adapter_for(f"{base}/v1")
    with pytest.raises(ContextOverflow) as caught:
        await adapter.send(exchange())
    await adapter.aclose()
    assert caught.value.overflow.limit == 4096
    assert caught.value.status == 200 and caught.value.body.endswith(OVERFLOW_EVENT)


async def test_an_empty_stream_is_treated_as_an_overflow(served: tuple[Recorder, str]) -> None:
    recorder, base = served
    recorder.reply = web.Response(body=b"", content_type="text/event-stream")
    adapter = adapter_for(f"{base}/v1")
    with pytest.raises(ContextOverflow, match="empty stream"):
        await adapter.send(exchange())
    await adapter.aclose()


async def test_a_normal_stream_is_replayed_whole_after_the_check(
    served: tuple[Recorder, str],
) -> None:
    recorder, base = served
    body = (
        b'data: {"choices": [{"delta": {"content": "an error message is fine here"}}]}\n\n' * 50
        + b"data: [DONE]\n\n"
    )
    recorder.reply = web.Response(body=body, content_type="text/event-stream")
    adapter = adapter_for(f"{base}/v1")
    reply = await adapter.send(exchange())
    assert reply.chunks is not None
    assert b"".join([chunk async for chunk in reply.chunks]) == body
    await reply.aclose()
    await adapter.aclose()


SECRET = "the user's private words"


@pytest.mark.parametrize(
    ("reply", "described"),
    [
        (
            web.Response(body=f"{{{SECRET}".encode(), content_type="application/json"),
            "HTTP 200 with a body that is not JSON (application/json, 25 bytes)",
        ),
        (
            web.Response(
                status=201, body=f"<html>{SECRET}</html>".encode(), content_type="text/html"
            ),
            "HTTP 201 with a body that is not JSON (text/html, 37 bytes); is base_url right?",
        ),
        (web.Response(body=b""), "not JSON (no content type, 0 bytes)"),
    ],
)
async def test_a_success_that_is_not_json_is_a_protocol_error_that_never_echoes_the_body(
    served: tuple[Recorder, str], reply: web.Response, described: str
) -> None:
    recorder, base = served
    recorder.reply = reply
    adapter = adapter_for(f"{base}/v1")
    with pytest.raises(UpstreamProtocolError) as caught:
        await adapter.send(exchange())
    await adapter.aclose()
    assert caught.value.status == 502 and caught.value.code == "upstream_protocol_error"
    assert described in caught.value.message
    assert SECRET not in caught.value.message and "private" not in repr(caught.value)


@pytest.mark.parametrize(
    ("method", "reply"),
    [
        ("POST", web.Response(status=204)),
        ("HEAD", web.Response(status=200, headers={"Content-Type": "application/json"})),
        ("GET", web.json_response({"object": "list", "data": []})),
        ("POST", web.Response(body=b" [1, 2] \n", content_type="application/json")),
        ("POST", web.Response(status=302, headers={"Location": "/elsewhere"})),
    ],
)
async def test_replies_without_a_json_body_by_rights_pass(
    served: tuple[Recorder, str], method: str, reply: web.Response
) -> None:
    recorder, base = served
    recorder.reply = reply
    adapter = adapter_for(f"{base}/v1")
    sent = await adapter.send(dataclasses.replace(exchange(), method=method))
    await adapter.aclose()
    assert sent.status == reply.status
    if sent.body:  # parsed once, here, and handed on (Observe reads usage from it)
        assert sent.payload == orjson.loads(sent.body)


async def test_a_stream_under_the_wrong_content_type_is_relayed_only_when_one_was_asked_for(
    served: tuple[Recorder, str],
) -> None:
    recorder, base = served
    stream = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
    recorder.reply = web.Response(body=stream, content_type="text/plain")
    adapter = adapter_for(f"{base}/v1")
    sent = await adapter.send(dataclasses.replace(exchange(), stream=True))
    assert sent.body == stream
    recorder.reply = web.Response(body=stream, content_type="text/plain")  # one reply, one use
    with pytest.raises(UpstreamProtocolError, match=r"not JSON \(text/plain, 37 bytes\)"):
        await adapter.send(exchange())
    await adapter.aclose()


# ---- the provider's own token count ----------------------------------------------------------


def count_exchange(body: dict[str, Any]) -> Exchange:
    raw = orjson.dumps(body)
    return dataclasses.replace(
        exchange(),
        api="anthropic.messages",
        endpoint="/v1/messages",
        model="claude-x",
        body=body,
        raw=raw,
    )


async def test_a_count_reply_that_stalls_after_its_headers_is_a_stalled_reply_not_no_answer(
    aiohttp_server: Any,
) -> None:
    async def stalls(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"input_tok')
        await asyncio.sleep(5)
        return response

    app = web.Application()
    app.router.add_post("/v1/messages/count_tokens", stalls)
    server = await aiohttp_server(app)
    config = UpstreamConfig(api="anthropic", base_url=str(server.make_url("")).rstrip("/"))
    adapter = RawHttpAdapter("p", config.model_copy(update={"timeout_s": 0.3}))
    with pytest.raises(UpstreamTimeout, match="sent no next chunk within timeout_s"):
        await adapter.count_tokens(count_exchange({"model": "claude-x", "messages": []}))
    await adapter.aclose()


async def test_a_large_count_body_is_written_out_off_the_event_loop(
    aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brim.adapters import raw
    from brim.adapters.adapter import OFF_LOOP_BYTES

    bodies: list[bytes] = []

    async def counts(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response({"input_tokens": 70_000})

    app = web.Application(client_max_size=4 * OFF_LOOP_BYTES)
    app.router.add_post("/v1/messages/count_tokens", counts)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    threads: list[threading.Thread] = []

    def dumps(value: Any, *args: Any) -> bytes:
        threads.append(threading.current_thread())
        return orjson.dumps(value, *args)

    fake = types.SimpleNamespace(
        dumps=dumps, loads=orjson.loads, JSONDecodeError=orjson.JSONDecodeError
    )
    monkeypatch.setattr(raw, "orjson", fake)
    adapter = adapter_for(base, api="anthropic")
    small = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}
    large = {"model": "claude-x", "messages": [{"role": "user", "content": "x" * OFF_LOOP_BYTES}]}
    assert await adapter.count_tokens(count_exchange(small)) == 70_000
    assert await adapter.count_tokens(count_exchange(large)) == 70_000
    await adapter.aclose()
    assert threads[0] is threading.current_thread()  # small: not worth a thread
    assert threads[1] is not threading.current_thread()
    assert orjson.loads(bodies[1]) == large


def test_the_upstreams_that_count_natively_are_listed_once() -> None:
    from brim.adapters.native import NATIVE_COUNTS
    from brim.adapters.upstream_config import NATIVE_COUNT_APIS

    assert frozenset(NATIVE_COUNTS) == NATIVE_COUNT_APIS == {"anthropic", "gemini"}


def test_a_counter_counts_only_the_requests_of_its_own_api() -> None:
    from brim.adapters.native import NATIVE_COUNTS, native_count_for

    messages = count_exchange({"model": "claude-x", "messages": []})
    assert native_count_for("anthropic", messages) is NATIVE_COUNTS["anthropic"]
    assert native_count_for("gemini", messages) is None  # counts generateContent requests
    assert native_count_for("openai", messages) is None  # has no counter
    assert native_count_for("anthropic", exchange()) is None  # a Chat request


async def test_a_count_asked_for_another_apis_request_is_refused_before_any_call() -> None:
    adapter = adapter_for("https://provider.test", api="anthropic")
    with aioresponses() as mocked, pytest.raises(ValueError, match="no token counter"):
        await adapter.count_tokens(exchange())
    assert not mocked.requests
    await adapter.aclose()


@pytest.mark.parametrize(("status", "body"), [(302, b""), (404, b'{"error": "not here"}')])
async def test_a_count_reply_that_is_not_a_success_is_its_upstream_error(
    served: tuple[Recorder, str], status: int, body: bytes
) -> None:
    recorder, base = served
    recorder.reply = web.Response(status=status, body=body, headers={"Location": "/elsewhere"})
    adapter = adapter_for(base, api="anthropic")
    with pytest.raises(UpstreamError) as caught:
        await adapter.count_tokens(count_exchange({"model": "claude-x", "messages": []}))
    await adapter.aclose()
    assert (caught.value.status, caught.value.body) == (status, body)
    assert recorder.seen[0].path == "/v1/messages/count_tokens"
    assert recorder.seen[0].headers["Accept"] == "application/json"


def test_the_first_event_of_a_stream_says_whether_it_reports_an_overflow() -> None:
    from brim.adapters.raw import first_event

    preamble = b'event: response.created\ndata: {"type": "response.created"}\n\n'
    assert first_event(b"") is None
    assert first_event(OVERFLOW_EVENT[:40]) is None  # not whole yet
    assert first_event(preamble) is None  # a preamble is not the first event
    data, overflow = first_event(preamble + OVERFLOW_EVENT) or (b"", None)
    assert data == OVERFLOW_EVENT.removeprefix(b"data: ").rstrip(b"\n")
    assert overflow is not None and overflow.limit == 4096
    assert first_event(b'data: {"choices": []}\n\n') == (b'{"choices": []}', None)


def one_client(base: str, api: str, cookie: str | None) -> httpx.Headers:
    """The headers of the reply to one request from a client of its own (a new SDK client, no
    cookies kept from before), sending `cookie` if given: the official SDK for Chat, Responses
    and Messages, a plain HTTP client for Gemini (whose SDK is not among the test tools)."""
    sent = {"Cookie": cookie} if cookie else {}
    if api == "chat":
        oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-c", default_headers=sent)
        return oa.chat.completions.with_raw_response.create(
            model="fake-model", messages=HELLO
        ).headers
    if api == "responses":
        oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-c", default_headers=sent)
        return oa.responses.with_raw_response.create(model="fake-model", input="ping").headers
    if api == "messages":
        ant = anthropic.Anthropic(base_url=base, api_key="sk-ant", default_headers=sent)
        reply = ant.messages.with_raw_response.create(
            model="claude-x",
            max_tokens=10,
            messages=HELLO,
        )
        return reply.headers
    body = {"contents": [{"role": "user", "parts": [{"text": "ping"}]}]}
    url = f"{base}/v1beta/models/gem-x:generateContent"
    reply = httpx.post(url, json=body, headers={"x-goog-api-key": "k", **sent}, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.headers


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "gemini"])
def test_a_cookie_one_client_was_sent_never_reaches_the_provider_with_another_clients_request(
    brim: BrimFactory, provider: FakeProvider, api: str
) -> None:
    """Providers' CDNs set cookies (Cloudflare's `__cf_bm` on api.openai.com). The upstream
    connection pool is shared by every client: a cookie kept there would go out with the next
    client's requests. The client it was meant for gets it, as sent; the provider sees only
    the cookies a client itself sends."""
    provider.set_cookie = "__cf_bm=one-clients; Path=/; HttpOnly"
    sections = every_api(provider)
    for upstream in sections["upstreams"].values():  # by name: no jar keeps an IP's cookies
        upstream["base_url"] = upstream["base_url"].replace("127.0.0.1", "localhost")
    base = brim(**sections)

    first = one_client(base, api, None)
    one_client(base, api, None)  # another client
    one_client(base, api, "mine=1")  # a client with a cookie of its own

    assert first["set-cookie"] == provider.set_cookie  # relayed to its client
    seen = [request for request in provider.requests if request.path != "/v1/models"]
    assert len(seen) == 3
    assert "cookie" not in seen[0].headers
    assert "cookie" not in seen[1].headers  # not the first client's
    assert seen[2].headers["cookie"] == "mine=1"  # a client's own, and nothing added
