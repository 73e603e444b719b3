"""What every wire API module provides (`Wire`), and the plain values they exchange with the
rest of brim: request facts, error facts, usage, and messages in the GenAI conventions' shape.

A wire object holds no per-request state: everything it needs comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict

from policies.conversation import Dialect

if TYPE_CHECKING:
    import tiktoken

    from policies.tokens import ChatCount, TokenCounter

NOTICE_PREFIX = "[brim removed "


class BodyError(ValueError):
    """A request body this wire API would refuse; `param` names the offending field in the
    API's own notation."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What a body check learned: the model (None where the URL names it) and streaming."""

    model: str | None
    stream: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why brim refused a request it could not make fit: each wire API words it its own way."""

    tokens_in: int
    limit: int
    how: str


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error as a client is told it: HTTP status, OpenAI-style type and code, the message."""

    status: int
    error_type: str
    message: str
    code: str | None = None
    param: str | None = None
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage a provider reported; None where it did not say. `input` includes cached
    input, as the GenAI conventions define `gen_ai.usage.input_tokens`."""

    input: int | None = None
    output: int | None = None
    cached_input: int | None = None

    def merged(self, later: Usage) -> Usage:
        """Later reports win field by field (streams report usage in pieces)."""
        return Usage(
            later.input if later.input is not None else self.input,
            later.output if later.output is not None else self.output,
            later.cached_input if later.cached_input is not None else self.cached_input,
        )


# A message in the OpenTelemetry GenAI input-messages shape:
# {"role": ..., "parts": [{"type": "text", "content": ...}, {"type": "tool_call", "id", "name",
#  "arguments"}, {"type": "tool_call_response", "id", "response"}, {"type": "blob"|"uri", ...}]}
GenAiMessage = dict[str, Any]


class Wire(Protocol):
    """One client wire API: everything brim does differently for it lives behind this."""

    name: str  # "openai.chat": the client API, as `Exchange.api` names it
    conversation_field: str  # where the conversation lives in a request body
    operation: str  # gen_ai.operation.name
    dialect: Dialect
    # Every endpoint of this API (the conversation one and e.g. token counting) with the
    # `[upstreams]` api kinds that can serve it.
    serving: Mapping[str, frozenset[str]]

    def owns_path(self, path: str) -> bool:
        """Whether a request on `path` expects its errors in this API's shape."""
        ...

    def check(self, body: dict[str, Any]) -> RequestFacts:
        """Raises `BodyError` for a body the API would refuse."""
        ...

    def conversation(self, body: Mapping[str, Any]) -> list[Any]: ...

    def with_conversation(self, body: Mapping[str, Any], items: Sequence[Any]) -> dict[str, Any]:
        """A new body with `items` as its conversation; every other field as it was."""
        ...

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        """One item's tokens in the raw encoding (before any calibration factor)."""
        ...

    def count(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> ChatCount:
        """The whole request: per item, plus the fixed cost (system prompt, tools, priming)."""
        ...

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        """Tokens a count can have beyond one per byte of the body: per-item overheads, and
        images or documents, which cost by the provider's rule rather than by their bytes."""
        ...

    def error_body(self, error: ErrorInfo) -> bytes: ...

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        """The event that ends a broken stream, in the shape this API's SDKs read as an error;
        `last_event` is what was relayed last (the Responses API numbers its events)."""
        ...

    def usage(self, payload: Any) -> Usage | None:
        """Usage in a reply body or in one stream event's data, if it carries any."""
        ...

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        """Conversation items in the GenAI conventions' shape (for traces and transcripts)."""
        ...

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The system prompt outside the conversation, as GenAI parts (empty if none)."""
        ...


class FieldConversation:
    """For wires whose conversation is one list field of the body (`conversation_field`)."""

    conversation_field: str

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        value = body.get(self.conversation_field)
        return list(value) if isinstance(value, list) else []

    def with_conversation(self, body: Mapping[str, Any], items: Sequence[Any]) -> dict[str, Any]:
        return {**body, self.conversation_field: list(items)}


def token_count(enc: tiktoken.Encoding) -> Callable[[Any], int]:
    """Tokens of a value in `enc`: a string as it is, anything else as its JSON; 0 for empty."""

    def count(value: Any) -> int:
        return len(enc.encode_ordinary(as_text(value))) if value else 0

    return count


def text_of(content: Any) -> str:
    """A string content, or the texts of a list of parts, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def image_part(url: str) -> dict[str, Any]:
    """An image by URL as a GenAI part: inline data by its size only, a link as it is."""
    if url.startswith("data:"):
        return {"type": "blob", "modality": "image", "content": f"[{len(url)} bytes]"}
    return {"type": "uri", "modality": "image", "uri": url}


def whole_number(value: Any) -> int | None:
    """`value` if it is an int (and not a bool), else None: usage figures as providers send them."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class OpenModel(BaseModel):
    """A body check that names the fields it checks and lets every other field through."""

    model_config = ConfigDict(extra="allow")


def sse_data(chunk: bytes) -> Iterator[bytes]:
    """The `data:` payloads of complete server-sent events in `chunk`."""
    for line in chunk.splitlines():
        if line.startswith(b"data:"):
            yield line[5:].strip()


def transcript(messages: Sequence[GenAiMessage]) -> str:
    """Messages as plain text for a summarizer: who said what, which tools were called with
    what, and what they returned."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role", "")
        for part in message.get("parts", ()):
            kind = part.get("type")
            if kind == "text" and part.get("content"):
                lines.append(f"{role}: {part['content']}")
            elif kind == "tool_call":
                lines.append(f"{role} called {part.get('name')}({as_text(part.get('arguments'))})")
            elif kind == "tool_call_response":
                lines.append(f"tool result: {as_text(part.get('response'))}")
    return "\n".join(lines)


# What a dialect writes where a tool call has no recorded result.
NO_RESULT = "[no result was recorded for this tool call]"


def role_of(message: Any) -> str:
    if type(message) is dict:  # parsed JSON: skip the slow abstract-class check
        return str(message.get("role", ""))
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""


def repeats(ids: Sequence[str]) -> list[str]:
    """Ids that occur more than once, in order of their first repeat."""
    seen: set[str] = set()
    repeated: list[str] = []
    for item in ids:
        if item in seen and item not in repeated:
            repeated.append(item)
        seen.add(item)
    return repeated


def first_of_each(items: Sequence[Any], id_of: Callable[[Any], str | None]) -> list[Any]:
    """`items` without those whose id (`id_of(item)`, None for items without one) came before."""
    seen: set[str] = set()
    kept = []
    for item in items:
        key = id_of(item)
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept.append(item)
    return kept


def largest_part_text(parts: Sequence[Any]) -> str | None:
    texts = [
        str(part["text"])
        for part in parts
        if isinstance(part, Mapping) and isinstance(part.get("text"), str) and part["text"]
    ]
    return max(texts, key=len) if texts else None


def with_part_text(parts: Sequence[Any], old: str | None, new: str) -> list[Any]:
    """`parts` with the first text part whose text is `old` rewritten to `new`."""
    out = list(parts)
    for position, part in enumerate(out):
        if isinstance(part, Mapping) and part.get("text") == old:
            out[position] = {**part, "text": new}
            break
    return out


def param_path(location: Sequence[int | str]) -> str:
    """A pydantic error location as OpenAI names parameters: messages[1].content."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
