"""OpenAI Responses (Codex CLI's API) end to end: the openai SDK's `client.responses` through brim
to a fake provider with a small window that refuses broken call/output pairing."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider, responses_errors

TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    }
]


@pytest.fixture
def base(brim: BrimFactory) -> str:
    return brim(
        models={
            "resp-6000": {"context_window": 6_000, "max_output": 2_000},
            "respstream-3000": {"context_window": 100_000},
        }
    )


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-codex", max_retries=0)


def test_responses_with_and_without_streaming(base: str, provider: FakeProvider) -> None:
    reply = sdk(base).responses.create(model="resp-x", input="ping")
    assert reply.output_text == "pong"
    assert provider.last.path == "/v1/responses"
    events = list(sdk(base).responses.create(model="resp-x", input="ping", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_long_codex_session_completes_within_the_window(
    base: str, provider: FakeProvider
) -> None:
    client = sdk(base)
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "Find why the tests fail."}
    ]
    for turn in range(30):
        reply = client.responses.create(
            model="resp-6000", instructions="You are Codex.", input=items, tools=TOOLS
        )  # type: ignore[arg-type]
        call = reply.output[0]
        items.append(call.model_dump(exclude_none=True))
        items.append(
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "\n".join(f"test_{turn}_{i} ... ok" for i in range(120)),
            }
        )  # type: ignore[union-attr]
    assert len(provider.strict_counts) == 30 and provider.strict_rejections == []
    assert max(provider.strict_counts) <= 6_000
    for seen in provider.requests:
        sent = orjson.loads(seen.body)
        assert responses_errors(sent["input"]) == []
        assert sent["instructions"] == "You are Codex."
    assert orjson.loads(provider.last.body)["input"][0] == items[0]  # the task stays


def test_an_overflow_reported_as_response_failed_is_retried(
    base: str, provider: FakeProvider
) -> None:
    items = [
        {
            "type": "message",
            "role": "user",
            "content": "summarize:\n" + "row value value value\n" * 900,
        }
    ]
    events = list(sdk(base).responses.create(model="respstream-3000", input=items, stream=True))  # type: ignore[arg-type]
    assert events[-1].type == "response.completed", (provider.tight_seen, [e.type for e in events])
    counts = [tokens for _, tokens in provider.tight_seen]
    assert counts[0] > 3_000 >= counts[-1] and len(counts) >= 2


def test_bad_responses_requests_name_the_parameter(base: str) -> None:
    reply = httpx.post(f"{base}/v1/responses", json={"input": "hi"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
    reply = httpx.post(f"{base}/v1/responses", json={"model": "m", "input": 5})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"
