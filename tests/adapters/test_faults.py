"""The upstream fault matrix: every way a provider (or the client) can fail, driven through a
real brim in front of the fake provider. For each case: (a) the documented status and an error in
the client's own wire shape (or, mid-stream, an error event in that shape), (b) the upstream
request closed — the fake's handler ends well before it would have by itself — and (c) no task
left behind on the loop that runs brim and the fake."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import httpx
import openai
import orjson
import pytest

from brim.adapters.errors import UpstreamTimeout
from brim.policies.wires.chat import CHAT
from brim.policies.wires.messages import MESSAGES
from brim.proxy.relay import EventCut
from tests.conftest import BrimFactory, fake_upstream
from tests.fakes import HTML_PAGE, FakeProvider, LoopThread, wait_for

HELLO = [{"role": "user", "content": "ping"}]
# Keep-alive connections may outlive a case: the fake's side of brim's pooled connection, brim's
# side of the client's. Any other task that outlives a case is a leak.
KEEP_ALIVE_CONNECTIONS = 2
# The fake would hold a "hang" request 30 s, a stalled stream 5 s, an endless one 20 s: seeing
# its handler end within this long means brim closed the upstream request.
CLOSED_WITHIN_S = 2.5

Wire = Literal["chat", "messages"]
Base = Literal["fake", "refused", "dns", "tls"]
Client = Literal["reads", "leaves-before-reply", "leaves-mid-stream"]


@dataclass(frozen=True)
class Fault:
    model: str
    status: int
    code: str | None  # brim's own error code; None: the provider's reply, relayed unchanged
    says: str = ""  # a fragment of brim's message
    stream: bool = False
    mid_stream: bool = False  # the answer is a 200 stream ending in an error event
    base: Base = "fake"
    upstream: dict[str, Any] = field(default_factory=dict)
    client: Client = "reads"


FAULTS = {
    "connection refused": Fault(
        "m", 502, "upstream_unreachable", "is unreachable", base="refused"
    ),
    "DNS failure": Fault("m", 502, "upstream_unreachable", "is unreachable", base="dns"),
    "TLS failure": Fault("m", 502, "upstream_unreachable", "is unreachable", base="tls"),
    "HTTP 500": Fault("error-500", 500, None),
    "HTTP 502": Fault("error-502", 502, None),
    "HTTP 503": Fault("error-503", 503, None),
    "HTTP 529 overloaded": Fault("error-529", 529, None),
    "timeout before headers": Fault(
        "hang", 504, "upstream_timeout", "did not answer within timeout_s (0.3 s)",
        upstream={"timeout_s": 0.3},
    ),
    "max_duration_s before headers": Fault(
        "hang", 504, "upstream_timeout", "longer than max_duration_s (0.3 s)",
        upstream={"max_duration_s": 0.3},
    ),
    "stall mid-stream": Fault(
        "stalled-stream", 200, "upstream_timeout", "sent no next chunk within timeout_s (0.3 s)",
        stream=True, mid_stream=True, upstream={"timeout_s": 0.3},
    ),
    "connection broken off mid-stream (FIN)": Fault(
        "broken-stream", 200, "upstream_protocol_error", "broke off its reply",
        stream=True, mid_stream=True,
    ),
    "connection reset mid-stream (RST)": Fault(
        "reset-stream", 200, "upstream_protocol_error", "broke off its reply",
        stream=True, mid_stream=True,
    ),
    "never-ending stream": Fault(
        "endless-stream", 200, "upstream_timeout", "longer than max_duration_s (0.5 s)",
        stream=True, mid_stream=True, upstream={"max_duration_s": 0.5},
    ),
    "malformed JSON in a 200": Fault(
        "garbage", 502, "upstream_protocol_error",
        "answered HTTP 200 with a body that is not JSON (application/json, 16 bytes)",
    ),
    "an HTML page in a 200": Fault(
        "html-page", 502, "upstream_protocol_error",
        f"not JSON (text/html, {len(HTML_PAGE)} bytes); is base_url right?",
    ),
    "client leaves before the reply": Fault(
        "hang", 0, None, client="leaves-before-reply"
    ),
    "client leaves mid-stream": Fault(
        "endless-stream", 200, None, stream=True, client="leaves-mid-stream"
    ),
}  # fmt: skip
ANTHROPIC_FAULTS = [
    "connection refused",
    "HTTP 529 overloaded",
    "timeout before headers",
    "stall mid-stream",
    "connection reset mid-stream (RST)",
    "never-ending stream",
    "an HTML page in a 200",
    "client leaves mid-stream",
]


def upstream_of(
    fault: Fault, wire: Wire, provider: FakeProvider, closed_port: int
) -> dict[str, Any]:
    base_url = {
        "fake": provider.url,
        "refused": f"http://127.0.0.1:{closed_port}",
        "dns": "http://no-such-host.invalid",
        "tls": provider.url.replace("http://", "https://"),
    }[fault.base]
    if wire == "chat":
        return fake_upstream(provider, base_url=f"{base_url}/v1", **fault.upstream)
    return {"api": "anthropic", "base_url": base_url, **fault.upstream}


def request_of(wire: Wire, model: str, stream: bool) -> tuple[str, dict[str, Any]]:
    if wire == "chat":
        return "/v1/chat/completions", {"model": model, "messages": HELLO, "stream": stream}
    body = {"model": model, "max_tokens": 64, "messages": HELLO, "stream": stream}
    return "/v1/messages", body


@dataclass(frozen=True)
class Census:
    connections: int  # aiohttp server connections (brim's and the fake's), idle ones included
    others: int  # every other live task: handlers, streams, timers, background work

    def within(self, before: Census) -> bool:
        return (
            self.others <= before.others
            and self.connections <= before.connections + KEEP_ALIVE_CONNECTIONS
        )


def census(loop_thread: LoopThread) -> Census:
    async def count() -> Census:
        tasks = [t for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()]
        connections = sum(t.get_coro().__qualname__ == "RequestHandler.start" for t in tasks)  # type: ignore[union-attr]
        return Census(connections, len(tasks) - connections)

    return loop_thread.run(count())


def settles(loop_thread: LoopThread, before: Census, timeout: float = 3.0) -> Census:
    """The loop's tasks, once they are back within `before` (or as they are after `timeout`)."""
    deadline = time.monotonic() + timeout
    while not (now := census(loop_thread)).within(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def events_of(text: str) -> list[tuple[str | None, Any]]:
    """A server-sent event stream as (event name, parsed data) pairs."""
    events: list[tuple[str | None, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[5:].strip() for line in lines if line.startswith("data:"))
        if data and data != "[DONE]":
            events.append((name, orjson.loads(data)))
    return events


def assert_brims_error(reply: httpx.Response, wire: Wire, fault: Fault) -> None:
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert "upstream 'up'" in str(body)  # names the upstream
    if wire == "chat":
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == fault.code
        assert fault.says in body["error"]["message"]
    else:
        assert body == {
            "type": "error",
            "error": {"type": "api_error", "message": body["error"]["message"]},
        }
        assert fault.says in body["error"]["message"]


def assert_providers_error(reply: httpx.Response, wire: Wire, fault: Fault) -> None:
    assert reply.headers["x-fake-error"] == "yes" and reply.headers["retry-after"] == "7"
    if wire == "chat":
        assert reply.json()["error"]["code"] == f"fake_{fault.status}"
    else:
        kind = "overloaded_error" if fault.status == 529 else "api_error"
        assert reply.json() == {
            "type": "error",
            "error": {"type": kind, "message": f"fake provider says {fault.status}"},
        }


def assert_error_event(reply: httpx.Response, wire: Wire, fault: Fault) -> None:
    events = events_of(reply.text)  # parses every event: none was left half-written
    name, last = events[-1]
    if wire == "chat":
        assert name is None and set(last) == {"error"}
        assert last["error"]["code"] == fault.code and fault.says in last["error"]["message"]
        assert any("choices" in data for _, data in events[:-1])  # the stream had begun
    else:
        assert name == "error" and last["type"] == "error"
        assert last["error"]["type"] == "api_error" and fault.says in last["error"]["message"]
        assert [n for n, _ in events[:2]] == ["message_start", "content_block_start"]


def drive(base: str, wire: Wire, fault: Fault) -> httpx.Response | None:
    path, body = request_of(wire, fault.model, fault.stream)
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"} if wire == "messages" else {}
    url = f"{base}{path}"
    if fault.client == "leaves-before-reply":
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, headers=headers, timeout=httpx.Timeout(5, read=0.3))
        return None
    if fault.client == "leaves-mid-stream":
        with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as reply:
            assert reply.status_code == 200
            next(reply.iter_bytes())
        return None
    return httpx.post(url, json=body, headers=headers, timeout=10)


def run_case(
    wire: Wire,
    fault: Fault,
    brim: BrimFactory,
    provider: FakeProvider,
    loop_thread: LoopThread,
    closed_port: int,
) -> httpx.Response | None:
    assert wait_for(lambda: provider.in_flight == 0), "an earlier request is still upstream"
    base = brim(upstreams={"up": upstream_of(fault, wire, provider, closed_port)})
    before = census(loop_thread)
    started = time.monotonic()
    reply = drive(base, wire, fault)

    if reply is not None:
        assert reply.status_code == fault.status, reply.text
        if fault.mid_stream:
            assert_error_event(reply, wire, fault)
        elif fault.code is not None:
            assert_brims_error(reply, wire, fault)
        else:
            assert_providers_error(reply, wire, fault)
    if fault.base == "fake":
        assert provider.requests, "the request never reached the provider"
        assert wait_for(lambda: provider.in_flight == 0, timeout=CLOSED_WITHIN_S), (
            "the upstream request was left open"
        )
    after = settles(loop_thread, before)
    assert after.within(before), (before, after)
    assert time.monotonic() - started < 5
    return reply


CASES: list[tuple[Wire, str]] = [("chat", name) for name in FAULTS] + [
    ("messages", name) for name in ANTHROPIC_FAULTS
]


@pytest.mark.parametrize(("wire", "name"), CASES)
def test_fault(
    wire: Wire,
    name: str,
    brim: BrimFactory,
    provider: FakeProvider,
    loop_thread: LoopThread,
    closed_port: int,
) -> None:
    run_case(wire, FAULTS[name], brim, provider, loop_thread, closed_port)


def test_an_empty_200_stream_is_retried_then_answered_502(
    brim: BrimFactory, provider: FakeProvider, loop_thread: LoopThread, closed_port: int
) -> None:
    """llama.cpp's server answers an overflow with an empty 200 stream: brim takes it for a
    context overflow and retries with a cut request while it can. Still empty, it is not
    relayed as a success with nothing in it: the client gets a 502 in its own format."""
    fault = Fault("empty-stream", 200, None, stream=True)
    wires: tuple[Wire, ...] = ("chat", "messages")
    for wire in wires:
        provider.reset()
        path, body = request_of(wire, fault.model, stream=True)
        body["messages"] = [
            {"role": "user", "content": f"old question {n} " + "words " * 300} for n in range(6)
        ] + HELLO
        base = brim(upstreams={"up": upstream_of(fault, wire, provider, closed_port)})
        before = census(loop_thread)
        reply = httpx.post(f"{base}{path}", json=body, timeout=10)
        assert reply.status_code == 502
        retries = int(reply.headers["x-brim-retries"])
        error = reply.json()["error"]
        assert error["type"] == ("upstream_error" if wire == "chat" else "api_error")
        message = error["message"]
        assert "empty stream" in message and f"retried {retries} times" in message
        assert retries >= 1 and len(provider.requests) == retries + 1
        assert len(provider.requests[-1].body) < len(provider.requests[0].body)
        assert wait_for(lambda: provider.in_flight == 0, timeout=CLOSED_WITHIN_S)
        assert settles(loop_thread, before).within(before)


def test_an_empty_200_stream_without_retries_is_502_too(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(retry={"enabled": False})
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "empty-stream", "messages": HELLO, "stream": True},
    )
    assert reply.status_code == 502 and reply.json()["error"]["code"] == "upstream_protocol_error"
    assert "retried" not in reply.json()["error"]["message"] and len(provider.requests) == 1


# The SDKs: each raises its own error, carrying brim's message, when a stream breaks off.


def test_openai_sdk_raises_api_error_on_a_stalled_stream(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(upstreams={"fake": fake_upstream(provider, timeout_s=0.3)})
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    stream = sdk.chat.completions.create(model="stalled-stream", messages=HELLO, stream=True)  # type: ignore[arg-type]
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "first" in received
    assert "sent no next chunk within timeout_s (0.3 s)" in caught.value.message
    assert caught.value.code == "upstream_timeout"  # type: ignore[attr-defined]


def test_openai_sdk_reads_brims_error_not_half_an_event_after_a_reset(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    sdk = openai.OpenAI(base_url=f"{brim()}/v1", api_key="k", max_retries=0)
    stream = sdk.chat.completions.create(model="reset-stream", messages=HELLO, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert "broke off its reply" in caught.value.message


def test_anthropic_sdk_raises_on_a_stalled_stream(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        upstreams={"claude": {"api": "anthropic", "base_url": provider.url, "timeout_s": 0.3}}
    )
    sdk = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    text: list[str] = []
    opened = sdk.messages.stream(model="stalled-stream", max_tokens=64, messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(anthropic.APIStatusError) as caught, opened as stream:
        text.extend(stream.text_stream)
    assert text == ["first"]
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "upstream 'claude' sent no next chunk within timeout_s (0.3 s)",
        },
    }
    assert "sent no next chunk" in str(caught.value)


def test_responses_stream_ends_with_the_responses_error_event(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(upstreams={"fake": fake_upstream(provider, timeout_s=0.3)})
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    events = list(sdk.responses.create(model="stalled-stream", input="ping", stream=True))
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_text.delta",
        "error",
    ]
    error = events[-1]
    assert error.code == "upstream_timeout"  # type: ignore[union-attr]
    assert "sent no next chunk" in error.message  # type: ignore[union-attr]
    assert error.sequence_number == 3 and error.param is None  # type: ignore[union-attr]


def test_gemini_stream_ends_with_googles_error_object(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(upstreams={"g": {"api": "gemini", "base_url": provider.url, "timeout_s": 0.3}})
    reply = httpx.post(
        f"{base}/v1beta/models/stalled-stream:streamGenerateContent?alt=sse",
        json={"contents": [{"role": "user", "parts": [{"text": "ping"}]}]},
        timeout=10,
    )
    assert reply.status_code == 200
    events = events_of(reply.text)
    assert events[0][1]["candidates"][0]["content"]["parts"] == [{"text": "first"}]
    assert events[-1] == (
        None,
        {
            "error": {
                "code": 504,
                "message": "upstream 'g' sent no next chunk within timeout_s (0.3 s)",
                "status": "DEADLINE_EXCEEDED",
            }
        },
    )


# The relay's event boundaries, directly.


def chunks_through(cut: EventCut, chunks: list[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        if ready := cut.complete(chunk):
            yield ready


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_events_pass_whole_and_a_half_event_gives_way_to_the_error(ending: bytes) -> None:
    first, second = b'data: {"a": 1}' + ending, b'data: {"b": 2}' + ending
    cut = EventCut()
    sent = list(chunks_through(cut, [first[:5], first[5:] + second[:7], second[7:], second[:9]]))
    assert sent == [first, second]  # split where the events end, nothing lost or reordered
    failure = UpstreamTimeout("upstream 'p' sent no next chunk", upstream="p")
    tail = cut.error(failure, CHAT)
    assert tail.startswith(b'data: {"error"') and b'"b"' not in tail


def test_a_stream_that_is_not_event_shaped_still_flows() -> None:
    cut = EventCut()
    blob = b"x" * (1024 * 1024 + 10)
    assert list(chunks_through(cut, [blob[:100], blob[100:]])) == [blob]
    failure = UpstreamTimeout("upstream 'p' sent no next chunk", upstream="p")
    assert cut.error(failure, MESSAGES).startswith(b"\n\nevent: error\ndata: ")
