"""Anthropic Messages (`POST /v1/messages`): the conversation is `messages`; `system` and
`tools` are fixed cost.

Counting: Anthropic publishes no offline tokenizer, so text is counted with o200k_base (times the
calibration factor); images by Anthropic's pixel rule, PDF pages at their published top cost,
tool use and results with a small fixed overhead, thinking by its text (redacted thinking by the
length of its data), and, when tools are given, the tool-use system prompt Anthropic adds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

import orjson
from pydantic import Field, StrictBool, StrictStr, ValidationError
from typing_extensions import TypedDict

from brim.policies.conversation import Dialect, ToolResult, Unit
from brim.policies.images import ANTHROPIC_MAX_IMAGE_TOKENS, anthropic_image_tokens, pdf_tokens
from brim.policies.tokens import (
    ANTHROPIC_TOOL_PROMPT,
    PER_MESSAGE,
    PER_TOOL_CALL,
    RAW,
    as_text,
    token_count,
)
from brim.policies.wires.base import (
    NO_RESULT,
    BodyError,
    ErrorInfo,
    FieldConversation,
    GenAiMessage,
    ModelCall,
    ModelInBody,
    RequestFacts,
    Splice,
    Target,
    ToolCall,
    ToolSpec,
    TurnReader,
    Usage,
    answered_in_order,
    body_check,
    first_error,
    first_of_each,
    json_object,
    listed,
    model_name,
    named_tools,
    repeats,
    role_of,
    text_of,
    text_part,
    under,
    whole_number,
    with_tool_last,
)

if TYPE_CHECKING:
    import tiktoken

    from brim.policies.tokens import TokenCounter

EARLIER_REMOVED = "[earlier messages were removed]"  # a user turn repair adds where one must be
ANTHROPIC_VERSION = "2023-06-01"  # the `anthropic-version` of the requests brim makes itself


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _block_text(block: Any) -> str:
    if not isinstance(block, Mapping):
        return ""
    if block.get("type") == "text":
        return str(block.get("text", ""))
    if block.get("type") == "tool_result":
        return text_of(block.get("content"))
    return ""


def _with_text(content: Any, text: str) -> Any:
    """A tool result's content with its text replaced by `text` (the text cut): a string as
    it is; in a list of blocks, the first text block takes it (its other fields kept), the other
    text blocks go, and images and documents stay."""
    if not isinstance(content, list):
        return text
    out: list[Any] = []
    placed = False
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "text":
            if not placed:
                out.append({**block, "text": text})
                placed = True
            continue
        out.append(block)
    return out if placed else text


class AnthropicDialect:
    """Anthropic Messages: `tool_use` blocks in an assistant message are answered by
    `tool_result` blocks (which must come first) in the very next user message; the two messages
    form one unit. `system` is outside `messages`, so it is fixed cost. Assistant messages with
    `thinking` / `redacted_thinking` blocks are never edited — only removed whole.

    A `role: "system"` message inside `messages` (a mid-conversation system message: Claude Code
    sends them, with the beta `mid-conversation-system-2026-04-07`) is an instruction, like the
    system prompt: a unit of its own, never edited, and where Anthropic takes it — right after a
    user turn (or an assistant turn that ends in a server tool's use), right before an assistant
    turn or at the end, never next to another."""

    name = "anthropic.messages"

    role = staticmethod(role_of)

    def calls(self, message: Any) -> list[str]:
        if self.role(message) != "assistant":
            return []
        return [
            i for block in _blocks(message.get("content")) if (i := _tool_use_id(block)) is not None
        ]

    def call_arguments(self, message: Any) -> list[tuple[str, Any]]:
        """(id, `input`) for each `tool_use` block `calls` lists."""
        if self.role(message) != "assistant":
            return []
        return [
            (i, block.get("input"))
            for block in _blocks(message.get("content"))
            if (i := _tool_use_id(block)) is not None
        ]

    def answers(self, message: Any) -> list[str]:
        if self.role(message) != "user":
            return []
        return [
            str(block.get("tool_use_id"))
            for block in _blocks(message.get("content"))
            if isinstance(block, Mapping) and block.get("type") == "tool_result"
        ]

    @staticmethod
    def thinks(message: Any) -> bool:
        return any(
            isinstance(block, Mapping) and block.get("type") in ("thinking", "redacted_thinking")
            for block in _blocks(message.get("content") if isinstance(message, Mapping) else None)
        )

    def units(self, messages: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(messages):
            message = messages[index]
            if self.calls(message):
                end = index + 1
                if end < len(messages) and self.answers(messages[end]):
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            role = self.role(message)
            kind = (
                "orphan"
                if self.answers(message)
                else (role if role in ("assistant", "system") else "user")
            )
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        for message in messages:
            if self.role(message) == "assistant":
                for block in _blocks(message.get("content")):
                    if isinstance(block, Mapping) and block.get("type") == "tool_use":
                        names[str(block.get("id"))] = str(block.get("name") or "tool")
        return names

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if self.role(message) != "user" or not isinstance(message.get("content"), list):
            return []
        return [
            ToolResult(
                str(block.get("tool_use_id")),
                tools_by_call.get(str(block.get("tool_use_id")), "tool"),
                text_of(block.get("content")),
            )
            for block in message["content"]
            if isinstance(block, Mapping)
            and block.get("type") == "tool_result"
            and text_of(block.get("content"))
        ]

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any:
        content = [
            {**block, "content": text}
            if isinstance(block, Mapping)
            and block.get("type") == "tool_result"
            and str(block.get("tool_use_id")) == call_id
            else block
            for block in message["content"]
        ]
        return {**message, "content": content}

    def text(self, message: Any) -> str:
        if not isinstance(message, Mapping):
            return ""
        return "\n".join(
            block["text"]
            for block in _blocks(message.get("content"))
            if isinstance(block, Mapping) and block.get("type") == "text"
        )

    def largest_text(self, message: Any) -> str | None:
        if not isinstance(message, Mapping) or self.thinks(message) or _is_system(message):
            return None  # thinking turns and instructions are never cut
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [_block_text(block) for block in _blocks(content)]
        texts = [text for text in texts if text]
        return max(texts, key=len) if texts else None

    def with_largest_text(self, message: Any, text: str) -> Any:
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": text}
        largest = self.largest_text(message)
        blocks = list(content)
        for position, block in enumerate(blocks):
            if _block_text(block) == largest:
                if block.get("type") == "text":
                    blocks[position] = {**block, "text": text}
                else:
                    blocks[position] = {**block, "content": _with_text(block.get("content"), text)}
                break
        return {**message, "content": blocks}

    def notice(self, text: str) -> Any:
        return {"role": "user", "content": text}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "user", "content": [_result_block(call_id, text)]}

    def violations(self, messages: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        if messages and self.role(messages[0]) != "user":
            problems.append("messages[0]: the first message must be a user message")
        for index, message in enumerate(messages):
            role = self.role(message)
            if role not in ("user", "assistant", "system"):
                problems.append(
                    f"messages[{index}]: role {role!r} is not user, assistant or system"
                )
            if role == "system":
                problems += _placement(messages, index)
            answered = self.answers(message)
            if answered:
                previous = messages[index - 1] if index else None
                open_calls = self.calls(previous)
                for call_id in answered:
                    if call_id not in open_calls:
                        problems.append(
                            f"messages[{index}]: tool_result {call_id!r} answers no tool_use of the previous message"
                        )
                if len(set(answered)) != len(answered):
                    problems.append(f"messages[{index}]: a tool_use is answered twice")
                kinds = [
                    b.get("type") for b in _blocks(message.get("content")) if isinstance(b, Mapping)
                ]
                if kinds[: len(answered)] != ["tool_result"] * len(answered):
                    problems.append(f"messages[{index}]: tool_result blocks must come first")
            calls = self.calls(message)
            if repeated := repeats(calls):
                problems.append(f"messages[{index}]: tool_use ids {repeated} repeat")
            if calls:
                following = messages[index + 1] if index + 1 < len(messages) else None
                missing = [c for c in calls if c not in self.answers(following)]
                if missing:
                    problems.append(
                        f"messages[{index}]: tool_use {missing} not answered in the next message"
                    )
        return problems

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Drop tool_result blocks that answer nothing (and messages left empty) and tool_use
        blocks repeating an id in their message (not in thinking turns: those are never edited),
        add a placeholder result for each unanswered tool_use, put results first, start with a
        user; put each system message where Anthropic takes it (`_placed`), before the pairs are
        mended (a system message between a tool_use and its results moves after the results,
        which are kept) and again after (mending may drop the user turn one followed)."""
        placed, done = _placed(messages)
        out, mended = self._paired(placed)
        out, moved = _placed(out)
        return out, done + mended + moved

    def _paired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        out: list[Any] = []
        done: list[str] = []
        for message in messages:
            open_calls = self.calls(out[-1]) if out else []
            if self.role(message) == "user":
                fixed, notes = self._fix_results(message, open_calls)
                done += notes
                if fixed is not None:
                    out.append(fixed)
                continue
            if open_calls:  # the previous assistant's tool_use got no user message after it
                out.append({"role": "user", "content": [_result_block(c) for c in open_calls]})
                done.append(f"added results for unanswered tool_use {open_calls}")
            if (repeated := repeats(self.calls(message))) and not self.thinks(message):
                blocks = first_of_each(_blocks(message.get("content")), _tool_use_id)
                message = {**message, "content": blocks}
                done.append(f"dropped repeated tool_use {repeated}")
            out.append(message)
        if out and self.calls(out[-1]):
            out.append({"role": "user", "content": [_result_block(c) for c in self.calls(out[-1])]})
            done.append("added results for the last message's unanswered tool_use")
        if out and self.role(out[0]) != "user":
            out.insert(0, {"role": "user", "content": EARLIER_REMOVED})
            done.append("started the conversation with a user message")
        return out, done

    def _fix_results(self, message: Any, open_calls: list[str]) -> tuple[Any | None, list[str]]:
        blocks = _blocks(message.get("content"))
        results, others, notes, seen = [], [], [], set()
        for block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                call_id = str(block.get("tool_use_id"))
                if call_id in open_calls and call_id not in seen:
                    results.append(block)
                    seen.add(call_id)
                else:
                    notes.append(f"dropped tool_result {call_id!r} that answers no tool_use")
            else:
                others.append(block)
        missing = [c for c in open_calls if c not in seen]
        if missing:
            notes.append(f"added results for unanswered tool_use {missing}")
        results += [_result_block(c) for c in missing]
        fixed_blocks = results + others
        if not notes and [b.get("type") if isinstance(b, Mapping) else None for b in blocks] == [
            b.get("type") if isinstance(b, Mapping) else None for b in fixed_blocks
        ]:
            return message, []
        if not fixed_blocks:
            return None, notes
        if not notes:
            notes.append("moved tool_result blocks before the other content")
        return {**message, "content": fixed_blocks}, notes


# Mid-conversation system messages -------------------------------------------------------------

# A system message may follow a user turn, or an assistant turn that ends in a server tool's
# use (a paused turn; the blocks of server tools and their results are the assistant's own).
_SERVER_TOOL_BLOCK = re.compile(r"(?:server|mcp)_tool_use|\w+_tool_result")


def _is_system(message: Any) -> bool:
    return role_of(message) == "system"


def _may_precede_system(message: Any) -> bool:
    role = role_of(message)
    if role == "user":
        return True
    if role != "assistant":
        return False
    blocks = _blocks(message.get("content"))
    last = blocks[-1] if blocks else None
    kind = last.get("type") if isinstance(last, Mapping) else None
    return isinstance(kind, str) and _SERVER_TOOL_BLOCK.fullmatch(kind) is not None


def _placement(messages: Sequence[Any], index: int) -> list[str]:
    """Where the system message at `index` breaks Anthropic's placement rules (the first
    message is checked as any first message is)."""
    problems: list[str] = []
    if index and not _may_precede_system(messages[index - 1]):
        problems.append(
            f"messages[{index}]: a system message must follow a user message, not "
            f"{role_of(messages[index - 1]) or 'nothing'}"
        )
    following = messages[index + 1] if index + 1 < len(messages) else None
    if following is not None and role_of(following) != "assistant":
        problems.append(
            f"messages[{index}]: a system message must come right before an assistant message "
            "or last"
        )
    return problems


def _placed(messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """Each system message where Anthropic takes it, as near to where it was as can be: moved
    after the user messages that follow it (so it comes right before the next assistant turn,
    or last), merged with a system message it then meets (blocks in order), and, when no user
    turn comes before it, given one. Their content is never changed; a conversation whose
    system messages are placed as the rules want comes back as it was."""
    out: list[Any] = []
    done: list[str] = []
    waiting: list[Any] = []  # system messages not yet placed, in order
    moved = False  # user messages went out while some waited

    def place() -> None:
        if not waiting:
            return
        if moved:
            done.append("moved a system message after the user message that followed it")
        if len(waiting) > 1:
            blocks = [block for message in waiting for block in _blocks(message.get("content"))]
            done.append(f"merged {len(waiting)} adjacent system messages")
            system = {**waiting[0], "content": blocks}
        else:
            system = waiting[0]
        if not out or not _may_precede_system(out[-1]):
            out.append({"role": "user", "content": EARLIER_REMOVED})
            done.append("added a user message before a system message")
        out.append(system)
        waiting.clear()

    for message in messages:
        role = role_of(message)
        if role == "system":
            waiting.append(message)
            continue
        if role == "user":
            moved = moved or bool(waiting)
        else:
            place()
            moved = False
        out.append(message)
    place()
    return out, done


def _tool_use_id(block: Any) -> str | None:
    if isinstance(block, Mapping) and block.get("type") == "tool_use":
        return str(block.get("id"))
    return None


def _result_block(call_id: str, text: str = NO_RESULT) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


# Body checks -------------------------------------------------------------------------------


class _Block(TypedDict):
    type: StrictStr


class _Message(TypedDict):
    role: Literal["user", "assistant", "system"]  # system: a mid-conversation system message
    content: StrictStr | list[_Block]


class _MessagesBody(TypedDict):
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[_Message], Field(min_length=1)]
    system: NotRequired[StrictStr | list[_Block] | None]
    stream: NotRequired[StrictBool | None]


class _MessagesRequest(_MessagesBody):
    max_tokens: Annotated[int, Field(ge=1)]


class _CountTokensRequest(_MessagesBody):
    max_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]


_check_messages = body_check(_MessagesRequest)
_check_count_tokens = body_check(_CountTokensRequest)


def check_count_tokens(body: dict[str, Any]) -> RequestFacts:
    """A `count_tokens` body: a Messages body that need not say `max_tokens`."""
    return _checked(_check_count_tokens, body)


def _checked(check: Callable[[Any], Any], body: dict[str, Any]) -> RequestFacts:
    try:
        request = check(body)
    except ValidationError as exc:
        location, kind, message = first_error(exc, deepest=True)
        param = ".".join(str(part) for part in location)  # Anthropic's: messages.0.content.1.type
        if kind == "missing":
            raise BodyError(f"{param}: Field required", param) from None
        raise BodyError(f"{param}: {message}", param) from None
    return RequestFacts(model=request["model"], stream=bool(request.get("stream")))


# Errors and usage --------------------------------------------------------------------------

# Anthropic's error types by HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, Mapping):
        return None
    fresh = whole_number(usage.get("input_tokens"))
    read = whole_number(usage.get("cache_read_input_tokens"))
    written = whole_number(usage.get("cache_creation_input_tokens"))
    total = None if fresh is None else fresh + (read or 0) + (written or 0)
    return Usage(input=total, output=whole_number(usage.get("output_tokens")), cached_input=read)


def _usage_written(existing: Any, usage: Usage) -> dict[str, Any]:
    """`existing` (a `usage` object, or None) with `usage` written into it. Anthropic splits
    input three ways: `input_tokens` (fresh) + `cache_read_input_tokens` (`cached_input`) +
    `cache_creation_input_tokens` (kept as it was, cut if the new total is smaller)."""
    out: dict[str, Any] = dict(existing) if isinstance(existing, Mapping) else {}
    if usage.cached_input is not None:
        out["cache_read_input_tokens"] = usage.cached_input
    if usage.input is not None:
        read = whole_number(out.get("cache_read_input_tokens")) or 0
        if read > usage.input:
            read = out["cache_read_input_tokens"] = usage.input
        written = whole_number(out.get("cache_creation_input_tokens")) or 0
        if read + written > usage.input:
            written = out["cache_creation_input_tokens"] = usage.input - read
        out["input_tokens"] = usage.input - read - written
    if usage.output is not None:
        out["output_tokens"] = usage.output
    return out


def _genai_block(block: Any) -> dict[str, Any] | None:
    if isinstance(block, str):
        return text_part(block)
    if not isinstance(block, Mapping):
        return None
    kind = block.get("type")
    if kind == "text":
        return text_part(str(block.get("text", "")))
    if kind == "tool_use":
        return {
            "type": "tool_call",
            "id": block.get("id"),
            "name": block.get("name"),
            "arguments": block.get("input"),
        }
    if kind == "tool_result":
        return {
            "type": "tool_call_response",
            "id": block.get("tool_use_id"),
            "response": text_of(block.get("content")),
        }
    if kind == "thinking":
        return {"type": "reasoning", "content": str(block.get("thinking", ""))}
    if kind in ("image", "document"):
        found = block.get("source")
        source: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        modality = "image" if kind == "image" else "document"
        if source.get("type") == "url":
            return {"type": "uri", "modality": modality, "uri": source.get("url")}
        size = len(str(source.get("data", "")))
        return {"type": "blob", "modality": modality, "content": f"[{size} bytes]"}
    return {"type": str(kind)}


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    return "\n".join(str(b.get("text", "")) for b in system or [] if isinstance(b, Mapping))


# Tools brim answers itself --------------------------------------------------------------------


def _as_tool_call(block: Any) -> ToolCall | None:
    if not isinstance(block, Mapping) or block.get("type") != "tool_use":
        return None
    return ToolCall(
        str(block.get("id")), str(block.get("name", "")), json_object(block.get("input"))
    )


def _reply_calls(blocks: Sequence[Any]) -> list[tuple[int, ToolCall]]:
    """(position, call) for each of a reply's `tool_use` blocks, parsed once."""
    return [
        (position, call)
        for position, block in enumerate(blocks)
        if (call := _as_tool_call(block)) is not None
    ]


def _index(event: Mapping[str, Any], default: int) -> int:
    index = whole_number(event.get("index"))
    return default if index is None else index


class MessagesTurnReader(TurnReader):
    """Anthropic's stream (`message_start`, `content_block_start` / `_delta` / `_stop`,
    `message_delta`, `message_stop`) into one `message`. Blocks are updated in place from their
    opening shape, so a thinking block comes out as `{"type", "thinking", "signature"}` — the
    bytes of the unstreamed reply's block — and a tool_use block gets the `input` its
    `input_json_delta`s spell."""

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            self._message = dict(event["message"])
            usage = self._message.get("usage")
            self._usage = dict(usage) if isinstance(usage, Mapping) else {}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            block = dict(event["content_block"])
            self._blocks[_index(event, len(self._blocks))] = block
            opened = block.get("type")
            if opened == "tool_use":
                self._start("call")
            elif opened not in ("text", "thinking") or block.get("text") or block.get("thinking"):
                self._start("text")  # redacted thinking, server tools' blocks: content as they open
        elif kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            self._delta(_index(event, 0), event["delta"])
        elif kind == "content_block_stop":
            self._close(_index(event, 0))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self._message.update(delta)
            usage = event.get("usage")
            if isinstance(usage, Mapping):  # cumulative figures: later ones win
                self._usage.update({k: v for k, v in usage.items() if v is not None})

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text", "")) + str(delta.get("text", ""))
            if delta.get("text"):
                self._start("text")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking", "")) + str(delta.get("thinking", ""))
            if delta.get("thinking"):
                self._start("text")
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature", "")) + str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
            if block.get("type") == "tool_use":
                self._start("call")
        elif kind == "citations_delta" and "citation" in delta:
            citations = block.get("citations")
            block["citations"] = [
                *(citations if isinstance(citations, list) else ()),
                delta["citation"],
            ]

    def _close(self, index: int) -> None:
        parts = self._json.pop(index, None)
        if parts and "".join(parts).strip() and index in self._blocks:
            self._blocks[index]["input"] = json_object("".join(parts))

    def reply(self) -> dict[str, Any]:
        for index in list(self._json):
            self._close(index)
        message = {
            "id": "",
            "type": "message",
            "role": "assistant",
            "model": "",
            **self._message,
            "content": [self._blocks[index] for index in sorted(self._blocks)],
        }
        message.setdefault("stop_reason", None)
        message.setdefault("stop_sequence", None)
        message["usage"] = dict(self._usage)
        return message


def _opened(event: Mapping[str, Any]) -> Any:
    """The type of the block a `content_block_start` opens."""
    block = event.get("content_block")
    return block.get("type") if isinstance(block, Mapping) else None


def _renumbered(event: dict[str, Any], index: int) -> dict[str, Any]:
    return event if event.get("index") == index else {**event, "index": index}


class MessagesSplice(Splice):
    """Anthropic Messages rounds as one message: a later round's `message_start` dropped, its
    content blocks numbered on from the blocks the client has (the SDKs append each new block
    and find it again by its index); a round that called brim_restore loses its tool_use
    blocks, its `message_delta` and its `message_stop`. The last round's `message_delta` gives
    that round's stop reason and the usage of every round, input included: the SDKs take the
    cumulative figures a `message_delta` reports (input, cache reads and writes, output) over
    those of `message_start`, which had the first round's alone."""

    def __init__(self, earlier: Usage | None) -> None:
        super().__init__(earlier, MESSAGES.usage, _write_event_usage)
        self._blocks = 0  # content blocks the client has
        self._at: dict[int, int] = {}  # this round's block index → the client's
        self._dropped: set[int] = set()  # this round's blocks the client does not get
        self._usage: dict[str, Any] = {}  # this round's usage: message_start's, then deltas'
        self._written = 0  # cache_creation_input_tokens of the rounds before this one

    def _calls(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "content_block_start" and _opened(event) == "tool_use"

    def _relayed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, Mapping) else None
            self._usage = dict(usage) if isinstance(usage, Mapping) else {}
            return self._plus_before(event) if not self.rounds else None
        if kind == "content_block_start":
            index = _index(event, len(self._at))
            self._at[index] = self._blocks
            self._blocks += 1
            return _renumbered(event, self._at[index])
        if kind in ("content_block_delta", "content_block_stop"):
            index = _index(event, 0)
            return _renumbered(event, self._at.get(index, index))
        if kind == "message_delta":
            self._count(event)
            if self.rounds:
                return {**event, "usage": self._summed(event.get("usage"))}
            return self._plus_before(event)
        return event

    def _count(self, event: Mapping[str, Any]) -> None:
        usage = event.get("usage")
        if isinstance(usage, Mapping):  # cumulative figures: later ones win
            self._usage.update({k: v for k, v in usage.items() if v is not None})

    def _summed(self, reported: Any) -> dict[str, Any]:
        """A later round's final usage: every round's, in Anthropic's fields."""
        total = (_usage(self._usage) or Usage()).plus(self._before)
        out = dict(reported) if isinstance(reported, Mapping) else {}
        written = whole_number(self._usage.get("cache_creation_input_tokens"))
        if written is not None or self._written:
            out["cache_creation_input_tokens"] = self._written + (written or 0)
        return _usage_written(out, total)

    def _kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "content_block_start" and _opened(event) == "tool_use":
            self._dropped.add(_index(event, -1))
            return None
        if kind in ("content_block_delta", "content_block_stop"):
            if _index(event, -1) in self._dropped:
                return None
        elif kind == "message_delta":
            self._count(event)
            return None
        elif kind in ("message_stop", "ping"):
            return None
        return self._relayed(event)

    def _next_round(self) -> None:
        self._written += whole_number(self._usage.get("cache_creation_input_tokens")) or 0
        self._at, self._dropped, self._usage = {}, set(), {}


class MessagesWire(FieldConversation, ModelInBody):
    name = "anthropic.messages"
    conversation_field = "messages"
    operation = "chat"
    dialect: Dialect = AnthropicDialect()
    serving: Mapping[str, frozenset[str]] = MappingProxyType(
        {
            "anthropic.messages": frozenset({"anthropic", "litellm"}),
            "anthropic.count_tokens": frozenset({"anthropic", "litellm"}),
        }
    )

    def owns_path(self, path: str) -> bool:
        return under(path, "/v1/messages", "/messages")

    # (`/v1/messages/count_tokens` is not here: brim counts itself where the upstream cannot)
    routes: tuple[str, ...] = ("/v1/messages", "/messages")

    def target(self, route: str, url_part: str | None) -> Target:
        return Target(self.name, "/v1/messages")

    def check(self, body: dict[str, Any]) -> RequestFacts:
        return _checked(_check_messages, body)

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        count = token_count(enc)
        tokens = PER_MESSAGE + count(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            return tokens + count(content)
        for block in content if isinstance(content, list) else ():
            tokens += _block_tokens(block, count)
        return tokens

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping)]
        tokens = sum(
            counter.text(
                as_text({k: v for k, v in t.items() if k != "cache_control"}), tokenizer, RAW
            )
            for t in tools
        )
        if tools:
            tokens += ANTHROPIC_TOOL_PROMPT
        return tokens + counter.text(_system_text(body.get("system")), tokenizer, RAW)

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        return None

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        tokens = ANTHROPIC_TOOL_PROMPT if body.get("tools") else 0
        for message in self.conversation(body):
            content = message.get("content") if isinstance(message, Mapping) else None
            for block in content if isinstance(content, list) else ():
                tokens += _block_bound(block)
        return tokens

    def error_body(self, error: ErrorInfo) -> bytes:
        message = error.message
        if error.refusal is not None:
            refusal = error.refusal
            # Claude Code recognises this wording and offers to compact the conversation.
            message = (
                f"prompt is too long: {refusal.tokens_in} tokens > {refusal.limit} maximum "
                f"(brim could not make it fit: {refusal.how})"
            )
        kind = ERROR_TYPES.get(error.status, "api_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        return b"event: error\ndata: " + self.error_body(error) + b"\n\n"

    def usage(self, payload: Any) -> Usage | None:
        if not isinstance(payload, Mapping):
            return None
        message = payload.get("message")  # message_start carries the message, usage inside
        if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
            return _usage(message["usage"])
        return _usage(payload.get("usage"))

    def response_model(self, payload: Any) -> str | None:
        if not isinstance(payload, Mapping):
            return None
        message = payload.get("message")  # message_start
        return model_name(message if isinstance(message, Mapping) else payload)

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        out: list[GenAiMessage] = []
        for message in items:
            if not isinstance(message, Mapping):
                continue
            parts = [p for b in _blocks(message.get("content")) if (p := _genai_block(b))]
            out.append({"role": str(message.get("role", "")), "parts": parts})
        return out

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        text = _system_text(body.get("system"))
        return [text_part(text)] if text else []

    def tool_names(self, body: Mapping[str, Any]) -> frozenset[str]:
        return named_tools(body)

    def with_tool(self, body: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
        tool = {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
        return with_tool_last(body, tool)

    def reply_calls(self, reply: Mapping[str, Any]) -> list[ToolCall]:
        return [call for _, call in _reply_calls(listed(reply.get("content")))]

    def continued(
        self,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: Sequence[ToolCall],
        results: Sequence[str],
    ) -> dict[str, Any]:
        blocks = listed(reply.get("content"))
        answered, dropped = answered_in_order(calls, results, _reply_calls(blocks))
        # Thinking blocks go back as the very objects the reply holds (their signatures sign
        # their bytes); a tool_use not answered here goes, and so does an empty text block,
        # which Anthropic refuses in a request.
        kept = [
            block
            for position, block in enumerate(blocks)
            if position not in dropped
            and not (
                isinstance(block, Mapping)
                and block.get("type") == "text"
                and not block.get("text")
                and not block.get("citations")
            )
        ]
        assistant = {"role": "assistant", "content": kept}
        answers = {
            "role": "user",
            "content": [_result_block(call.id, result) for call, result in answered],
        }
        return self.with_conversation(body, [*self.conversation(body), assistant, answers])

    def with_usage(self, reply: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        return {**reply, "usage": _usage_written(reply.get("usage"), usage)}

    def with_tool_choice_none(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {**body, "tool_choice": {"type": "none"}}

    def turn_reader(self) -> TurnReader:
        return MessagesTurnReader()

    def splice(self, earlier: Usage | None) -> Splice:
        return MessagesSplice(earlier)

    def model_call(self, model: str, system: str, text: str, max_tokens: int) -> ModelCall:
        body = {
            "model": model,
            "system": system,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        return ModelCall("/v1/messages", body, {"anthropic-version": ANTHROPIC_VERSION})

    def reply_text(self, reply: Mapping[str, Any]) -> str:
        return text_of(reply.get("content"))  # text blocks; thinking blocks have no `text`


def _write_event_usage(event: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """Usage back where `usage` read it: inside `message_start`'s message, else at the top."""
    message = event.get("message")
    if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
        return {**event, "message": {**message, "usage": _usage_written(message["usage"], usage)}}
    return {**event, "usage": _usage_written(event.get("usage"), usage)}


def _block_tokens(block: Any, count: Callable[[Any], int]) -> int:
    if not isinstance(block, Mapping):
        return count(block)
    kind = block.get("type")
    if kind == "text":
        return count(block.get("text"))
    if kind == "image":
        return anthropic_image_tokens(block.get("source"))
    if kind == "document":
        source = block.get("source")
        if isinstance(source, Mapping) and source.get("type") == "text":
            return count(source.get("data"))
        return pdf_tokens(source)
    if kind == "tool_use":
        return PER_TOOL_CALL + count(block.get("name")) + count(block.get("input"))
    if kind == "tool_result":
        inner = block.get("content")
        parts = [{"type": "text", "text": inner}] if isinstance(inner, str) else inner or []
        return PER_TOOL_CALL + sum(_block_tokens(p, count) for p in parts)
    if kind == "thinking":
        return count(block.get("thinking"))
    if kind == "redacted_thinking":
        return len(str(block.get("data", ""))) // 4
    return count({k: v for k, v in block.items() if k != "cache_control"})


def _block_bound(block: Any) -> int:
    """What a block can count beyond its bytes (images and PDF pages, and fixed overheads),
    including blocks nested in a tool result."""
    if not isinstance(block, Mapping):
        return 0
    kind = block.get("type")
    if kind == "image":
        return ANTHROPIC_MAX_IMAGE_TOKENS
    if kind == "document":
        source = block.get("source")
        text = isinstance(source, Mapping) and source.get("type") == "text"
        return 0 if text else pdf_tokens(source)
    if kind == "tool_use":
        return PER_TOOL_CALL
    if kind == "tool_result":
        inner = block.get("content")
        nested = inner if isinstance(inner, list) else ()
        return PER_TOOL_CALL + sum(_block_bound(part) for part in nested)
    return 0


MESSAGES = MessagesWire()
