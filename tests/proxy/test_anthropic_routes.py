"""The Messages API end to end: the official anthropic SDK through brim to a fake Anthropic that
enforces a small window, verifies thinking signatures and refuses broken tool pairing."""

from __future__ import annotations

import hashlib
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.builders import same_turn
from tests.conftest import BrimFactory
from tests.fake_anthropic import FakeAnthropic, anthropic_errors, token_count

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
SYSTEM = [
    {
        "type": "text",
        "text": "You are Claude Code, a coding agent. " * 40,
        "cache_control": {"type": "ephemeral"},
    }
]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAMgAAABkCAIAAAB7GkOtAAAA"  # a 200×100 PNG header


@pytest.fixture
def base(brim: BrimFactory, anthropic_fake: FakeAnthropic) -> str:
    return brim(
        upstreams={"claude": {"api": "anthropic", "base_url": anthropic_fake.url}},
        models={
            "claude-window-6000": {"context_window": 6_000, "max_output": 4_096},
            "claude-streamerr-3000": {"context_window": 24_000},  # 8 × its real window
            "claude-window-300": {"context_window": 300},
        },
    )


def sdk(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0)


def test_messages_with_and_without_streaming(base: str, anthropic_fake: FakeAnthropic) -> None:
    reply = sdk(base).messages.create(
        model="claude-x",
        max_tokens=50,
        messages=[{"role": "user", "content": "ping"}],
        extra_headers={"anthropic-beta": "context-1m-2025-08-07"},
    )
    assert reply.content[0].text == "pong"  # type: ignore[union-attr]
    seen = anthropic_fake.last
    assert seen.path == "/v1/messages"
    assert seen.headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert "anthropic-version" in seen.headers
    assert (
        seen.headers.get("x-api-key") == "sk-ant-client"
        or seen.headers.get("authorization") == "Bearer sk-ant-client"
    )
    with sdk(base).messages.stream(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "ping"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "pong" and final.stop_reason == "end_turn"


async def test_the_async_sdk(base: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=base, api_key="k", max_retries=0)
    reply = await client.messages.create(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "ping"}]
    )
    assert reply.content[0].text == "pong"  # type: ignore[union-attr]
    async with client.messages.stream(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "ping"}]
    ) as stream:
        assert "".join([t async for t in stream.text_stream]) == "pong"
    await client.close()


def test_claude_codes_query_string_and_probes(base: str, anthropic_fake: FakeAnthropic) -> None:
    assert httpx.head(f"{base}/").status_code == 200
    assert httpx.get(f"{base}/").status_code == 200
    reply = httpx.post(
        f"{base}/v1/messages?beta=true",
        json={
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    assert reply.status_code == 200
    assert anthropic_fake.last.query == "beta=true"


def run_session(base: str, turns: int) -> list[dict[str, Any]]:
    """Claude Code's loop: thinking + two parallel tool uses per turn, big results, images."""
    client = sdk(base)
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix the flaky test."},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
            ],
        }
    ]
    for turn in range(turns):
        reply = client.messages.create(
            model="claude-window-6000",
            max_tokens=1_024,
            system=SYSTEM,
            tools=TOOLS,
            messages=messages,
        )  # type: ignore[arg-type]
        messages.append(
            {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in reply.content],
            }
        )
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block.id,
                "content": "\n".join(
                    f"line {n} of {block.input['path']}: code code code" for n in range(60)
                ),
                **({"cache_control": {"type": "ephemeral"}} if turn % 5 == 0 else {}),
            }  # type: ignore[union-attr]
            for block in reply.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return messages


def test_a_long_tool_use_session_completes_within_the_window(
    base: str, anthropic_fake: FakeAnthropic
) -> None:
    history = run_session(base, 30)
    assert len(anthropic_fake.counts) == 30
    assert anthropic_fake.rejections == []
    assert max(anthropic_fake.counts) <= 6_000
    assert token_count({"system": SYSTEM, "tools": TOOLS, "messages": history}) > 5 * 6_000
    turn, cuts = 0, []  # requests made so far; whether each was cut
    for seen in anthropic_fake.requests:  # each turn's create, after its count if brim asked
        sent = orjson.loads(seen.body)
        assert anthropic_errors(sent["messages"]) == []
        # Fixed cost, never touched; brim adds its own tool, at the end, to a request it cut —
        # one whose messages are not those the client sent on that turn — and to no other.
        cut = sent["messages"] != history[: 1 + 2 * turn]
        assert sent["system"] == SYSTEM and sent["tools"][: len(TOOLS)] == TOOLS
        assert [tool["name"] for tool in sent["tools"][len(TOOLS) :]] == (
            ["brim_restore"] if cut else []
        ), (turn, seen.path)
        if seen.path == "/v1/messages":
            cuts.append(cut)
            turn += 1
        for message in sent["messages"]:  # thinking blocks still verify
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block["type"] == "thinking":
                    assert (
                        block["signature"]
                        == hashlib.sha256(block["thinking"].encode()).hexdigest()[:32]
                    )
    assert turn == 30 and not cuts[0] and all(cuts[-20:])  # sent whole at first, then cut
    last = orjson.loads(anthropic_fake.last.body)["messages"]
    assert last[-2:] == history[-4:-2]  # the ongoing tool loop (sent last) is kept whole


MID_CONVERSATION = "mid-conversation-system-2026-04-07"


def session_with_system_messages(reads: int) -> list[dict[str, Any]]:
    """What Claude Code sends a model it takes for its newest: role "system" messages in the
    conversation, right after a user turn and right before an assistant turn (or last)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the flaky test."}]},
        {"role": "system", "content": "Available agent types for the Agent tool: claude."},
    ]
    for n in range(1, reads + 1):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading file {n}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{n}",
                        "name": "read_file",
                        "input": {"path": f"src/f{n}.py"},
                    },
                ],
            }
        )
        lines = "\n".join(f"line {i} of src/f{n}.py: code code code" for i in range(60))
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": lines}],
            }
        )
        if n == reads - 1:
            messages.append(
                {"role": "system", "content": [{"type": "text", "text": "Use the task tools."}]}
            )
    return messages


def test_mid_conversation_system_messages_are_forwarded_and_kept_through_compression(
    base: str, anthropic_fake: FakeAnthropic
) -> None:
    client = sdk(base)

    def create(model: str, max_tokens: int, messages: list[dict[str, Any]]) -> Any:
        """The raw reply to Claude Code's request with the mid-conversation beta."""
        return client.messages.with_raw_response.create(
            model=model,
            max_tokens=max_tokens,
            system=SYSTEM,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": MID_CONVERSATION},
        )

    short = session_with_system_messages(2)
    reply = create("claude-x", 50, short)
    assert reply.status_code == 200 and reply.headers["x-brim-actions"] == "none"
    seen = anthropic_fake.last
    assert seen.headers["anthropic-beta"] == MID_CONVERSATION
    assert orjson.loads(seen.body)["messages"] == short  # forwarded as the client sent it
    counted = client.messages.count_tokens(
        model="claude-x",
        system=SYSTEM,  # type: ignore[arg-type]
        messages=short,  # type: ignore[arg-type]
    )
    assert counted.input_tokens == token_count(
        {"model": "claude-x", "system": SYSTEM, "messages": short}
    )

    long = session_with_system_messages(60)
    assert token_count({"system": SYSTEM, "tools": TOOLS, "messages": long}) > 6_000
    reply = create("claude-window-6000", 1_024, long)
    assert reply.status_code == 200
    assert "evict" in reply.headers["x-brim-actions"]
    assert "repair" not in reply.headers["x-brim-actions"]
    assert anthropic_fake.rejections == [] and anthropic_fake.counts[-1] <= 6_000
    sent = orjson.loads(anthropic_fake.last.body)["messages"]
    assert anthropic_errors(sent) == []  # system messages placed where Anthropic takes them
    # Both system messages went out whole, in order, each between the same two messages as the
    # client put it (the notice aside), and the ongoing tool loop with them.
    systems = [m for m in long if m["role"] == "system"]
    assert [m for m in sent if m["role"] == "system"] == systems
    for system in systems:
        at, was = sent.index(system), long.index(system)
        assert same_turn(sent[at + 1], long[was + 1])
        before = sent[at - 1]
        assert same_turn(before, long[was - 1]) or str(before["content"]).startswith("[brim")
    assert sent[-3:] == long[-3:]


def test_an_overflow_inside_a_200_stream_is_learned_and_retried(
    base: str, anthropic_fake: FakeAnthropic
) -> None:
    messages = [{"role": "user", "content": "Summarise this log:\n" + "INFO worker ok\n" * 1_500}]
    raw = sdk(base).messages.with_raw_response.create(
        model="claude-streamerr-3000", max_tokens=100, messages=messages
    )  # type: ignore[arg-type]
    assert raw.headers["x-brim-retries"] == "1"
    assert raw.parse().content[0].text == "pong"  # type: ignore[union-attr]
    assert anthropic_fake.counts and anthropic_fake.counts[-1] <= 3_000
    assert len(anthropic_fake.rejections) == 1


def test_count_tokens_is_forwarded_or_answered_by_brim(
    base: str, anthropic_fake: FakeAnthropic
) -> None:
    body: dict[str, Any] = {
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }
    upstream = sdk(base).messages.count_tokens(model="claude-x", **body)
    assert anthropic_fake.count_calls == 1
    assert upstream.input_tokens == token_count({"model": "claude-x", **body})
    reply = httpx.post(
        f"{base}/v1/messages/count_tokens",
        json={"model": "claude-nocount-1", **body},
        headers={"x-api-key": "k"},
    )
    assert reply.status_code == 200
    assert reply.headers["x-brim-counted-by"] == "brim"
    assert reply.json() == {"input_tokens": upstream.input_tokens}  # same rule, same figure


def test_nothing_fits_is_claude_codes_prompt_is_too_long(
    base: str, anthropic_fake: FakeAnthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk(base).messages.create(
            model="claude-window-300",
            max_tokens=10,
            system="rules " * 400,
            messages=[{"role": "user", "content": "hi"}],
        )
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    assert (
        "tokens > 285 maximum" in error["message"]
        and "brim could not make it fit" in error["message"]
    )
    assert anthropic_fake.requests == []


@pytest.mark.parametrize(
    ("body", "status", "kind", "fragment"),
    [
        (
            {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]},
            400,
            "invalid_request_error",
            "max_tokens: Field required",
        ),
        (
            {
                "model": "claude-x",
                "max_tokens": 5,
                "messages": [{"role": "tool", "content": "hi"}],
            },
            400,
            "invalid_request_error",
            "messages.0.role",
        ),
        (
            {"model": "claude-x", "max_tokens": 5, "messages": []},
            400,
            "invalid_request_error",
            "messages",
        ),
    ],
)
def test_bad_requests_get_anthropic_shaped_errors(
    base: str, body: dict[str, Any], status: int, kind: str, fragment: str
) -> None:
    reply = httpx.post(f"{base}/v1/messages", json=body)
    assert reply.status_code == status
    payload = reply.json()
    assert payload["type"] == "error" and payload["error"]["type"] == kind
    assert fragment in payload["error"]["message"]


def test_no_route_is_an_anthropic_not_found(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    base = brim(
        upstreams={"claude": {"api": "anthropic", "base_url": anthropic_fake.url}},
        routes={"claude-*": "claude"},
    )
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk(base).messages.create(
            model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_default_config_sends_messages_to_the_anthropic_upstream(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    base = brim(
        upstreams={
            "gpt": {"api": "openai", "base_url": "http://127.0.0.1:9/v1"},
            "claude": {"api": "anthropic", "base_url": anthropic_fake.url},
        },
        routes={"*": ["gpt", "claude"]},
    )
    reply = sdk(base).messages.create(
        model="anything", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.content[0].text == "pong"  # type: ignore[union-attr]
