"""Gemini generateContent (Gemini CLI's API) end to end over plain HTTP, through brim to a fake
Gemini with small windows that refuses unpaired function calls the way Gemini does."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import BrimFactory, fake_upstream
from tests.fakes import FakeProvider, gemini_errors

TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ]
    }
]


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(
        upstreams={"gemini": {"api": "gemini", "base_url": provider.url}},
        models={
            "gem-6000": {"context_window": 6_000, "max_output": 2_000},
            "gemstream-3000": {"context_window": 24_000},  # 8 × its real window
            "gem-300": {"context_window": 300},
        },
    )


def generate(
    base: str, model: str, body: dict[str, Any], method: str = "generateContent", **kwargs: Any
) -> httpx.Response:
    return httpx.post(f"{base}/v1beta/models/{model}:{method}", json=body, timeout=30, **kwargs)


def test_generate_and_stream_with_the_key_forwarded(base: str, provider: FakeProvider) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "ping"}]}]}
    reply = generate(base, "gem-x", body, headers={"x-goog-api-key": "AIza-client"})
    assert reply.status_code == 200
    assert reply.json()["candidates"][0]["content"]["parts"][0]["text"] == "pong"
    assert provider.last.path == "/v1beta/models/gem-x:generateContent"
    assert provider.last.headers["x-goog-api-key"] == "AIza-client"
    streamed = httpx.post(
        f"{base}/v1beta/models/gem-x:streamGenerateContent?alt=sse&key=AIza-q", json=body
    )
    assert streamed.status_code == 200 and streamed.text.startswith("data: ")
    assert provider.last.query == "alt=sse&key=AIza-q"
    counted = generate(base, "gem-x", body, "countTokens")
    assert counted.json()["totalTokens"] > 0


def test_a_long_function_calling_session_completes_within_the_window(
    base: str, provider: FakeProvider
) -> None:
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "Find the bug in the parser."}]}
    ]
    for _ in range(25):
        reply = generate(
            base,
            "gem-6000",
            {
                "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
                "contents": contents,
                "tools": TOOLS,
            },
        )
        assert reply.status_code == 200, reply.text
        model_turn = reply.json()["candidates"][0]["content"]
        contents.append(model_turn)
        call = next(p["functionCall"] for p in model_turn["parts"] if "functionCall" in p)
        contents.append(
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": call["name"],
                            "response": {
                                "output": "\n".join(
                                    f"line {i} of {call['args']['path']}" for i in range(150)
                                )
                            },
                        }
                    }
                ],
            }
        )
    assert len(provider.strict_counts) == 25 and provider.strict_rejections == []
    assert max(provider.strict_counts) <= 6_000
    for seen in provider.requests:
        sent = orjson.loads(seen.body)
        assert gemini_errors(sent["contents"]) == []
        for turn in sent["contents"]:  # thought signatures kept as they were
            for part in turn["parts"]:
                if "thoughtSignature" in part:
                    assert part["text"] == "Let me look."


def test_an_overflow_inside_the_stream_is_learned_and_retried(
    base: str, provider: FakeProvider
) -> None:
    body = {
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "summarize:\n" + "row value value value\n" * 1_000}],
            }
        ]
    }
    reply = httpx.post(
        f"{base}/v1beta/models/gemstream-3000:streamGenerateContent?alt=sse", json=body, timeout=30
    )
    assert reply.status_code == 200 and "pong" in reply.text
    assert reply.headers["x-brim-retries"] == "1"
    counts = [tokens for _, tokens in provider.tight_seen]
    assert counts[0] > 3_000 >= counts[-1] >= 3_000 * 0.85  # straight to the stated limit


def test_errors_come_in_googles_shape(base: str) -> None:
    bad = generate(base, "gem-x", {"contents": []})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    big = {
        "systemInstruction": {"parts": [{"text": "rules " * 500}]},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
    }
    refused = generate(base, "gem-300", big)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("The input token count (")


def test_the_default_config_has_a_gemini_upstream(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        upstreams={
            "openai": fake_upstream(provider),
            "gemini": {"api": "gemini", "base_url": provider.url},
        },
        routes={"*": ["openai", "gemini"]},
    )
    reply = generate(base, "gem-x", {"contents": [{"role": "user", "parts": [{"text": "ping"}]}]})
    assert reply.status_code == 200 and provider.last.path.startswith("/v1beta/")
