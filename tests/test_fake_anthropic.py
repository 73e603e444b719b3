"""The fake Anthropic provider itself, driven by the official `anthropic` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.fake_anthropic import (
    FakeAnthropic,
    anthropic_errors,
    thinking_signature,
    token_count,
    window_of,
)

TOOLS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


@pytest.fixture
def fake(anthropic_fake: FakeAnthropic) -> FakeAnthropic:
    return anthropic_fake


@pytest.fixture
def client(fake: FakeAnthropic) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fake.url, api_key="k", max_retries=0) as sdk:
        yield sdk


def hello() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "ping"}]


def test_window_comes_from_the_model_name() -> None:
    assert window_of("claude-window-6000") == 6000
    assert window_of("claude-streamerr-300") == 300
    assert window_of("claude-sonnet") is None
    assert window_of("claude") is None


def test_a_text_reply(client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    reply = client.messages.create(model="claude-plain", max_tokens=64, messages=hello())
    assert reply.id == "msg_1"
    assert reply.role == "assistant"
    assert reply.model == "claude-plain"
    assert [(b.type, getattr(b, "text", None)) for b in reply.content] == [("text", "pong")]
    assert reply.stop_reason == "end_turn"
    expected = token_count({"messages": hello()})
    assert reply.usage.input_tokens == expected == fake.counts[0]
    assert reply.usage.output_tokens == 12
    assert fake.last.method == "POST"
    assert fake.last.path == "/v1/messages"
    auth = (fake.last.headers.get("x-api-key"), fake.last.headers.get("authorization"))
    assert auth in (("k", None), (None, "Bearer k"))  # the SDK version decides which
    assert "anthropic-version" in fake.last.headers
    assert fake.rejections == []


def test_a_streamed_text_reply(client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    with client.messages.stream(model="claude-plain", max_tokens=64, messages=hello()) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == "pong"
    assert len(texts) > 1  # really sent in pieces
    assert final.content[0].type == "text"
    assert final.content[0].text == "pong"
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == fake.counts[0]
    assert final.usage.output_tokens == 12
    assert b'"stream":true' in fake.last.body.replace(b" ", b"")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_session_step(
    client: anthropic.Anthropic, fake: FakeAnthropic, stream: bool
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    if stream:
        with client.messages.stream(
            model="claude-window-100000",
            max_tokens=256,
            messages=messages,
            tools=TOOLS,
        ) as events:
            first = events.get_final_message()
    else:
        first = client.messages.create(
            model="claude-window-100000",
            max_tokens=256,
            messages=messages,
            tools=TOOLS,
        )
    assert first.stop_reason == "tool_use"
    thinking, use_a, use_b = first.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "I should look at file 1."
    assert thinking.signature == thinking_signature("I should look at file 1.")
    assert use_a.type == use_b.type == "tool_use"
    assert (use_a.id, use_b.id) == ("toolu_1_a", "toolu_1_b")
    assert use_a.name == "read_file"
    assert use_a.input == use_b.input == {"path": "src/f1.py"}

    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1_a", "content": "print(1)"},
                {"type": "tool_result", "tool_use_id": "toolu_1_b", "content": "print(2)"},
                {"type": "text", "text": "Go on."},
            ],
        },
    ]
    second = client.messages.create(
        model="claude-window-100000",
        max_tokens=256,
        messages=messages,
        tools=TOOLS,
    )
    assert fake.rejections == []
    assert second.content[1].type == "tool_use"
    assert second.content[1].id == "toolu_2_a"
    assert len(fake.counts) == 2
    assert fake.counts[1] > fake.counts[0]


def _session_after_one_step(thinking: str, signature: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Read the files."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thinking, "signature": signature},
                {"type": "tool_use", "id": "toolu_1_a", "name": "read_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1_a", "content": "x"}],
        },
    ]


def test_a_modified_thinking_block_is_refused(
    client: anthropic.Anthropic, fake: FakeAnthropic
) -> None:
    original = "I should look at file 1."
    messages = _session_after_one_step(
        "I should look at file 1 (shortened).", thinking_signature(original)
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-x", max_tokens=64, messages=messages, tools=TOOLS)
    assert refused.value.status_code == 400
    body: Any = refused.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages.1: invalid `signature`")
    assert len(fake.rejections) == 1
    assert fake.counts == []
    good = _session_after_one_step(original, thinking_signature(original))
    client.messages.create(model="claude-x", max_tokens=64, messages=good, tools=TOOLS)
    assert len(fake.counts) == 1


def test_a_tool_result_that_answers_nothing_is_refused(
    client: anthropic.Anthropic, fake: FakeAnthropic
) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_gone", "content": "x"}],
        },
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-x", max_tokens=64, messages=messages)
    body: Any = refused.value.body
    assert body["error"]["message"].startswith(
        "messages.2: unexpected `tool_use_id` found in `tool_result` blocks: toolu_gone."
    )
    assert fake.rejections == [body["error"]["message"]]


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "messages: at least one message is required"),
        ([{"role": "assistant", "content": "hi"}], "messages.0: the first message"),
        ([{"role": "tool", "content": "hi"}], "messages.0: unexpected role"),
        ([{"role": "system", "content": "hi"}], "messages.0: the first message"),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "system", "content": "be brief"},
            ],
            "messages.2: a system message must immediately follow a user turn",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "well?"},
            ],
            "messages.1: a system message must precede an assistant turn",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "be brief"},
                {"role": "system", "content": "and kind"},
            ],
            "messages.2: a system message must immediately follow a user turn",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "image", "source": {}}]},
            ],
            "messages.1: a system message holds text blocks only",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "user", "content": "no answer"},
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: t1.",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
            ],
            "messages.1: `tool_use` ids were found without",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "first"},
                        {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                    ],
                },
            ],
            "messages.2: `tool_result` blocks must come before any other content blocks",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "assistant", "content": "skipped the results"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}],
                },
            ],
            "messages.3: unexpected `tool_use_id`",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]},
            ],
            "messages.1: invalid `signature` in `thinking` block at content.0",
        ),
    ],
)
def test_the_checker_finds(messages: list[dict[str, Any]], problem: str) -> None:
    assert any(error.startswith(problem) for error in anthropic_errors(messages)), anthropic_errors(
        messages
    )


def test_the_checker_accepts_a_valid_session() -> None:
    assert anthropic_errors(_session_after_one_step("t", thinking_signature("t"))) == []


def test_the_checker_accepts_system_messages_where_anthropic_takes_them() -> None:
    session = _session_after_one_step("t", thinking_signature("t"))
    rule = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert anthropic_errors([session[0], rule, *session[1:], rule]) == []


def test_max_tokens_must_be_an_integer(client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.post("/v1/messages", body={"model": "claude-x", "messages": hello()}, cast_to=object)
    body: Any = refused.value.body
    assert body["error"]["message"] == "max_tokens: Input should be a valid integer"


def long_messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 40}]


def test_an_over_window_request_is_refused_with_the_counts(
    client: anthropic.Anthropic, fake: FakeAnthropic
) -> None:
    count = token_count({"messages": long_messages()})
    assert count > 100
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-window-100", max_tokens=64, messages=long_messages())
    body: Any = refused.value.body
    assert body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {count} tokens > 100 maximum",
        },
    }
    assert fake.rejections == [f"prompt is too long: {count} tokens > 100 maximum"]
    assert fake.counts == []
    fits = client.messages.create(
        model=f"claude-window-{count}", max_tokens=64, messages=long_messages()
    )
    assert fits.usage.input_tokens == count


@pytest.mark.parametrize("stream", [False, True])
def test_streamerr_refuses_inside_a_200_stream(
    client: anthropic.Anthropic, fake: FakeAnthropic, stream: bool
) -> None:
    count = token_count({"messages": long_messages()})
    raw = client.messages.with_raw_response.create(
        model="claude-streamerr-100", max_tokens=64, messages=long_messages(), stream=stream
    )
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    message = f"prompt is too long: {count} tokens > 100 maximum"
    with (
        pytest.raises(anthropic.APIStatusError) as refused,
        client.messages.stream(
            model="claude-streamerr-100",
            max_tokens=64,
            messages=long_messages(),
        ) as events,
    ):
        events.get_final_message()
    assert message in str(refused.value)
    body: Any = refused.value.body
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    assert fake.rejections == [message, message]
    assert fake.counts == []


def test_count_tokens_matches_what_a_request_counts(
    client: anthropic.Anthropic, fake: FakeAnthropic
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many tokens is this?"}]
    counted = client.messages.count_tokens(
        model="claude-window-9000",
        messages=messages,
        tools=TOOLS,
        system="Be brief.",
    )
    assert fake.count_calls == 1
    assert fake.last.path == "/v1/messages/count_tokens"
    reply = client.messages.create(
        model="claude-window-9000",
        max_tokens=64,
        messages=messages,
        tools=TOOLS,
        system="Be brief.",
    )
    assert counted.input_tokens == reply.usage.input_tokens == fake.counts[0]
    assert fake.count_calls == 1


def test_nocount_models_have_no_count_endpoint(
    client: anthropic.Anthropic, fake: FakeAnthropic
) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-nocount-9000", messages=hello())
    assert fake.count_calls == 0
    assert fake.last.path == "/v1/messages/count_tokens"
    reply = client.messages.create(model="claude-nocount-9000", max_tokens=64, messages=hello())
    assert reply.content[0].type == "text"


def test_reset_clears_everything(client: anthropic.Anthropic, fake: FakeAnthropic) -> None:
    client.messages.count_tokens(model="claude-x", messages=hello())
    client.messages.create(model="claude-x", max_tokens=64, messages=hello())
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="claude-window-1", max_tokens=64, messages=hello())
    assert (len(fake.requests), len(fake.counts), len(fake.rejections), fake.count_calls) == (
        3,
        1,
        1,
        1,
    )
    fake.reset()
    assert (fake.requests, fake.counts, fake.rejections, fake.count_calls) == ([], [], [], 0)
