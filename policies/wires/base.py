"""What every wire API module provides (`Wire`), and the plain values they exchange with the
rest of brim: request facts, error facts, usage, and messages in the GenAI conventions' shape.

A wire object holds no per-request state: everything it needs comes in as arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from policies.conversation import NO_RESULT as NO_RESULT  # what answers a lost call
from policies.conversation import Dialect, UnitKind
from policies.tokens import as_text  # one copy, there: `policies.tokens` imports no wire

if TYPE_CHECKING:
    import tiktoken

    from policies.tokens import TokenCounter

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

    def openai_message(self) -> str:
        """The wording of OpenAI's APIs (and of `ContextTooLarge.message`)."""
        return (
            f"This request has {self.tokens_in} input tokens, over the {self.limit}-token "
            f"budget brim keeps for this model, and could not be made to fit: {self.how}"
        )


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

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        """The cost outside the conversation (system prompt, tool definitions), scaled.
        `TokenCounter.request` adds the items, the reply's schema and the reply priming."""
        ...

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        """The schema the reply must follow, counted as its JSON; None if the body gives none."""
        ...

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        """Tokens a count can have beyond one per byte of the body, reply priming and a fixed
        overhead per item (`TokenCounter.upper_bound` adds those): tool calls, tool definitions,
        and images or documents, which cost by the provider's rule rather than by their bytes."""
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


def under(path: str, *roots: str) -> bool:
    """Whether `path` is one of `roots` or below one (`/v1/messages/count_tokens` is under
    `/v1/messages`; `/v1/messagesx` is not)."""
    return any(path == root or path.startswith(f"{root}/") for root in roots)


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


def sse_data(chunk: bytes) -> list[bytes]:
    """The `data:` payloads (stripped) of the complete lines of a server-sent event stream: a
    line after `chunk`'s last newline is not complete yet (a reader keeps it for the next read)."""
    end = chunk.rfind(b"\n")
    if end < 0:
        return []
    return [line[5:].strip() for line in chunk[:end].splitlines() if line.startswith(b"data:")]


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


# The unit a lone message (not part of a tool group) makes, by its role (Chat Completions and
# Responses); a role not listed is the dialect's to decide.
UNIT_KINDS: Mapping[str, UnitKind] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "orphan",
}


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


# How pydantic names a union's members in an error location: `str`, `list[_Block]`,
# `function-after[...]`, …; a field of a wire API's body is never named so.
_UNION_TAG = re.compile(r"str|int|float|bool|bytes|none|[\w-]+\[.*\]", re.S)


def first_error(exc: ValidationError, *, deepest: bool = False) -> tuple[list[int | str], str, str]:
    """The error a body check reports: (location without union tags, pydantic's error type, its
    message). The first error, or with `deepest` the one whose location goes deepest (of a
    union's failed branches, the one that got furthest names the real problem)."""
    errors = exc.errors()
    error = max(errors, key=lambda e: len(e["loc"])) if deepest else errors[0]
    location = [
        part for part in error["loc"] if not (isinstance(part, str) and _UNION_TAG.fullmatch(part))
    ]
    return location, error["type"], error["msg"]


def param_path(location: Sequence[int | str]) -> str:
    """A pydantic error location as OpenAI names parameters: messages[1].content."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
