"""Parsing and checking client request bodies (OpenAI Chat Completions so far)."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
)

from policies.nesting import nests_deeper_than
from proxy.errors import InvalidRequest


def parse_object(raw: bytes, *, max_depth: int) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {type(value).__name__}.")
    if nests_deeper_than(value, max_depth):
        raise InvalidRequest(
            f"The request body nests objects and arrays more than {max_depth} levels deep "
            "(brim's depth limit, server.max_json_depth)."
        )
    return value


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Open):
    id: StrictStr
    type: StrictStr = "function"
    function: FunctionCall | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def _content_shape(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) for part in value):
            return value
        raise ValueError("content must be a string, an array of content parts, or null")


class ChatRequest(_Open):
    model: StrictStr = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool | None = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def _param(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def check_chat(body: dict[str, Any]) -> ChatRequest:
    """Validate a Chat Completions body; the error names the first offending parameter."""
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"])
        kind = "Missing required parameter" if first["type"] == "missing" else "Invalid value for"
        detail = "" if first["type"] == "missing" else f": {first['msg']}"
        raise InvalidRequest(f"{kind} '{param}'{detail}.", param=param) from None
    for index, message in enumerate(request.messages):
        if message.role == "tool" and not message.tool_call_id:
            param = f"messages[{index}].tool_call_id"
            raise InvalidRequest(
                f"Missing required parameter '{param}': a tool message answers a tool call id.",
                param=param,
            )
    return request


class AnthropicBlock(_Open):
    type: StrictStr


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: StrictStr | list[AnthropicBlock]


class MessagesRequest(_Open):
    model: StrictStr = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: StrictStr | list[AnthropicBlock] | None = None
    stream: StrictBool | None = False


class CountTokensRequest(MessagesRequest):
    max_tokens: int | None = Field(None, ge=1)  # type: ignore[assignment]


def _anthropic_param(location: tuple[int | str, ...]) -> str:
    # Anthropic names parameters with dots: messages.0.content.1.type
    parts = [str(part) for part in location if str(part) not in ("str", "list[AnthropicBlock]")]
    return ".".join(parts)


def check_messages(body: dict[str, Any], *, counting: bool = False) -> MessagesRequest:
    """Validate an Anthropic Messages body; the error names the first offending field."""
    model = CountTokensRequest if counting else MessagesRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # Of a union's failed branches, the one that got deepest names the real problem.
        first = max(exc.errors(), key=lambda error: len(error["loc"]))
        param = _anthropic_param(first["loc"])
        if first["type"] == "missing":
            raise InvalidRequest(f"{param}: Field required", param=param) from None
        raise InvalidRequest(f"{param}: {first['msg']}", param=param) from None


class ResponsesRequest(_Open):
    model: StrictStr = Field(min_length=1)
    input: StrictStr | list[dict[str, Any]] | None = None
    stream: StrictBool | None = False
    max_output_tokens: int | None = Field(None, ge=1)


def check_responses(body: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        # Union members appear in the location as tags ("str", "list[...]"); fields do not.
        location = tuple(p for p in first["loc"] if p != "str" and not str(p).startswith("list["))
        param = _param(location)
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param) from None


class GeminiContent(_Open):
    role: Literal["user", "model"] | None = None
    parts: list[dict[str, Any]] = Field(min_length=1)


class GenerateRequest(_Open):
    contents: list[GeminiContent] = Field(min_length=1)


def check_gemini(body: dict[str, Any]) -> GenerateRequest:
    try:
        return GenerateRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(
            f"Invalid JSON payload: {param}: {first['msg']}", param=param
        ) from None
