"""Gemini generateContent (Gemini CLI): the conversation is `contents`; `systemInstruction`
and `tools` are fixed cost. The model and streaming are in the URL
(`/v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`), not the body.

Counting: 3 tokens per turn plus its text; function calls and responses as their JSON; an image
or file part at Gemini's flat 258 tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import Field, ValidationError

from policies.conversation import Dialect, ToolResult, Unit
from policies.images import GEMINI_IMAGE_TOKENS
from policies.tokens import PER_MESSAGE, PER_TOOL_CALL, as_text, token_count
from policies.wires.base import (
    NO_RESULT,
    BodyError,
    ErrorInfo,
    FieldConversation,
    GenAiMessage,
    OpenModel,
    RequestFacts,
    Usage,
    first_error,
    largest_part_text,
    text_part,
    whole_number,
    with_part_text,
)

if TYPE_CHECKING:
    import tiktoken

    from policies.tokens import TokenCounter


def _parts(item: Any) -> list[Any]:
    parts = item.get("parts") if isinstance(item, Mapping) else None
    return list(parts) if isinstance(parts, list) else []


class GeminiDialect:
    """Gemini generateContent `contents`: a `model` turn's `functionCall` parts are answered by
    the `functionResponse` parts of the very next `user` turn (by `id` where present, else by
    name, in order); the two turns are one unit. `thought` parts and `thoughtSignature`s are never
    edited. `systemInstruction` and `tools` are fixed cost."""

    name = "gemini.generate"

    @staticmethod
    def role(item: Any) -> str:
        return str(item.get("role", "user")) if isinstance(item, Mapping) else ""

    @staticmethod
    def _call_key(call: Mapping[str, Any]) -> str:
        return str(call.get("id") or call.get("name") or "")

    def calls(self, item: Any) -> list[str]:
        if self.role(item) != "model":
            return []
        return [
            self._call_key(p["functionCall"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        ]

    def call_arguments(self, item: Any) -> list[tuple[str, Any]]:
        """(call key, `args`) for each `functionCall` `calls` lists, keyed as it keys them."""
        if self.role(item) != "model":
            return []
        return [
            (self._call_key(p["functionCall"]), p["functionCall"].get("args"))
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        ]

    def answers(self, item: Any) -> list[str]:
        if self.role(item) != "user":
            return []
        return [
            self._call_key(p["functionResponse"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
        ]

    def units(self, items: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(items):
            if self.calls(items[index]):
                end = (
                    index + 2
                    if index + 1 < len(items) and self.answers(items[index + 1])
                    else index + 1
                )
                units.append(Unit("tools", index, end))
                index = end
                continue
            kind = (
                "orphan"
                if self.answers(items[index])
                else ("assistant" if self.role(items[index]) == "model" else "user")
            )
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, items: Sequence[Any]) -> dict[str, str]:
        return {
            self._call_key(p["functionCall"]): str(p["functionCall"].get("name", "tool"))
            for item in items
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        }

    def tool_results(self, item: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        results = []
        for part in _parts(item) if self.role(item) == "user" else []:
            response = part.get("functionResponse") if isinstance(part, Mapping) else None
            if isinstance(response, Mapping):
                value = response.get("response")
                if (  # `{"output": text}`, the shape `with_tool_result` writes: the text
                    isinstance(value, Mapping)
                    and len(value) == 1
                    and isinstance(value.get("output"), str)
                ):
                    value = value["output"]
                text = value if isinstance(value, str) else orjson.dumps(value).decode()
                results.append(
                    ToolResult(self._call_key(response), str(response.get("name", "tool")), text)
                )
        return results

    def with_tool_result(self, item: Any, call_id: str, text: str) -> Any:
        parts = [
            {**p, "functionResponse": {**p["functionResponse"], "response": {"output": text}}}
            if isinstance(p, Mapping)
            and isinstance(p.get("functionResponse"), Mapping)
            and self._call_key(p["functionResponse"]) == call_id
            else p
            for p in _parts(item)
        ]
        return {**item, "parts": parts}

    def text(self, item: Any) -> str:
        return "\n".join(
            str(p["text"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought")
        )

    def largest_text(self, item: Any) -> str | None:
        if any(
            isinstance(p, Mapping) and (p.get("thought") or p.get("thoughtSignature"))
            for p in _parts(item)
        ):
            return None
        return largest_part_text(_parts(item))

    def with_largest_text(self, item: Any, text: str) -> Any:
        return {**item, "parts": with_part_text(_parts(item), self.largest_text(item), text)}

    def notice(self, text: str) -> Any:
        return {"role": "user", "parts": [{"text": text}]}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "user", "parts": [_no_response(call_id, text)]}

    def violations(self, items: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        for index, item in enumerate(items):
            if self.role(item) not in ("user", "model"):
                problems.append(f"contents[{index}]: role must be user or model")
            answered = self.answers(item)
            if answered:
                previous = self.calls(items[index - 1]) if index else []
                if sorted(answered) != sorted(previous):
                    problems.append(
                        f"contents[{index}]: function responses {answered} do not answer the calls {previous} of the turn before"
                    )
            calls = self.calls(item)
            if calls:
                following = self.answers(items[index + 1]) if index + 1 < len(items) else []
                if sorted(following) != sorted(calls):
                    problems.append(
                        f"contents[{index}]: function calls {calls} are not answered by the next turn"
                    )
        return problems

    def repaired(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Responses that answer nothing dropped; unanswered calls given a placeholder."""
        out: list[Any] = []
        done: list[str] = []
        for item in items:
            open_calls = self.calls(out[-1]) if out else []
            answered = self.answers(item)
            if answered or open_calls:
                kept = [
                    p
                    for p in _parts(item)
                    if not (
                        isinstance(p, Mapping)
                        and isinstance(p.get("functionResponse"), Mapping)
                        and self._call_key(p["functionResponse"]) not in open_calls
                    )
                ]
                have = [
                    self._call_key(p["functionResponse"])
                    for p in kept
                    if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
                ]
                missing = [c for c in open_calls if c not in have]
                if len(kept) != len(_parts(item)):
                    done.append("dropped function responses that answer no call")
                if missing and self.role(item) == "user":
                    kept = [*(_no_response(c) for c in missing), *kept]
                    done.append(f"added responses for unanswered calls {missing}")
                elif missing:  # the next turn is not the user's: answer in a turn of our own
                    out.append({"role": "user", "parts": [_no_response(c) for c in missing]})
                    done.append(f"added responses for unanswered calls {missing}")
                if not kept:
                    continue
                item = {**item, "parts": kept} if kept != _parts(item) else item
            out.append(item)
        if out and self.calls(out[-1]):
            missing = self.calls(out[-1])
            out.append({"role": "user", "parts": [_no_response(c) for c in missing]})
            done.append(f"added responses for unanswered calls {missing}")
        return out, done


def _no_response(call: str, text: str = NO_RESULT) -> dict[str, Any]:
    return {"functionResponse": {"name": call, "response": {"output": text}}}


class _Content(OpenModel):
    role: Literal["user", "model"] | None = None
    parts: list[dict[str, Any]] = Field(min_length=1)


class _GenerateRequest(OpenModel):
    contents: list[_Content] = Field(min_length=1)


# Google's error statuses by HTTP status.
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _genai_part(part: Any) -> dict[str, Any] | None:
    if not isinstance(part, Mapping):
        return None
    if isinstance(part.get("text"), str):
        kind = "reasoning" if part.get("thought") else "text"
        return {"type": kind, "content": part["text"]}
    if isinstance(part.get("functionCall"), Mapping):
        call = part["functionCall"]
        return {
            "type": "tool_call",
            "id": call.get("id"),
            "name": call.get("name"),
            "arguments": call.get("args"),
        }
    if isinstance(part.get("functionResponse"), Mapping):
        response = part["functionResponse"]
        return {
            "type": "tool_call_response",
            "id": response.get("id") or response.get("name"),
            "response": response.get("response"),
        }
    if isinstance(part.get("inlineData"), Mapping):
        data = part["inlineData"]
        return {
            "type": "blob",
            "mime_type": data.get("mimeType"),
            "content": f"[{len(str(data.get('data', '')))} bytes]",
        }
    if isinstance(part.get("fileData"), Mapping):
        data = part["fileData"]
        return {"type": "uri", "mime_type": data.get("mimeType"), "uri": data.get("fileUri")}
    return None


class GeminiWire(FieldConversation):
    name = "gemini.generate"
    conversation_field = "contents"
    operation = "generate_content"
    dialect: Dialect = GeminiDialect()
    serving: Mapping[str, frozenset[str]] = MappingProxyType(
        {
            "gemini.generate": frozenset({"gemini"}),
            "gemini.count_tokens": frozenset({"gemini"}),
        }
    )

    def owns_path(self, path: str) -> bool:
        return path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)

    def check(self, body: dict[str, Any]) -> RequestFacts:
        try:
            _GenerateRequest.model_validate(body)
        except ValidationError as exc:
            location, _, message = first_error(exc)
            param = ".".join(str(part) for part in location)
            raise BodyError(f"Invalid JSON payload: {param}: {message}", param) from None
        return RequestFacts(model=None, stream=False)

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        count = token_count(enc)
        tokens = PER_MESSAGE + count(message.get("role"))
        for part in message.get("parts") or ():
            if not isinstance(part, Mapping):
                continue
            if "text" in part:
                tokens += count(part.get("text"))
            elif "functionCall" in part or "functionResponse" in part:
                tokens += PER_TOOL_CALL + count(
                    part.get("functionCall") or part.get("functionResponse")
                )
            elif "inlineData" in part or "fileData" in part:
                tokens += GEMINI_IMAGE_TOKENS
            else:
                tokens += count(part)
        return tokens

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        system = body.get("systemInstruction") or body.get("system_instruction") or {}
        fixed = counter.text(as_text(system), tokenizer) if system else 0
        if body.get("tools"):
            fixed += counter.text(as_text(body["tools"]), tokenizer)
        return fixed

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        return None

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        tokens = 0
        for item in self.conversation(body):
            for part in _parts(item):
                if not isinstance(part, Mapping):
                    continue
                if "functionCall" in part or "functionResponse" in part:
                    tokens += PER_TOOL_CALL
                elif "inlineData" in part or "fileData" in part:
                    tokens += GEMINI_IMAGE_TOKENS
        return tokens

    def error_body(self, error: ErrorInfo) -> bytes:
        message = error.message
        if error.refusal is not None:
            refusal = error.refusal
            message = (
                f"The input token count ({refusal.tokens_in}) exceeds the maximum number of "
                f"tokens allowed ({refusal.limit}). brim could not make it fit: {refusal.how}"
            )
        status = STATUSES.get(error.status, "INTERNAL")
        return orjson.dumps({"error": {"code": error.status, "message": message, "status": status}})

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        return b"data: " + self.error_body(error) + b"\r\n\r\n"

    def usage(self, payload: Any) -> Usage | None:
        metadata = payload.get("usageMetadata") if isinstance(payload, Mapping) else None
        if not isinstance(metadata, Mapping):
            return None
        output = whole_number(metadata.get("candidatesTokenCount"))
        thoughts = whole_number(metadata.get("thoughtsTokenCount"))
        if thoughts is not None:
            output = (output or 0) + thoughts
        return Usage(
            input=whole_number(metadata.get("promptTokenCount")),
            output=output,
            cached_input=whole_number(metadata.get("cachedContentTokenCount")),
        )

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        out: list[GenAiMessage] = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            parts = [p for part in _parts(item) if (p := _genai_part(part))]
            role = "assistant" if item.get("role") == "model" else str(item.get("role") or "user")
            out.append({"role": role, "parts": parts})
        return out

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        system = body.get("systemInstruction") or body.get("system_instruction")
        if isinstance(system, str):
            return [text_part(system)]
        parts = system.get("parts") if isinstance(system, Mapping) else None
        return [
            text_part(str(p["text"]))
            for p in parts or ()
            if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]


GEMINI = GeminiWire()
