"""OpenAI Chat Completions (`POST /v1/chat/completions`): the conversation is `messages`.

Counting follows OpenAI's published accounting for chat models:

    request  = Σ message + tool definitions + response_format schema + 3 (reply priming)
    message  = 3 + tokens(role) + tokens(content) [+ tokens(name) + 1]
               + Σ tool call: 3 + tokens(id) + tokens(name) + tokens(arguments)
               + tokens(tool_call_id) + tokens(reasoning_content) + tokens(refusal)
    content  = a string, or Σ parts: text → tokens(text); image_url → the tile rule in
               `policies.images`; any other part → tokens of its JSON
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

import orjson
from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
)
from typing_extensions import TypedDict

from brim.policies.conversation import Dialect, ToolResult, Unit
from brim.policies.images import MAX_IMAGE_TOKENS, image_tokens
from brim.policies.tokens import (
    PER_MESSAGE,
    PER_NAME,
    PER_TOOL_CALL,
    RAW,
    as_text,
    token_count,
    tool_definitions_bound,
)
from brim.policies.wires.base import (
    NO_RESULT,
    UNIT_KINDS,
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
    first_of,
    first_of_each,
    image_part,
    json_object,
    largest_part_text,
    lenient_json,
    listed,
    model_name,
    param_path,
    repeats,
    role_of,
    text_of,
    text_part,
    under,
    whole_number,
    with_part_text,
    with_tool_last,
)

if TYPE_CHECKING:
    import tiktoken

    from brim.policies.tokens import TokenCounter


def _call_id(call: Any) -> str | None:
    if type(call) is not dict and not isinstance(call, Mapping):  # parsed JSON: no abc check
        return None
    return str(call["id"]) if call.get("id") is not None else None


class ChatDialect:
    """`tool_calls[].id` on assistant messages, answered by the `tool` messages
    (`tool_call_id`) that immediately follow. Leading system/developer messages are the system
    prompt; brim's notices are system messages too."""

    name = "openai.chat"

    role = staticmethod(role_of)

    def calls(self, message: Any) -> list[str]:
        if self.role(message) != "assistant":
            return []
        return [i for call in message.get("tool_calls") or () if (i := _call_id(call)) is not None]

    def call_arguments(self, message: Any) -> list[tuple[str, Any]]:
        """(id, `function.arguments` parsed from their JSON text) for each call `calls` lists."""
        if role_of(message) != "assistant":  # most messages: no calls to read
            return []
        found: list[tuple[str, Any]] = []
        for call in message.get("tool_calls") or ():
            if (call_id := _call_id(call)) is None:
                continue
            function = call.get("function")
            is_mapping = type(function) is dict or isinstance(function, Mapping)
            arguments = function.get("arguments") if is_mapping else None
            found.append((call_id, lenient_json(arguments)))
        return found

    def units(self, messages: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        roles = list(map(role_of, messages))  # each message's role, read once
        count = len(roles)
        index = 0
        while index < count:
            role = roles[index]
            if role == "assistant" and self.calls(messages[index]):
                end = index + 1
                while end < count and roles[end] == "tool":
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            units.append(Unit(UNIT_KINDS.get(role, "user"), index, index + 1))
            index += 1
        return units

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        for message in messages:
            if self.role(message) != "assistant":
                continue
            for call in message.get("tool_calls") or ():
                if isinstance(call, Mapping) and call.get("id") is not None:
                    function = call.get("function") or {}
                    names[str(call["id"])] = str(function.get("name") or "tool")
        return names

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if self.role(message) != "tool":
            return []
        call_id = str(message.get("tool_call_id", ""))
        text = text_of(message.get("content"))
        return [ToolResult(call_id, tools_by_call.get(call_id, "tool"), text)]

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any:
        return {**message, "content": text}

    def text(self, message: Any) -> str:
        return text_of(message.get("content")) if isinstance(message, Mapping) else ""

    def largest_text(self, message: Any) -> str | None:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            return content
        return largest_part_text(content) if isinstance(content, list) else None

    def with_largest_text(self, message: Any, text: str) -> Any:
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": text}
        return {**message, "content": with_part_text(content, self.largest_text(message), text)}

    def notice(self, text: str) -> Any:
        return {"role": "system", "content": text}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def violations(self, messages: Sequence[Any]) -> list[str]:
        """Where `messages` break the pairing rules OpenAI enforces (empty: none)."""
        problems: list[str] = []
        pending: list[str] = []
        answered: set[str] = set()
        in_group = False
        for index, message in enumerate(messages):
            role = role_of(message)
            if role == "tool":
                call_id = str(message.get("tool_call_id", ""))
                if not in_group or call_id not in pending:
                    reason = "answered already" if call_id in answered else "answers no open call"
                    problems.append(f"messages[{index}]: tool result {call_id!r} {reason}")
                else:
                    pending.remove(call_id)
                    answered.add(call_id)
                continue
            if pending:
                problems.append(f"messages[{index}]: tool calls {pending} have no result")
            calls = self.calls(message) if role == "assistant" else []
            if not calls:  # most messages: nothing open after them
                pending, in_group = [], False
                if answered:
                    answered = set()
                continue
            if repeated := repeats(calls):
                problems.append(f"messages[{index}]: tool call ids {repeated} repeat")
            pending, answered, in_group = list(dict.fromkeys(calls)), set(), True
        if pending:
            problems.append(f"end of messages: tool calls {pending} have no result")
        return problems

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """The smallest change that makes the pairing valid: orphan or duplicate results are
        dropped, a call repeating an id in its message is dropped, unanswered calls get a short
        placeholder result. Returns what was done."""
        out: list[Any] = []
        done: list[str] = []
        pending: list[str] = []
        in_group = False

        def close() -> None:
            for call_id in pending:
                out.append(self.placeholder_result(call_id))
                done.append(f"added a result for unanswered call {call_id!r}")
            pending.clear()

        for message in messages:
            role = self.role(message)
            if role == "tool":
                call_id = str(message.get("tool_call_id", ""))
                if in_group and call_id in pending:
                    pending.remove(call_id)
                    out.append(message)
                else:
                    done.append(f"dropped tool result {call_id!r} that answers no open call")
                continue
            close()
            calls = self.calls(message)
            if repeated := repeats(calls):
                message = {**message, "tool_calls": first_of_each(message["tool_calls"], _call_id)}
                done.append(f"dropped repeated tool calls {repeated}")
            pending, in_group = list(dict.fromkeys(calls)), bool(calls)
            out.append(message)
        close()
        return out, done


# Body checks -------------------------------------------------------------------------------


def _content_shape(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, dict) for part in value):
        return value
    raise ValueError("content must be a string, an array of content parts, or null")


class _FunctionCall(TypedDict):
    name: StrictStr
    arguments: StrictStr


class _ToolCall(TypedDict):
    id: StrictStr
    type: NotRequired[StrictStr]
    function: NotRequired[_FunctionCall | None]


class _ChatMessage(TypedDict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: NotRequired[Annotated[Any, AfterValidator(_content_shape)]]
    name: NotRequired[StrictStr | None]
    tool_calls: NotRequired[list[_ToolCall] | None]
    tool_call_id: NotRequired[StrictStr | None]


class _ChatRequest(TypedDict):
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[_ChatMessage], Field(min_length=1)]
    stream: NotRequired[StrictBool | None]
    max_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]
    max_completion_tokens: NotRequired[Annotated[int, Field(ge=1)] | None]


_check_chat = body_check(_ChatRequest)


# Errors ------------------------------------------------------------------------------------


def openai_error(error: ErrorInfo) -> dict[str, Any]:
    """OpenAI's error object (the value of a reply's `error`), shared by Chat Completions and
    Responses."""
    message = error.message if error.refusal is None else error.refusal.openai_message()
    return {"message": message, "type": error.error_type, "param": error.param, "code": error.code}


def openai_error_body(error: ErrorInfo) -> bytes:
    return orjson.dumps({"error": openai_error(error)})


def openai_body_error(exc: ValidationError) -> BodyError:
    """A failed body check in OpenAI's wording (Chat Completions and Responses)."""
    location, kind, message = first_error(exc)
    param = param_path(location)
    if kind == "missing":
        return BodyError(f"Missing required parameter '{param}'.", param)
    return BodyError(f"Invalid value for '{param}': {message}.", param)


def _definitions(body: Mapping[str, Any]) -> list[Any]:
    """Tool definitions: `tools`, and the deprecated `functions`."""
    tools, functions = body.get("tools"), body.get("functions")
    if not functions:  # the common case: one list or none
        return list(tools) if tools else []
    return list(tools or []) + list(functions)


def openai_usage(usage: Any) -> Usage | None:
    """`usage` of Chat Completions (prompt/completion tokens) or Responses (input/output)."""
    if not isinstance(usage, Mapping):
        return None
    # Read on every reply (a stream's: every usage chunk), so with as few calls as can be.
    prompt = "prompt_tokens" in usage
    given = usage.get("prompt_tokens" if prompt else "input_tokens")
    taken = usage.get("completion_tokens" if "completion_tokens" in usage else "output_tokens")
    details = usage.get("prompt_tokens_details" if prompt else "input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Usage(
        given if type(given) is int else whole_number(given),
        taken if type(taken) is int else whole_number(taken),
        cached if type(cached) is int else whole_number(cached),
    )


def openai_usage_written(existing: Any, usage: Usage, *, responses: bool) -> dict[str, Any]:
    """`existing` (a `usage` object, or None) with `usage` written into it in Chat Completions'
    fields (`prompt_tokens`, …) or, with `responses`, the Responses API's (`input_tokens`, …);
    None fields of `usage` leave the figure as it was. The total follows."""
    prompt, completion, details = (
        ("input_tokens", "output_tokens", "input_tokens_details")
        if responses
        else ("prompt_tokens", "completion_tokens", "prompt_tokens_details")
    )
    out: dict[str, Any] = dict(existing) if isinstance(existing, Mapping) else {}
    if usage.input is not None:
        out[prompt] = usage.input
    if usage.output is not None:
        out[completion] = usage.output
    if usage.cached_input is not None:
        found = out.get(details)
        out[details] = {
            **(found if isinstance(found, Mapping) else {}),
            "cached_tokens": usage.cached_input,
        }
    into, out_of = whole_number(out.get(prompt)), whole_number(out.get(completion))
    if into is not None and out_of is not None:
        out["total_tokens"] = into + out_of
    return out


def _tool_call_part(call: Any) -> dict[str, Any]:
    function = call.get("function") or {} if isinstance(call, Mapping) else {}
    return {
        "type": "tool_call",
        "id": call.get("id") if isinstance(call, Mapping) else None,
        "name": function.get("name"),
        "arguments": function.get("arguments"),
    }


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [text_part(content)] if content else []
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, Mapping):
            continue
        if isinstance(part.get("text"), str):
            parts.append(text_part(part["text"]))
        elif part.get("type") == "image_url" and isinstance(part.get("image_url"), Mapping):
            url = str(part["image_url"].get("url", ""))
            parts.append(image_part(url))
        else:
            parts.append({"type": str(part.get("type", "unknown"))})
    return parts


# Tools brim answers itself --------------------------------------------------------------------


def _reply_message(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    message = first_of(reply.get("choices")).get("message")
    return message if isinstance(message, Mapping) else {}


def _as_tool_call(call: Any) -> ToolCall | None:
    """A `tool_calls` entry as a `ToolCall`: a function call, or a custom tool's call (its
    free-form `input` as the argument `input`)."""
    if not isinstance(call, Mapping) or call.get("id") is None:
        return None
    if isinstance(call.get("custom"), Mapping):
        custom = call["custom"]
        return ToolCall(
            str(call["id"]), str(custom.get("name", "")), {"input": custom.get("input")}
        )
    function = call.get("function")
    if not isinstance(function, Mapping):
        return None
    return ToolCall(
        str(call["id"]), str(function.get("name", "")), json_object(function.get("arguments"))
    )


def _reply_calls(entries: Sequence[Any]) -> list[tuple[int, ToolCall]]:
    """(position, call) for each of a reply's `tool_calls` entries that is a call, parsed once."""
    return [
        (position, call)
        for position, entry in enumerate(entries)
        if (call := _as_tool_call(entry)) is not None
    ]


# Fields of a reply's message that a request's assistant message does not take.
_REPLY_ONLY = frozenset({"annotations"})
_NULL_DROPPED = frozenset({"refusal", "audio", "function_call", "tool_calls"})

# Text a streamed delta carries: the reply's text, reasoning (DeepSeek, vLLM: `reasoning_content`;
# OpenRouter, Ollama: `reasoning`) and a refusal.
_DELTA_TEXTS = ("content", "reasoning_content", "reasoning", "refusal")


class ChatTurnReader(TurnReader):
    """`chat.completion.chunk` events into one `chat.completion`: the deltas' texts joined,
    tool calls assembled by their `index` (name set, arguments appended, as OpenAI's SDKs do),
    the finish reason, and the usage chunk (`stream_options.include_usage`). Only choice 0."""

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._texts: dict[str, list[str]] = {}
        self._calls: list[dict[str, Any]] = []
        self._slots: dict[int, int] = {}  # a delta's tool call `index` → its place in _calls
        self._finish: Any = None
        self._usage: Any = None

    def _event(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if chunk.get(key) is not None:
                self._envelope.setdefault(key, chunk[key])
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta")
        delta = delta if isinstance(delta, Mapping) else {}
        for field in _DELTA_TEXTS:
            text = delta.get(field)
            if isinstance(text, str) and text:
                self._texts.setdefault(field, []).append(text)
                self._start("text")
        for call in delta.get("tool_calls") or ():
            if isinstance(call, Mapping):
                self._call(call)
                self._start("call")
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]

    def _call(self, delta: Mapping[str, Any]) -> None:
        index = delta.get("index")
        index = index if isinstance(index, int) else len(self._slots)
        slot = self._slots.get(index)
        new_id = delta.get("id")
        if slot is not None and new_id and self._calls[slot]["id"] not in ("", new_id):
            slot = None  # a provider that reuses the index for a new call (it sends a new id)
        if slot is None:
            slot = len(self._calls)
            self._slots[index] = slot
            self._calls.append(
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
        call = self._calls[slot]
        if new_id:
            call["id"] = str(new_id)
        if delta.get("type"):
            call["type"] = delta["type"]
        function = delta.get("function")
        if isinstance(function, Mapping):
            if function.get("name"):
                call["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]

    def reply(self) -> dict[str, Any]:
        content = self._texts.get("content")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(content) if content else None,
        }
        for field in _DELTA_TEXTS[1:]:
            if field in self._texts:
                message[field] = "".join(self._texts[field])
        if self._calls:
            message["tool_calls"] = [
                {**call, "function": dict(call["function"])} for call in self._calls
            ]
        reply: dict[str, Any] = {
            "id": self._envelope.get("id", ""),
            "object": "chat.completion",
            "created": self._envelope.get("created", 0),
            "model": self._envelope.get("model", ""),
        }
        for key in ("system_fingerprint", "service_tier"):
            if key in self._envelope:
                reply[key] = self._envelope[key]
        reply["choices"] = [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish}
        ]
        if self._usage is not None:
            reply["usage"] = self._usage
        return reply


# The envelope every chunk of one completion shares.
_ENVELOPE = ("id", "created", "model")
_CALL_DELTAS = ("tool_calls", "function_call")


def _delta_of(choice: Any) -> Mapping[str, Any]:
    delta = choice.get("delta") if isinstance(choice, Mapping) else None
    return delta if isinstance(delta, Mapping) else {}


def _carries(choice: Any) -> bool:
    """Whether a chunk's choice says anything: a delta value or a finish reason."""
    return isinstance(choice, Mapping) and (
        choice.get("finish_reason") is not None
        or any(value not in (None, "", [], {}) for value in _delta_of(choice).values())
    )


class ChatSplice(Splice):
    """Chat Completions rounds as one `chat.completion.chunk` stream: every chunk under the
    first round's `id`, `created` and `model`, so the SDKs see one completion; a later round's
    role-only opener dropped and its `role` taken out (the SDKs' accumulators append a repeated
    role to the first); a round that called brim_restore loses its tool-call deltas, its finish
    reason, its usage chunk and its `[DONE]`; the usage chunk of the last round (the client
    asked for one with `stream_options.include_usage`) adds every earlier round's."""

    def __init__(self, earlier: Usage | None) -> None:
        super().__init__(earlier, CHAT.usage, CHAT.with_usage)
        self._envelope: dict[str, Any] = {}

    def _calls(self, event: dict[str, Any]) -> bool:
        return any(
            _delta_of(choice).get(field)
            for choice in listed(event.get("choices"))
            for field in _CALL_DELTAS
        )

    def _relayed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        if not self._envelope:
            self._envelope = {key: event[key] for key in _ENVELOPE if key in event}
        out: dict[str, Any] | None = event
        if self.rounds:
            out = self._continuing(event)
        return None if out is None else self._plus_before(out)

    def _continuing(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """A later round's chunk under the first round's envelope, without a role."""
        choices = [
            {**choice, "delta": {k: v for k, v in _delta_of(choice).items() if k != "role"}}
            if "role" in _delta_of(choice)
            else choice
            for choice in listed(chunk.get("choices"))
        ]
        if not any(_carries(c) for c in choices) and not isinstance(chunk.get("usage"), Mapping):
            return None  # the role-only opener, or a chunk that says nothing
        out = {**chunk, **{k: v for k, v in self._envelope.items() if k in chunk}}
        if "choices" in chunk:
            out["choices"] = choices
        return chunk if out == chunk else out

    def _kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        choices = [
            {
                **choice,
                "delta": {k: v for k, v in _delta_of(choice).items() if k not in _CALL_DELTAS},
                "finish_reason": None,
            }
            for choice in listed(event.get("choices"))
            if isinstance(choice, Mapping)
        ]
        if not any(_carries(choice) for choice in choices):
            return None  # calls, the finish, the usage chunk: the next round says them
        return self._relayed({**event, "choices": choices, "usage": None})

    def _next_round(self) -> None:
        """Nothing numbers this API's chunks."""


class ChatWire(FieldConversation, ModelInBody):
    name = "openai.chat"
    conversation_field = "messages"
    operation = "chat"
    dialect: Dialect = ChatDialect()
    serving: Mapping[str, frozenset[str]] = MappingProxyType(
        {
            "openai.chat": frozenset({"openai", "litellm", "cli"}),
            "openai.models": frozenset({"openai"}),
        }
    )

    def owns_path(self, path: str) -> bool:
        return under(path, "/v1/chat/completions", "/chat/completions")

    routes: tuple[str, ...] = ("/v1/chat/completions", "/chat/completions")

    def target(self, route: str, url_part: str | None) -> Target:
        return Target(self.name, "/chat/completions")

    def check(self, body: dict[str, Any]) -> RequestFacts:
        try:
            request: _ChatRequest = _check_chat(body)
        except ValidationError as exc:
            raise openai_body_error(exc) from None
        for index, message in enumerate(request["messages"]):
            if message["role"] == "tool" and not message.get("tool_call_id"):
                param = f"messages[{index}].tool_call_id"
                raise BodyError(
                    f"Missing required parameter '{param}': a tool message answers a tool call id.",
                    param,
                )
        return RequestFacts(model=request["model"], stream=bool(request.get("stream")))

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        count = token_count(enc)
        tokens = PER_MESSAGE + count(message.get("role"))
        if message.get("name"):
            tokens += count(message["name"]) + PER_NAME
        tokens += _content_tokens(message.get("content"), enc, model)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {} if isinstance(call, Mapping) else {}
            tokens += PER_TOOL_CALL + count(call.get("id") if isinstance(call, Mapping) else call)
            tokens += count(function.get("name")) + count(function.get("arguments"))
        legacy_call = message.get("function_call")
        if isinstance(legacy_call, Mapping):
            tokens += PER_TOOL_CALL + count(legacy_call.get("name"))
            tokens += count(legacy_call.get("arguments"))
        for field in ("tool_call_id", "reasoning_content", "refusal"):
            tokens += count(message.get(field))
        return tokens

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        definitions = _definitions(body)
        return counter.tools(definitions, tokenizer, RAW) if definitions else 0

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
            return response_format.get("json_schema")
        return None

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        tokens = 0
        for message in self.conversation(body):
            if not isinstance(message, Mapping):
                continue
            tokens += PER_TOOL_CALL * len(message.get("tool_calls") or ())
            tokens += PER_TOOL_CALL if message.get("function_call") else 0
            content = message.get("content")
            for part in content if isinstance(content, list) else ():
                if isinstance(part, Mapping) and part.get("type") == "image_url":
                    tokens += MAX_IMAGE_TOKENS
        definitions = _definitions(body)
        return tokens + tool_definitions_bound(definitions) if definitions else tokens

    def error_body(self, error: ErrorInfo) -> bytes:
        return openai_error_body(error)

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        return b"data: " + openai_error_body(error) + b"\n\n"

    def usage(self, payload: Any) -> Usage | None:
        return openai_usage(payload.get("usage")) if isinstance(payload, Mapping) else None

    def response_model(self, payload: Any) -> str | None:
        return model_name(payload)

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        out: list[GenAiMessage] = []
        for message in items:
            if not isinstance(message, Mapping):
                continue
            role = str(message.get("role", ""))
            if role == "tool":
                response = {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": text_of(message.get("content")),
                }
                out.append({"role": "tool", "parts": [response]})
                continue
            parts = _content_parts(message.get("content"))
            parts += [_tool_call_part(call) for call in message.get("tool_calls") or ()]
            out.append({"role": "system" if role == "developer" else role, "parts": parts})
        return out

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        return []  # Chat Completions keeps its system prompt among the messages

    def tool_names(self, body: Mapping[str, Any]) -> frozenset[str]:
        names: set[str] = set()
        for tool in _definitions(body):
            if not isinstance(tool, Mapping):
                continue
            inner = tool.get("function") or tool.get("custom") or tool  # `functions`: flat
            if isinstance(inner, Mapping) and isinstance(inner.get("name"), str):
                names.add(inner["name"])
        return frozenset(names)

    def with_tool(self, body: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
        tool = {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        return with_tool_last(body, tool)

    def reply_calls(self, reply: Mapping[str, Any]) -> list[ToolCall]:
        return [call for _, call in _reply_calls(listed(_reply_message(reply).get("tool_calls")))]

    def continued(
        self,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: Sequence[ToolCall],
        results: Sequence[str],
    ) -> dict[str, Any]:
        message = _reply_message(reply)
        entries = listed(message.get("tool_calls"))
        made = _reply_calls(entries)
        answered, dropped = answered_in_order(calls, results, made)
        assistant = {
            key: value
            for key, value in message.items()
            if key not in _REPLY_ONLY and not (key in _NULL_DROPPED and value is None)
        }
        assistant["role"] = "assistant"
        audio = assistant.get("audio")
        if isinstance(audio, Mapping) and audio.get("id") is not None:
            assistant["audio"] = {"id": audio["id"]}  # a request names a reply's audio by id
        kept = [entries[position] for position, _ in made if position not in dropped]
        if kept:
            assistant["tool_calls"] = kept
        else:
            assistant.pop("tool_calls", None)
        results_out = [
            {"role": "tool", "tool_call_id": call.id, "content": result}
            for call, result in answered
        ]
        return self.with_conversation(body, [*self.conversation(body), assistant, *results_out])

    def with_usage(self, reply: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        return {**reply, "usage": openai_usage_written(reply.get("usage"), usage, responses=False)}

    def with_tool_choice_none(self, body: Mapping[str, Any]) -> dict[str, Any]:
        # OpenAI refuses `tool_choice` in a request without `tools`: there is nothing to turn off.
        if not body.get("tools"):
            return dict(body)
        return {**body, "tool_choice": "none"}

    def turn_reader(self) -> TurnReader:
        return ChatTurnReader()

    def splice(self, earlier: Usage | None) -> Splice:
        return ChatSplice(earlier)

    def model_call(self, model: str, system: str, text: str, max_tokens: int) -> ModelCall:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        return ModelCall("/chat/completions", body, {})

    def reply_text(self, reply: Mapping[str, Any]) -> str:
        return text_of(_reply_message(reply).get("content"))


def _content_tokens(content: Any, enc: tiktoken.Encoding, model: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(enc.encode_ordinary(content))
    tokens = 0
    for part in content if isinstance(content, list) else [content]:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            tokens += len(enc.encode_ordinary(part["text"]))
        elif kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            image = part["image_url"]
            tokens += image_tokens(str(image.get("url", "")), image.get("detail"), model)
        else:
            tokens += len(enc.encode_ordinary(as_text(part)))
    return tokens


CHAT = ChatWire()
