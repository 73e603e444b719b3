"""OpenAI Responses (`POST /v1/responses`, Codex CLI): the conversation is the `input` items;
`instructions` and `tools` are fixed cost.

Counting: every item costs 3 tokens plus its text — message text parts, images by OpenAI's tile
rule, function call names, arguments and ids, tool outputs, reasoning summaries (encrypted
reasoning at a quarter of its length).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

import orjson
from pydantic import Field, StrictBool, StrictStr, ValidationError
from typing_extensions import TypedDict

from brim.policies.conversation import Dialect, ToolResult, Unit
from brim.policies.images import MAX_IMAGE_TOKENS, image_tokens
from brim.policies.tokens import PER_MESSAGE, RAW, token_count, tool_definitions_bound
from brim.policies.wires.base import (
    NO_RESULT,
    UNIT_KINDS,
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
    image_part,
    json_object,
    largest_part_text,
    lenient_json,
    listed,
    model_name,
    named_tools,
    text_of,
    text_part,
    under,
    with_part_text,
    with_tool_last,
)
from brim.policies.wires.chat import (
    openai_body_error,
    openai_error,
    openai_error_body,
    openai_usage,
    openai_usage_written,
)

if TYPE_CHECKING:
    import tiktoken

    from brim.policies.tokens import TokenCounter


CALL_TYPES = {"function_call", "custom_tool_call", "local_shell_call"}
OUTPUT_OF = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
}
OUTPUT_TYPES = set(OUTPUT_OF.values())
MIN_OUTPUT_TOKENS = 16  # the least `max_output_tokens` the Responses API takes


def _kind(item: Any) -> str:
    if not isinstance(item, Mapping):
        return ""
    return str(item.get("type") or ("message" if "role" in item else ""))


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping):
        return str(output.get("output") or output.get("text") or "")
    return text_of(output)


class ResponsesDialect:
    """OpenAI Responses `input` items: `function_call` (and custom / local shell calls) answered
    by the output item with the same `call_id`, somewhere later; a calling block (reasoning items
    and calls) with the outputs that follow is one unit. `reasoning` items — `encrypted_content`
    never touched — stay with the item after them. `instructions` is fixed cost."""

    name = "openai.responses"

    def role(self, item: Any) -> str:
        kind = _kind(item)
        if kind == "message":
            return str(item.get("role", "user"))
        if kind in OUTPUT_TYPES:
            return "tool"
        return "assistant" if kind in CALL_TYPES or kind == "reasoning" else kind

    def calls(self, item: Any) -> list[str]:
        return [str(item.get("call_id"))] if _kind(item) in CALL_TYPES else []

    def call_arguments(self, item: Any) -> list[tuple[str, Any]]:
        """(call id, arguments): a `function_call`'s `arguments` parsed from their JSON text, a
        custom tool call's `input`, a local shell call's `action`."""
        kind = _kind(item)
        if kind not in CALL_TYPES:
            return []
        field = {"function_call": "arguments", "custom_tool_call": "input"}.get(kind, "action")
        arguments = item.get(field)
        if kind == "function_call":
            arguments = lenient_json(arguments)
        return [(str(item.get("call_id")), arguments)]

    def answers(self, item: Any) -> list[str]:
        return [str(item.get("call_id"))] if _kind(item) in OUTPUT_TYPES else []

    def units(self, items: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(items):
            kind = _kind(items[index])
            if kind in ("reasoning", *CALL_TYPES):
                end = index
                while end < len(items) and _kind(items[end]) in ("reasoning", *CALL_TYPES):
                    end += 1
                has_calls = any(_kind(items[i]) in CALL_TYPES for i in range(index, end))
                if not has_calls:  # reasoning before a message: kept (or dropped) together
                    end = min(end + 1, len(items))
                    units.append(Unit("assistant", index, end))
                    index = end
                    continue
                while end < len(items) and _kind(items[end]) in OUTPUT_TYPES:
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            role = self.role(items[index])
            units.append(Unit(UNIT_KINDS.get(role, "assistant"), index, index + 1))
            index += 1
        return units

    def tools_by_call(self, items: Sequence[Any]) -> dict[str, str]:
        return {
            str(item.get("call_id")): str(item.get("name") or _kind(item))
            for item in items
            if _kind(item) in CALL_TYPES
        }

    def tool_results(self, item: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if _kind(item) not in OUTPUT_TYPES:
            return []
        call_id = str(item.get("call_id"))
        return [
            ToolResult(
                call_id, tools_by_call.get(call_id, "tool"), _output_text(item.get("output"))
            )
        ]

    def with_tool_result(self, item: Any, call_id: str, text: str) -> Any:
        return {**item, "output": text}

    def text(self, item: Any) -> str:
        return text_of(item.get("content")) if _kind(item) == "message" else ""

    def largest_text(self, item: Any) -> str | None:
        kind = _kind(item)
        if kind in OUTPUT_TYPES:
            return _output_text(item.get("output")) or None
        if kind != "message":
            return None
        content = item.get("content")
        if isinstance(content, str):
            return content
        return largest_part_text(content) if isinstance(content, list) else None

    def with_largest_text(self, item: Any, text: str) -> Any:
        if _kind(item) in OUTPUT_TYPES:
            return {**item, "output": text}
        content = item.get("content")
        if isinstance(content, str):
            return {**item, "content": text}
        return {**item, "content": with_part_text(content, self.largest_text(item), text)}

    def notice(self, text: str) -> Any:
        return {"type": "message", "role": "developer", "content": text}

    def placeholder_result(
        self, call_id: str, text: str = NO_RESULT, kind: str = "function_call"
    ) -> Any:
        return {
            "type": OUTPUT_OF.get(kind, "function_call_output"),
            "call_id": call_id,
            "output": text,
        }

    def violations(self, items: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        called: dict[str, int] = {}
        answered: set[str] = set()
        for index, item in enumerate(items):
            for call_id in self.calls(item):
                called[call_id] = index
            for call_id in self.answers(item):
                if call_id not in called:
                    problems.append(f"input[{index}]: output for {call_id!r} has no earlier call")
                elif call_id in answered:
                    problems.append(f"input[{index}]: {call_id!r} is answered twice")
                answered.add(call_id)
        for call_id, index in called.items():
            if call_id not in answered:
                problems.append(f"input[{index}]: no tool output found for call {call_id!r}")
        return problems

    def repaired(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Outputs with no earlier call are dropped; a call with no output gets a placeholder
        right after its calling block."""
        answered = {c for item in items for c in self.answers(item)}
        out: list[Any] = []
        done: list[str] = []
        called: set[str] = set()
        seen: set[str] = set()
        pending: list[tuple[str, str]] = []
        for item in items:
            kind = _kind(item)
            if kind not in ("reasoning", *CALL_TYPES, *OUTPUT_TYPES) and pending:
                out += [self.placeholder_result(c, kind=k) for c, k in pending]
                done += [f"added an output for call {c!r}" for c, _ in pending]
                pending = []
            if kind in OUTPUT_TYPES:
                call_id = str(item.get("call_id"))
                if call_id not in called or call_id in seen:
                    done.append(f"dropped an output for {call_id!r} that answers no earlier call")
                    continue
                seen.add(call_id)
            for call_id in self.calls(item):
                called.add(call_id)
                if call_id not in answered:
                    pending.append((call_id, kind))
            out.append(item)
        out += [self.placeholder_result(c, kind=k) for c, k in pending]
        done += [f"added an output for call {c!r}" for c, _ in pending]
        return out, done


class _ResponsesRequest(TypedDict):
    model: Annotated[StrictStr, Field(min_length=1)]
    input: NotRequired[StrictStr | list[dict[str, Any]] | None]
    stream: NotRequired[StrictBool | None]
    max_output_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]


_check_responses = body_check(_ResponsesRequest)


SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


def _reasoning_summary(item: Mapping[str, Any]) -> str:
    return " ".join(
        str(s.get("text", "")) for s in item.get("summary") or [] if isinstance(s, Mapping)
    )


def _genai_item(item: Mapping[str, Any]) -> GenAiMessage | None:
    kind = _kind(item)
    if kind == "message":
        content = item.get("content")
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            parts.append(text_part(content))
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, Mapping):
                continue
            if isinstance(part.get("text"), str):  # input_text, output_text
                parts.append(text_part(part["text"]))
            elif part.get("type") == "input_image":
                parts.append(image_part(str(part.get("image_url") or "")))
            elif isinstance(part.get("refusal"), str):
                parts.append(text_part(part["refusal"]))
            else:
                parts.append({"type": str(part.get("type", "unknown"))})
        role = str(item.get("role", "user"))
        return {"role": "system" if role == "developer" else role, "parts": parts}
    if kind in CALL_TYPES:
        arguments = item.get("arguments", item.get("input", item.get("action")))
        call = {
            "type": "tool_call",
            "id": item.get("call_id"),
            "name": item.get("name") or kind,
            "arguments": arguments,
        }
        return {"role": "assistant", "parts": [call]}
    if kind in OUTPUT_TYPES:
        response = {
            "type": "tool_call_response",
            "id": item.get("call_id"),
            "response": _output_text(item.get("output")),
        }
        return {"role": "tool", "parts": [response]}
    if kind == "reasoning":
        reasoning = {"type": "reasoning", "content": _reasoning_summary(item)}
        return {"role": "assistant", "parts": [reasoning]}
    return None


# Tools brim answers itself --------------------------------------------------------------------


def _as_tool_call(item: Any) -> ToolCall | None:
    """A `function_call` output item (arguments parsed from their JSON text), or a custom tool
    call (its free-form `input` as the argument `input`)."""
    kind = _kind(item)
    if kind == "function_call":
        arguments = json_object(item.get("arguments"))
    elif kind == "custom_tool_call":
        arguments = {"input": item.get("input")}
    else:
        return None
    return ToolCall(str(item.get("call_id")), str(item.get("name", "")), arguments)


def _reply_calls(output: Sequence[Any]) -> list[tuple[int, ToolCall]]:
    """(position, call) for each of a reply's output items that is a call brim can answer (a
    function or custom tool call), parsed once."""
    return [
        (position, call)
        for position, item in enumerate(output)
        if (call := _as_tool_call(item)) is not None
    ]


def _definitions(body: Mapping[str, Any]) -> list[Any]:
    """The request's tool definitions (the objects among `tools`)."""
    return [tool for tool in body.get("tools") or [] if isinstance(tool, Mapping)]


def _parts_at(item: dict[str, Any], field: str, index: Any) -> dict[str, Any]:
    """The part at `index` of `item[field]` (content parts, summary parts), made if missing."""
    parts = item.get(field)
    if not isinstance(parts, list):
        parts = item[field] = []
    position = index if isinstance(index, int) and index >= 0 else max(len(parts) - 1, 0)
    while len(parts) <= position:
        parts.append({})
    if not isinstance(parts[position], dict):
        parts[position] = {}
    part: dict[str, Any] = parts[position]
    return part


def _shows_text(item: Mapping[str, Any]) -> bool:
    """Whether a message or reasoning item already holds text (its parts, or its summary)."""
    parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
    return any(
        isinstance(part, Mapping) and (part.get("text") or part.get("refusal")) for part in parts
    )


# Reasoning text deltas: the item's field, the event's index field, the part's type.
_REASONING_DELTAS = {
    "response.reasoning_text.delta": ("content", "content_index", "reasoning_text"),
    "response.reasoning_summary_text.delta": ("summary", "summary_index", "summary_text"),
}


class ResponsesTurnReader(TurnReader):
    """The Responses API's stream into one `response` object: the envelope of the last
    `response.*` event that carries one (`response.completed` has the usage, and the whole
    output), and the output items from `response.output_item.added` / `.done` with their
    deltas (text, refusal, reasoning summary and text, function call arguments, custom tool
    input) in between — used when the final event's `output` is empty."""

    def __init__(self) -> None:
        super().__init__()
        self._response: dict[str, Any] = {}
        self._items: dict[int, dict[str, Any]] = {}
        self._where: dict[str, int] = {}  # item id → output_index

    def _event(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", ""))
        if isinstance(event.get("response"), Mapping):
            self._response = dict(event["response"])
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if isinstance(item, Mapping):
                self._item(event, dict(item), done=kind.endswith("done"))
            return
        item_ = self._item_of(event)
        if item_ is None:
            return
        delta = event.get("delta")
        text = delta if isinstance(delta, str) else ""
        if kind in ("response.content_part.added", "response.reasoning_summary_part.added"):
            field = "content" if kind == "response.content_part.added" else "summary"
            index = event.get("content_index" if field == "content" else "summary_index")
            part = event.get("part")
            _parts_at(item_, field, index).update(part if isinstance(part, Mapping) else {})
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            field = "text" if kind == "response.output_text.delta" else "refusal"
            part = _parts_at(item_, "content", event.get("content_index"))
            part[field] = str(part.get(field, "")) + text
            if text:
                self._start("text")
        elif kind in _REASONING_DELTAS:
            field, index, part_type = _REASONING_DELTAS[kind]
            part = _parts_at(item_, field, event.get(index))
            part.setdefault("type", part_type)
            part["text"] = str(part.get("text", "")) + text
            if text:
                self._start("text")
        elif kind == "response.function_call_arguments.delta":
            item_["arguments"] = str(item_.get("arguments", "")) + text
            self._start("call")
        elif kind == "response.function_call_arguments.done":
            item_["arguments"] = str(event.get("arguments", item_.get("arguments", "")))
        elif kind == "response.custom_tool_call_input.delta":
            item_["input"] = str(item_.get("input", "")) + text
            self._start("call")

    def _item(self, event: Mapping[str, Any], item: dict[str, Any], *, done: bool) -> None:
        index = event.get("output_index")
        index = index if isinstance(index, int) else len(self._items)
        if done or index not in self._items:
            self._items[index] = item
        if isinstance(item.get("id"), str):
            self._where[item["id"]] = index
        kind = _kind(item)
        if kind in CALL_TYPES:
            self._start("call")
        elif kind not in ("message", "reasoning"):
            self._start("text")  # a server tool's item (web search, …): shown as it comes
        elif _shows_text(item):
            self._start("text")

    def _item_of(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        index = event.get("output_index")
        if not isinstance(index, int):
            index = self._where.get(str(event.get("item_id")))
        return self._items.get(index) if isinstance(index, int) else None

    def reply(self) -> dict[str, Any]:
        reply: dict[str, Any] = {"object": "response", **self._response}
        if not listed(reply.get("output")):
            reply["output"] = [self._items[index] for index in sorted(self._items)]
        return reply


# Events that open a response, and those that end it (each carries the `response` so far).
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})
_ENDING = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesSplice(Splice):
    """Responses API rounds as one response: every event numbered on (`sequence_number`, and
    `output_index`: the SDKs append each added item and find it again by its index) from what
    the client has; a later round's `response.created` and `.in_progress` dropped; a round that
    called brim_restore loses its call items and its `response.completed`. The last round's
    `response.completed` carries its own `id` (the response the provider stored with the
    answer, which a client's next `previous_response_id` names; the first round's holds an
    unanswered brim_restore call), the first round's `created_at`, every item the client got
    (the SDKs' final response is that event's), and the usage of every round."""

    def __init__(self, earlier: Usage | None) -> None:
        super().__init__(earlier, RESPONSES.usage, _write_event_usage)
        self._sequence: int | None = None  # the number of the next event the client gets
        self._items: dict[int, Any] = {}  # the client's output items, by their index
        self._at: dict[int, int] = {}  # this round's output_index → the client's
        self._dropped: set[int] = set()  # this round's items the client does not get
        self._head: dict[str, Any] = {}  # the first round's created_at

    def _calls(self, event: dict[str, Any]) -> bool:
        return (
            event.get("type") == "response.output_item.added"
            and _kind(event.get("item")) in CALL_TYPES
        )

    def _relayed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        response = event.get("response")
        if kind in _OPENING:
            if self.rounds:
                return None
            if not self._head and isinstance(response, Mapping):
                self._head = {k: response[k] for k in ("created_at",) if k in response}
        out = event
        index = event.get("output_index")
        if isinstance(index, int):
            if kind == "response.output_item.added":
                self._at[index] = len(self._items)
                self._items[len(self._items)] = event.get("item")
            mine = self._at.get(index, index)
            if kind == "response.output_item.done":
                self._items[mine] = event.get("item")
            if mine != index:
                out = {**out, "output_index": mine}
        if kind in _ENDING and isinstance(response, Mapping):
            if self.rounds:
                output = [self._items[i] for i in sorted(self._items)]
                out = {**out, "response": {**response, **self._head, "output": output}}
            out = self._plus_before(out)
        return self._numbered(out)

    def _numbered(self, event: dict[str, Any]) -> dict[str, Any]:
        number = event.get("sequence_number")
        if not isinstance(number, int) or isinstance(number, bool):
            return event
        mine = number if self._sequence is None else self._sequence
        self._sequence = mine + 1
        return event if number == mine else {**event, "sequence_number": mine}

    def _kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        index = event.get("output_index")
        if kind == "response.output_item.added" and _kind(event.get("item")) in CALL_TYPES:
            self._dropped.add(index if isinstance(index, int) else -1)
            return None
        if (isinstance(index, int) and index in self._dropped) or kind in _ENDING:
            return None
        return self._relayed(event)

    def _next_round(self) -> None:
        self._at, self._dropped = {}, set()


class ResponsesWire(FieldConversation, ModelInBody):
    name = "openai.responses"
    conversation_field = "input"
    operation = "chat"
    dialect: Dialect = ResponsesDialect()
    serving: Mapping[str, frozenset[str]] = MappingProxyType(
        {
            "openai.responses": frozenset({"openai"}),
            "openai.input_tokens": frozenset({"openai"}),
        }
    )

    def owns_path(self, path: str) -> bool:
        return under(path, "/v1/responses", "/responses")

    # `input_tokens`: forwarded, the provider's own count of a Responses request
    routes: tuple[str, ...] = (
        "/v1/responses",
        "/responses",
        "/v1/responses/input_tokens",
        "/responses/input_tokens",
    )

    def target(self, route: str, url_part: str | None) -> Target:
        if route.endswith("/input_tokens"):
            return Target("openai.input_tokens", "/responses/input_tokens")
        return Target(self.name, "/responses")

    def check(self, body: dict[str, Any]) -> RequestFacts:
        try:
            request: _ResponsesRequest = _check_responses(body)
        except ValidationError as exc:
            raise openai_body_error(exc) from None
        return RequestFacts(model=request["model"], stream=bool(request.get("stream")))

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        value = body.get("input")
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}]
        return list(value) if isinstance(value, list) else []

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        count = token_count(enc)
        kind = _kind(message)
        tokens = PER_MESSAGE
        if kind == "message":
            tokens += count(message.get("role"))
            content = message.get("content")
            if isinstance(content, str):
                return tokens + count(content)
            for part in content if isinstance(content, list) else ():
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") == "input_image":
                    tokens += image_tokens(
                        str(part.get("image_url") or ""), part.get("detail"), model
                    )
                else:
                    tokens += count(part.get("text") or part.get("refusal"))
            return tokens
        if kind == "reasoning":
            encrypted = len(str(message.get("encrypted_content") or "")) // 4
            return tokens + count(_reasoning_summary(message)) + encrypted
        for field in ("name", "arguments", "input", "action", "call_id", "output"):
            tokens += count(message.get(field))
        return tokens

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        fixed = counter.text(str(body.get("instructions") or ""), tokenizer, RAW)
        return fixed + counter.tools(_definitions(body), tokenizer, RAW)

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        return None

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        tokens = 0
        for item in self.conversation(body):
            content = item.get("content") if isinstance(item, Mapping) else None
            for part in content if isinstance(content, list) else ():
                if isinstance(part, Mapping) and part.get("type") == "input_image":
                    tokens += MAX_IMAGE_TOKENS
        return tokens + tool_definitions_bound(_definitions(body))

    def error_body(self, error: ErrorInfo) -> bytes:
        return openai_error_body(error)

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        numbers = SEQUENCE.findall(last_event)
        body = openai_error(error)
        event = {
            "type": "error",
            "code": body["code"],
            "message": body["message"],
            "param": body["param"],
            "sequence_number": int(numbers[-1]) + 1 if numbers else 0,
        }
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"

    def usage(self, payload: Any) -> Usage | None:
        if not isinstance(payload, Mapping):
            return None
        response = payload.get("response")  # response.completed and the other response events
        if isinstance(response, Mapping):
            return openai_usage(response.get("usage"))
        return openai_usage(payload.get("usage"))

    def response_model(self, payload: Any) -> str | None:
        if not isinstance(payload, Mapping):
            return None
        response = payload.get("response")
        return model_name(response if isinstance(response, Mapping) else payload)

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        return [m for item in items if isinstance(item, Mapping) and (m := _genai_item(item))]

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        instructions = body.get("instructions")
        return [text_part(instructions)] if isinstance(instructions, str) and instructions else []

    def tool_names(self, body: Mapping[str, Any]) -> frozenset[str]:
        return named_tools(body)

    def with_tool(self, body: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
        # The Responses API makes a function strict unless told otherwise, and a strict schema
        # must close every object and require every property: brim's tool says it is not.
        tool = {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
            "strict": False,
        }
        return with_tool_last(body, tool)

    def reply_calls(self, reply: Mapping[str, Any]) -> list[ToolCall]:
        return [call for _, call in _reply_calls(listed(reply.get("output")))]

    def continued(
        self,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: Sequence[ToolCall],
        results: Sequence[str],
    ) -> dict[str, Any]:
        output = listed(reply.get("output"))
        made = _reply_calls(output)
        answered, dropped = answered_in_order(calls, results, made)
        answered_at = {position for position, _ in made} - dropped
        stateless = body.get("store") is False
        kept = [
            item
            for position, item in enumerate(output)
            # Of the calls, only those answered here go back (a local shell call never is).
            if not (_kind(item) in CALL_TYPES and position not in answered_at)
            # Unstored reasoning can be sent back only encrypted: an id alone names nothing.
            and not (stateless and _kind(item) == "reasoning" and not item.get("encrypted_content"))
        ]
        kinds = {str(item.get("call_id")): _kind(item) for item in kept}
        outputs = [
            {
                "type": OUTPUT_OF.get(kinds.get(call.id, ""), "function_call_output"),
                "call_id": call.id,
                "output": result,
            }
            for call, result in answered
        ]
        return self.with_conversation(body, [*self.conversation(body), *kept, *outputs])

    def with_usage(self, reply: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        return {**reply, "usage": openai_usage_written(reply.get("usage"), usage, responses=True)}

    def with_tool_choice_none(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {**body, "tool_choice": "none"}

    def turn_reader(self) -> TurnReader:
        return ResponsesTurnReader()

    def splice(self, earlier: Usage | None) -> Splice:
        return ResponsesSplice(earlier)

    def model_call(self, model: str, system: str, text: str, max_tokens: int) -> ModelCall:
        # No `temperature`: the reasoning models refuse it. Not stored: nothing goes on from it.
        body = {
            "model": model,
            "instructions": system,
            "input": [{"type": "message", "role": "user", "content": text}],
            "max_output_tokens": max(MIN_OUTPUT_TOKENS, max_tokens),
            "store": False,
        }
        return ModelCall("/responses", body, {})

    def reply_text(self, reply: Mapping[str, Any]) -> str:
        return "".join(
            str(part["text"])
            for item in listed(reply.get("output"))
            if _kind(item) == "message"
            for part in listed(item.get("content"))
            if isinstance(part, Mapping)
            and part.get("type") == "output_text"
            and isinstance(part.get("text"), str)
        )


def _write_event_usage(event: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """Usage back where `usage` read it: in the event's `response`, else at the top."""
    response = event.get("response")
    if isinstance(response, Mapping):
        written = openai_usage_written(response.get("usage"), usage, responses=True)
        return {**event, "response": {**response, "usage": written}}
    return {**event, "usage": openai_usage_written(event.get("usage"), usage, responses=True)}


RESPONSES = ResponsesWire()
