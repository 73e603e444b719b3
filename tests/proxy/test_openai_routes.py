"""The official openai SDK, sync and async, through a running brim to a fake provider."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from tests.conftest import BrimFactory
from tests.fakes import STREAM_PARTS, USAGE, FakeProvider

HELLO = [{"role": "user", "content": "ping"}]


def client(base: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0, **kwargs)  # type: ignore[arg-type]


def test_non_streaming_completion_with_usage(brim: BrimFactory, provider: FakeProvider) -> None:
    reply = client(brim()).chat.completions.create(model="fake-model", messages=HELLO)
    assert reply.choices[0].message.content == "pong"
    assert reply.usage is not None
    assert reply.usage.model_dump(include={"prompt_tokens", "completion_tokens"}) == {
        "prompt_tokens": USAGE["prompt_tokens"],
        "completion_tokens": USAGE["completion_tokens"],
    }
    assert provider.last.path == "/v1/chat/completions"


def test_sdk_bytes_reach_the_provider_unchanged(brim: BrimFactory, provider: FakeProvider) -> None:
    sent: list[bytes] = []
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]})
    client(brim(), http_client=http).chat.completions.create(
        model="fake-model", messages=HELLO, temperature=0.25, metadata={"k": "é"}
    )
    assert sent and provider.last.body == sent[0]


def test_odd_formatting_is_forwarded_byte_for_byte(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    raw = (
        b'{ "messages" : [ {"role":"user","content":"caf\\u00e9 \xe2\x98\x95","x_vendor":1} ],\n'
        b'  "model":"fake-model",  "seed": 1.50, "unknown_field": {"nested": [null, true]} }'
    )
    reply = httpx.post(
        f"{brim()}/v1/chat/completions",
        content=raw,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-client"},
    )
    assert reply.status_code == 200
    assert provider.last.body == raw


def test_paths_without_v1_prefix_work(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim()
    reply = httpx.post(f"{base}/chat/completions", json={"model": "fake-model", "messages": HELLO})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "pong"
    models = httpx.get(f"{base}/models")
    assert models.status_code == 200
    assert [m["id"] for m in models.json()["data"]] == ["fake-model"]


def test_streaming_chunks_arrive_before_the_provider_finishes(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    stream = client(brim()).chat.completions.create(
        model="gated-stream", messages=HELLO, stream=True
    )
    chunks = iter(stream)
    first_content = ""
    while not first_content:  # the provider holds back everything after "Hel" until the gate
        first_content = next(chunks).choices[0].delta.content or ""
    assert first_content == STREAM_PARTS[0]
    assert provider.gate_timed_out is None  # the provider is still waiting
    provider.gate.set()
    rest = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert first_content + rest == "".join(STREAM_PARTS)
    assert provider.gate_timed_out is False


def test_streaming_usage_passes_through(brim: BrimFactory) -> None:
    stream = client(brim()).chat.completions.create(
        model="fake-model",
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == USAGE["total_tokens"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"


def test_tool_call_round_trip(brim: BrimFactory, provider: FakeProvider) -> None:
    sdk = client(brim())
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    first = sdk.chat.completions.create(model="tools", messages=HELLO, tools=tools)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert orjson.loads(call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
    follow_up = [
        *HELLO,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4}'},
    ]
    second = sdk.chat.completions.create(model="fake-model", messages=follow_up, tools=tools)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "pong"
    forwarded = orjson.loads(provider.last.body)["messages"]
    assert forwarded[1]["tool_calls"][0]["id"] == "call_42"
    assert forwarded[2] == {"role": "tool", "tool_call_id": "call_42", "content": '{"temp_c": 4}'}


async def test_async_client_streams_and_completes(brim: BrimFactory) -> None:
    sdk = openai.AsyncOpenAI(base_url=f"{brim()}/v1", api_key="sk-client", max_retries=0)
    reply = await sdk.chat.completions.create(model="fake-model", messages=HELLO)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "pong"
    stream = await sdk.chat.completions.create(model="fake-model", messages=HELLO, stream=True)  # type: ignore[arg-type]
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello world"
    await sdk.close()


def test_client_key_passes_through_and_hop_by_hop_headers_do_not(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    reply = httpx.post(
        f"{brim()}/v1/chat/completions",
        json={"model": "fake-model", "messages": HELLO},
        headers={
            "Authorization": "Bearer sk-client",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "per-connection",
            "Keep-Alive": "timeout=5",
            "TE": "trailers",
            "Trailer": "X-Checksum",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "X-End-To-End": "yes",
            "OpenAI-Organization": "org-123",
        },
    )
    assert reply.status_code == 200
    seen = provider.last.headers
    assert seen["authorization"] == "Bearer sk-client"
    assert seen["x-end-to-end"] == "yes"
    assert seen["openai-organization"] == "org-123"
    for hop in ("x-hop", "keep-alive", "te", "trailer", "proxy-authorization"):
        assert hop not in seen, hop
    assert seen["host"] == provider.url.removeprefix("http://")
    assert int(seen["content-length"]) == len(provider.last.body)
    # End-to-end response headers come back; the body length is brim's own.
    assert reply.headers["x-upstream-header"] == "kept"
    assert int(reply.headers["content-length"]) == len(reply.content)
    assert reply.headers["x-brim-request-id"]


def test_configured_upstream_key_replaces_the_clients(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import fake_upstream

    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-configured-upstream")
    base = brim(upstreams={"fake": fake_upstream(provider, api_key_env="FAKE_UPSTREAM_KEY")})
    client(base).chat.completions.create(model="fake-model", messages=HELLO)
    assert provider.last.headers["authorization"] == "Bearer sk-configured-upstream"


def test_langchain_chat_openai_through_brim(brim: BrimFactory, provider: FakeProvider) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="fake-model", base_url=f"{brim()}/v1", api_key="sk-lc", max_retries=0)  # type: ignore[arg-type]
    assert llm.invoke("ping").content == "pong"
    assert "".join(str(chunk.content) for chunk in llm.stream("ping")) == "Hello world"
    assert provider.last.headers["authorization"] == "Bearer sk-lc"


def test_models_fall_back_to_the_configured_table_when_the_upstream_is_down(
    brim: BrimFactory, closed_port: int
) -> None:
    base = brim(
        upstreams={"down": {"api": "openai", "base_url": f"http://127.0.0.1:{closed_port}/v1"}},
        models={"local-llama": {"context_window": 8192}},
    )
    listed = httpx.get(f"{base}/v1/models")
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["local-llama"]
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    assert [m.id for m in sdk.models.list()] == ["local-llama"]
