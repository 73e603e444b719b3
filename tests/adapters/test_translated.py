"""A litellm-routed upstream (`api = "litellm"`), driven by the openai SDK through brim.

litellm talks to the fake provider as an OpenAI-compatible endpoint ("openai/" prefix), so the
whole translation path runs offline.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import openai
import orjson
import pytest

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
        "import sys; from proxy.app import create_app; from proxy.config import BrimConfig;"
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
        upstreams=through_litellm(provider), models={"tight-3000": {"context_window": 100_000}}
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
