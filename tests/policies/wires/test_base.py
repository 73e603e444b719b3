"""What the wire modules share (`policies.wires.base`) and how wires are found."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, StrictStr, ValidationError

from policies.wires import WIRES, wire_for_path
from policies.wires.base import ErrorInfo, Refusal, first_error, sse_data
from policies.wires.chat import CHAT, openai_error, openai_error_body
from policies.wires.gemini import GEMINI
from policies.wires.messages import MESSAGES
from policies.wires.responses import RESPONSES

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
