"""What the wire modules share (`policies.wires.base`) and how wires are found."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, StrictStr, ValidationError

from brim.policies.budget import requested_output
from brim.policies.wires import WIRES, wire_for_path
from brim.policies.wires.base import ErrorInfo, Refusal, first_error, sse_data
from brim.policies.wires.chat import CHAT, openai_error, openai_error_body
from brim.policies.wires.gemini import GEMINI
from brim.policies.wires.messages import MESSAGES
from brim.policies.wires.responses import RESPONSES

# ---- sse_data --------------------------------------------------------------------------------


def test_sse_data_gives_the_data_of_complete_lines_only() -> None:
    chunk = b'event: a\ndata: {"n": 1}\n\ndata:  two \r\n\r\ndata: {"half'
    assert sse_data(chunk) == [b'{"n": 1}', b"two"]  # the line after the last newline waits


def test_sse_data_of_a_chunk_without_a_newline_is_empty() -> None:
    assert sse_data(b'data: {"usage": 1}') == []


def test_sse_data_read_by_read_finds_every_event_once() -> None:
    """How a stream reader uses it: keep what follows the last newline for the next read."""
    stream = b'data: {"a": 1}\n\nevent: x\ndata: {"b": 2}\n\ndata: {"c": 3}\n\n'
    found: list[bytes] = []
    pending = b""
    for start in range(0, len(stream), 7):
        data = pending + stream[start : start + 7]
        found += sse_data(data)
        pending = data[data.rfind(b"\n") + 1 :]
    assert found == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']


# ---- first_error -----------------------------------------------------------------------------


class _Part(BaseModel):
    type: StrictStr


class _Body(BaseModel):
    content: StrictStr | list[_Part]
    input: StrictStr | list[dict[str, Any]] | None = None


def errors_of(body: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Body.model_validate(body)
    return caught.value


def test_first_error_drops_the_union_tags_pydantic_puts_in_a_location() -> None:
    exc = errors_of({"content": "x", "input": [1]})  # tags `str`, `list[dict[str,any]]`
    assert first_error(exc) == (["input"], "string_type", "Input should be a valid string")
    deepest = first_error(exc, deepest=True)
    assert deepest == (["input", 0], "dict_type", "Input should be a valid dictionary")


def test_first_error_deepest_takes_the_union_branch_that_got_furthest() -> None:
    exc = errors_of({"content": [{"text": "no type"}]})
    assert first_error(exc) == (["content"], "string_type", "Input should be a valid string")
    assert first_error(exc, deepest=True) == (["content", 0, "type"], "missing", "Field required")


# ---- paths -----------------------------------------------------------------------------------

PATHS = {
    "/v1/chat/completions": CHAT,
    "/chat/completions": CHAT,
    "/v1/models": CHAT,
    "/v1/unknown": CHAT,
    "/v1/messages": MESSAGES,
    "/messages/count_tokens": MESSAGES,
    "/v1/messages/responses": MESSAGES,
    "/v1/responses": RESPONSES,
    "/responses/input_tokens": RESPONSES,
    "/v1beta/models/gemini-2.5-pro:generateContent": GEMINI,
    "/v1beta/models/responses:streamGenerateContent": GEMINI,
    "/v1/models/gemini-2.5-pro:countTokens": GEMINI,
}


@pytest.mark.parametrize(("path", "wire"), PATHS.items())
def test_no_two_wires_own_a_path_so_the_order_they_are_asked_in_is_free(
    path: str, wire: Any
) -> None:
    owners = [w.name for w in WIRES.values() if w.owns_path(path)]
    assert len(owners) <= 1, owners
    assert wire_for_path(path) is wire


def test_chat_completions_owns_its_own_path() -> None:
    assert CHAT.owns_path("/v1/chat/completions")
    assert not CHAT.owns_path("/v1beta/chat/completions")


# ---- another model: a fallback's request, and calls brim makes itself ------------------------

SYSTEM = "Summarize the conversation."
TEXT = "user: fix the build\ntool result: 3 tests failed"
# A reply with thinking or reasoning first and the answer after it, in each API's shape.
REPLIES: dict[str, dict[str, Any]] = {
    "openai.chat": {
        "choices": [{"message": {"role": "assistant", "content": "the answer"}}],
    },
    "anthropic.messages": {
        "content": [
            {"type": "thinking", "thinking": "let me see", "signature": "s"},
            {"type": "text", "text": "the answer"},
        ]
    },
    "openai.responses": {
        "output": [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "hm"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "the answer", "annotations": []}],
            },
        ]
    },
    "gemini.generate": {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"text": "let me see", "thought": True}, {"text": "the answer"}],
                }
            }
        ]
    },
}
ENDPOINTS = {  # where each API's request goes, after the upstream's base URL
    "openai.chat": "/chat/completions",
    "anthropic.messages": "/v1/messages",
    "openai.responses": "/responses",
    "gemini.generate": "/v1beta/models/cheap-model:generateContent",
}


def test_every_wire_has_a_reply_and_an_endpoint() -> None:
    assert set(REPLIES) == set(WIRES) == set(ENDPOINTS)


@pytest.mark.parametrize("wire", WIRES.values(), ids=WIRES)
def test_a_call_brim_makes_is_a_request_the_api_takes_and_reads_as_asked(wire: Any) -> None:
    call = wire.model_call("cheap-model", SYSTEM, TEXT, 300)
    assert call.endpoint == ENDPOINTS[wire.name]
    wire.check(call.body)  # the API's own body check takes it
    messages = wire.genai_messages(wire.conversation(call.body))
    instructions = wire.system_instructions(call.body)
    if not instructions:  # Chat Completions: the system prompt is the first message
        instructions = messages.pop(0)["parts"]
    assert instructions == [{"type": "text", "content": SYSTEM}]
    assert messages == [{"role": "user", "parts": [{"type": "text", "content": TEXT}]}]
    assert requested_output(call.body) in (300, None)  # Gemini's is in generationConfig
    assert wire.tool_names(call.body) == frozenset()
    assert not call.body.get("stream")


@pytest.mark.parametrize("wire", WIRES.values(), ids=WIRES)
def test_the_text_of_a_reply_is_its_answer_not_its_thinking(wire: Any) -> None:
    assert wire.reply_text(REPLIES[wire.name]) == "the answer"
    assert wire.reply_text({}) == ""


@pytest.mark.parametrize("wire", WIRES.values(), ids=WIRES)
def test_a_request_for_another_model_names_it_where_the_api_does(wire: Any) -> None:
    endpoint = ENDPOINTS[wire.name].replace("cheap-model", "small")
    body = wire.model_call("small", SYSTEM, TEXT, 300).body
    changed, where = wire.with_model(body, endpoint, "roomy")
    if wire is GEMINI:  # in the path; the body is the very same
        assert changed is body and where == "/v1beta/models/roomy:generateContent"
    else:
        assert changed == {**body, "model": "roomy"} and where == endpoint
        assert body["model"] == "small"  # a new body: the client's is not changed


def test_gemini_keeps_the_method_and_the_root_of_the_path() -> None:
    body: dict[str, Any] = {"contents": []}
    for endpoint, expected in (
        ("/v1beta/models/a:streamGenerateContent", "/v1beta/models/b:streamGenerateContent"),
        ("/v1/models/a:generateContent", "/v1/models/b:generateContent"),
    ):
        assert GEMINI.with_model(body, endpoint, "b") == (body, expected)


# ---- the rest --------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES.values(), ids=WIRES)
def test_serving_cannot_be_changed_by_whoever_reads_it(wire: Any) -> None:
    with pytest.raises(TypeError):
        wire.serving["someone.else"] = frozenset({"openai"})


def test_the_openai_refusal_is_worded_in_one_place() -> None:
    refusal = Refusal(tokens_in=250_000, limit=200_000, how="nothing left to cut")
    info = ErrorInfo(
        400, "invalid_request_error", "ignored", "context_length_exceeded", None, refusal
    )
    assert openai_error(info)["message"] == refusal.openai_message()
    assert orjson.loads(openai_error_body(info)) == {"error": openai_error(info)}
    assert "250000 input tokens, over the 200000-token budget" in refusal.openai_message()


def test_a_responses_stream_error_is_the_openai_error_numbered_after_the_last_event() -> None:
    info = ErrorInfo(502, "upstream_error", "broke off", "upstream_protocol_error", "input")
    event = RESPONSES.stream_error(info, b'data: {"sequence_number": 41}\n\n')
    data = orjson.loads(event.split(b"data: ", 1)[1])
    assert data == {
        "type": "error",
        "code": "upstream_protocol_error",
        "message": "broke off",
        "param": "input",
        "sequence_number": 42,
    }
