"""A litellm-routed upstream (`api = "litellm"`), driven by the openai SDK through brim.

litellm talks to the fake provider as an OpenAI-compatible endpoint ("openai/" prefix), so the
whole translation path runs offline.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from pydantic import SecretStr

from brim.adapters.upstream_config import UpstreamConfig
from tests.conftest import BrimFactory
from tests.fakes import FakeProvider, wait_for

HELLO = [{"role": "user", "content": "ping"}]


def through_litellm(provider: FakeProvider, **settings: Any) -> dict[str, Any]:
    """`upstreams` with one litellm upstream that reaches the fake as an OpenAI endpoint."""
    upstream = {"api": "litellm", "base_url": f"{provider.url}/v1", "model_prefix": "openai/"}
    return {"via-litellm": {**upstream, **settings}}


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(upstreams=through_litellm(provider, timeout_s=10))


def test_litellm_is_not_imported_until_a_request_needs_it() -> None:
    import subprocess

    code = (
        "import sys; from brim.proxy.app import create_app; from brim.proxy.config import BrimConfig;"
        "create_app(BrimConfig(upstreams={'l': {'api': 'litellm'}}));"
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_completion_through_litellm(base: str, provider: FakeProvider) -> None:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    reply = sdk.chat.completions.create(model="fake-model", messages=HELLO)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "pong"
    assert reply.usage is not None and reply.usage.total_tokens == 22
    sent = orjson.loads(provider.last.body)
    assert sent["model"] == "fake-model"
    assert sent["messages"] == HELLO
    assert provider.last.headers["authorization"] == "Bearer sk-client"


def test_streaming_through_litellm(base: str) -> None:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    stream = sdk.chat.completions.create(model="fake-model", messages=HELLO, stream=True)  # type: ignore[arg-type]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "Hello world"


def test_litellm_errors_keep_their_status(base: str) -> None:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(model="error-429", messages=HELLO)  # type: ignore[arg-type]
    assert "fake provider says 429" in caught.value.message


def test_litellms_context_window_error_is_an_overflow_that_brim_survives(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        upstreams=through_litellm(provider),
        models={"tight-3000": {"context_window": 24_000}},  # 8 × its real window
    )
    messages = [{"role": "user", "content": "question " + "context " * 6000}]
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(model="tight-3000", messages=messages)  # type: ignore[arg-type]
    assert raw.headers["x-brim-retries"] == "1"
    assert raw.parse().choices[0].message.content == "pong"
    assert [tokens <= 3_000 for _, tokens in provider.tight_seen] == [False, True]


def test_anthropic_messages_served_by_another_provider_through_litellm(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    import anthropic

    base = brim(upstreams=through_litellm(provider))
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-client", max_retries=0)
    reply = sdk.messages.create(
        model="fake-model",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "ping"}],
        extra_body={"context_management": {"edits": []}},
    )
    assert reply.content[0].text == "pong"  # type: ignore[union-attr]
    sent = orjson.loads(provider.last.body)  # litellm spoke Chat Completions to the provider
    assert sent["model"] == "fake-model"
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "context_management" not in sent
    text = ""
    with sdk.messages.stream(
        model="fake-model", max_tokens=100, messages=[{"role": "user", "content": "ping"}]
    ) as stream:
        for chunk in stream.text_stream:
            text += chunk
    assert text == "Hello world"


def test_a_never_ending_stream_through_litellm_is_cut_at_max_duration(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(upstreams=through_litellm(provider, max_duration_s=1.5))
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    started = time.monotonic()
    with pytest.raises(openai.APIError) as caught:
        for _ in sdk.chat.completions.create(
            model="endless-stream",
            messages=HELLO,  # type: ignore[arg-type]
            stream=True,
        ):
            pass
    assert "max_duration_s (1.5 s)" in str(caught.value.message)
    assert time.monotonic() - started < 10  # the fake would have gone on for 20 s
    assert wait_for(lambda: provider.in_flight == 0, timeout=5)  # and litellm's request closed


class RefusedStream:
    """A litellm stream whose first read raises, the way litellm surfaces some provider errors
    (a context overflow among them) only once the stream is iterated."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error  # None: the stream ends before its first chunk
        self.closed = False

    def __aiter__(self) -> RefusedStream:
        return self

    async def __anext__(self) -> Any:
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


def refuse_first_stream(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str, error: Exception | None
) -> tuple[list[dict[str, Any]], list[RefusedStream]]:
    """Patch litellm's `target.name` so its first call returns a `RefusedStream`; later calls
    go to litellm as usual (and so to the fake provider)."""
    real = getattr(target, name)
    calls: list[dict[str, Any]] = []
    refused: list[RefusedStream] = []

    async def patched(**kwargs: Any) -> Any:
        calls.append(kwargs)
        if len(calls) == 1:
            refused.append(RefusedStream(error))
            return refused[-1]
        return await real(**kwargs)

    monkeypatch.setattr(target, name, patched)
    return calls, refused


def window_error(litellm: Any) -> Exception:
    error: Exception = litellm.ContextWindowExceededError(
        message="This model's maximum context length is 3000 tokens. However, your messages "
        "resulted in 6010 tokens. Please reduce the length of the messages.",
        model="fake-model",
        llm_provider="openai",
    )
    return error


LONG = "question " + "context " * 6000  # ~6 000 tokens: over the stated 3 000


def test_an_overflow_on_the_first_read_of_a_litellm_stream_is_retried(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brim.adapters.translated import import_litellm

    litellm = import_litellm()
    calls, refused = refuse_first_stream(monkeypatch, litellm, "acompletion", window_error(litellm))
    base = brim(
        upstreams=through_litellm(provider), models={"fake-model": {"context_window": 100_000}}
    )
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": LONG}],
        stream=True,
    )
    assert raw.headers["x-brim-retries"] == "1"  # the overflow came before the 200
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text == "Hello world"
    assert len(calls) == 2 and refused[0].closed
    first, second = (len(call["messages"][0]["content"]) for call in calls)
    assert second < first  # the retry was cut to the stated window
    assert len(provider.requests) == 1  # only the retry reached the provider


def test_an_overflow_on_the_first_read_of_a_litellm_messages_stream_is_retried(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anthropic

    from brim.adapters.translated import import_litellm

    litellm = import_litellm()
    calls, refused = refuse_first_stream(
        monkeypatch, litellm.anthropic.messages, "acreate", window_error(litellm)
    )
    base = brim(
        upstreams=through_litellm(provider),
        models={"fake-model": {"context_window": 100_000, "max_output": 1_000}},
    )
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-client", max_retries=0)
    text = ""
    with sdk.messages.stream(
        model="fake-model", max_tokens=100, messages=[{"role": "user", "content": LONG}]
    ) as stream:
        for chunk in stream.text_stream:
            text += chunk
        retries = stream.response.headers["x-brim-retries"]
    assert (text, retries) == ("Hello world", "1")
    assert len(calls) == 2 and refused[0].closed
    first, second = (len(str(call["messages"])) for call in calls)
    assert second < first


def test_an_empty_litellm_stream_is_an_overflow_not_an_empty_success(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brim.adapters.translated import import_litellm

    calls, refused = refuse_first_stream(monkeypatch, import_litellm(), "acompletion", None)
    base = brim(upstreams=through_litellm(provider), retry={"enabled": False})
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "fake-model", "messages": HELLO, "stream": True},
        timeout=30,
    )
    assert reply.status_code == 502  # not a 200 with nothing in it
    assert "empty stream" in reply.json()["error"]["message"]
    assert len(calls) == 1 and refused[0].closed


class ByteStream:
    """A litellm stream that relays the provider's server-sent events as raw bytes (as it does
    for a Messages request to Anthropic itself)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.closed = False

    def __aiter__(self) -> ByteStream:
        return self

    async def __anext__(self) -> bytes:
        if not self.chunks:
            raise StopAsyncIteration
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        self.closed = True


ANTHROPIC_OVERFLOW_EVENT = (
    b'event: error\ndata: {"type": "error", "error": {"type": "invalid_request_error", '
    b'"message": "prompt is too long: 250000 tokens > 200000 maximum"}}\n\n'
)


@pytest.mark.parametrize("split", [len(ANTHROPIC_OVERFLOW_EVENT), 20])
async def test_an_overflow_as_the_first_event_of_a_raw_litellm_stream_is_an_overflow(
    split: int,
) -> None:
    from brim.adapters.errors import ContextOverflow
    from brim.adapters.translated import LitellmAdapter
    from brim.adapters.upstream_config import UpstreamConfig

    adapter = LitellmAdapter("via-litellm", UpstreamConfig(api="litellm"))
    event = ANTHROPIC_OVERFLOW_EVENT
    stream = ByteStream(event[:split], event[split:]) if split < len(event) else ByteStream(event)
    with pytest.raises(ContextOverflow) as caught:
        await adapter._peek(stream)
    assert (caught.value.overflow.limit, caught.value.overflow.requested) == (200_000, 250_000)
    assert caught.value.status == 200 and caught.value.body == event
    assert stream.closed


async def test_a_raw_litellm_stream_is_relayed_whole_after_the_check() -> None:
    from brim.adapters.translated import LitellmAdapter
    from brim.adapters.upstream_config import UpstreamConfig

    adapter = LitellmAdapter("via-litellm", UpstreamConfig(api="litellm"))
    start = b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n'
    rest = b'event: ping\ndata: {"type": "ping"}\n\n'
    stream = ByteStream(start[:15], start[15:], rest)
    iterator, first = await adapter._peek(stream)
    assert first == start  # read up to the first whole event, replayed as one chunk
    assert [chunk async for chunk in iterator] == [rest]
    assert not stream.closed


def test_the_litellm_upstream_takes_the_clients_key_only_for_a_request_it_was_sent() -> None:
    from brim.adapters.translated import LitellmAdapter  # imports no litellm
    from tests.builders import exchange

    config = UpstreamConfig(api="litellm", model_prefix="bedrock/")
    request = exchange(headers={"Authorization": "Bearer sk-client"}, upstream="home")
    assert LitellmAdapter("home", config)._key(request) == "sk-client"
    assert LitellmAdapter("other", config)._key(request) is None  # a fallback sent there
    keyed = config.model_copy(update={"api_key": SecretStr("sk-own")})
    assert LitellmAdapter("other", keyed)._key(request) == "sk-own"
