"""What every wire API module provides (`Wire`), and the plain values they exchange with the
rest of brim: request facts, error facts, usage, and messages in the GenAI conventions' shape.

A wire object holds no per-request state: everything it needs comes in as arguments.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson
from pydantic import TypeAdapter, ValidationError

from brim.policies.conversation import Dialect, UnitKind
from brim.policies.records import record
from brim.policies.text import NO_RESULT as NO_RESULT  # what answers a lost call
from brim.policies.tokens import as_text  # one copy, there: `policies.tokens` imports no wire

if TYPE_CHECKING:
    import tiktoken

    from brim.policies.tokens import TokenCounter

NOTICE_PREFIX = "[brim removed "


def is_notice(dialect: Dialect, message: Any) -> bool:
    """Whether `message` is evict's notice of what a cut removed (it starts its way)."""
    return dialect.text(message).startswith(NOTICE_PREFIX)


class BodyError(ValueError):
    """A request body this wire API would refuse; `param` names the offending field in the
    API's own notation."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotServed(BodyError):
    """A URL naming something this wire API does not serve (a Gemini method brim lacks): 404."""


@record
class Target:
    """What a request's URL asks of a wire API (`Wire.target`): the endpoint (`Exchange.api`:
    the conversation's own, `Wire.name`, or e.g. a token count's), the path brim sends it to
    upstream, and — where the URL says them (Gemini) — the model and whether to stream; None:
    the body says."""

    api: str
    endpoint: str
    model: str | None = None
    stream: bool | None = None


@record
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


@record
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

    def added(self, other: Usage) -> Usage:
        """Both reports summed field by field (a field None in both stays None): the usage of
        several rounds together."""
        return Usage(
            _sum(self.input, other.input),
            _sum(self.output, other.output),
            _sum(self.cached_input, other.cached_input),
        )

    def plus(self, earlier: Usage) -> Usage:
        """This report with `earlier` added to each figure it gives; a figure it does not give
        stays None (a stream event that reports only output tokens still reports only those).
        Cached input counts as given wherever input is."""
        cached = self.cached_input
        if cached is None and self.input is not None and earlier.cached_input is not None:
            cached = 0
        return Usage(
            None if self.input is None else self.input + (earlier.input or 0),
            None if self.output is None else self.output + (earlier.output or 0),
            None if cached is None else cached + (earlier.cached_input or 0),
        )

    @property
    def empty(self) -> bool:
        return self.input is None and self.output is None and self.cached_input is None


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool brim offers the model itself (e.g. `brim_restore`); `parameters` is a JSON
    schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call in a reply: `id` pairs it with its result (for Gemini calls that carry
    no id, one made up from the call's position and name: see `GeminiWire.reply_calls`)."""

    id: str
    name: str
    arguments: dict[str, Any]


StartKind = Literal["text", "call"]


class TurnReader(ABC):
    """Reads one streamed reply, event by event, into the reply the API would have sent
    unstreamed. One reader per stream; it holds that stream's state only. Each wire API says
    what an event (a JSON object; anything else, like `[DONE]`, is skipped) adds, and calls
    `_start` where the turn's content begins."""

    def __init__(self) -> None:
        self._started: StartKind | None = None

    @property
    def started(self) -> StartKind | None:
        """What the turn's first content was: text, thinking or reasoning text ("text"), or
        a tool call ("call"); None until either came. Empty openers (a role-only chunk, an
        empty text block) are not content."""
        return self._started

    def _start(self, kind: StartKind) -> None:
        self._started = self._started or kind

    def take(self, event: dict[str, Any] | None) -> None:
        """One event already parsed (`SseEvent.json`); None (not a JSON object) adds nothing."""
        if event is not None:
            self._event(event)

    @abstractmethod
    def _event(self, event: dict[str, Any]) -> None: ...

    @abstractmethod
    def reply(self) -> dict[str, Any]:
        """The turn so far as the API's non-streamed reply JSON."""


UsageRead = Callable[[Any], Usage | None]
UsageWrite = Callable[[dict[str, Any], Usage], dict[str, Any]]


class Splice(ABC):
    """Several streamed rounds as the client's one reply: a round whose text already went to
    the client and that then called `brim_restore` is continued, after brim answered the call,
    by the next round, which the client gets as more of the same reply. One per reply; it holds
    that reply's state only.

    `feed` passes a round's events on as they come until the round's first tool-call event,
    and holds that event and every later one to the round's end. A round that called no brim
    tool: `release` passes its held events on. A round that did: `answer` passes on what the
    client still gets of them — not the tool calls (the client's own go with brim's: the model
    makes them again) and not the end of the turn — and the next round's events then go through
    `feed` as the same reply goes on: its opening dropped, its indexes and numbers going on
    from what the client has, its usage added to every earlier round's. Events are
    `SseEvents`'; an event left as it was goes on as the very same bytes.
    """

    def __init__(self, earlier: Usage | None, read: UsageRead, write: UsageWrite) -> None:
        self.rounds = 0  # rounds answered so far (the current round continues them)
        self._before = earlier or Usage()  # usage of every round before the current one
        self._read = read
        self._write = write
        self._held: list[SseEvent] = []

    def feed(self, events: Sequence[SseEvent]) -> bytes:
        """What the client gets now of the current round's next `events`."""
        out = []
        for event in events:
            if self._held or (event.json is not None and self._calls(event.json)):
                self._held.append(event)
            else:
                out.append(_as_sent(event, self._relayed))
        return b"".join(out)

    def release(self) -> bytes:
        """The round ended calling no brim tool: its held events, as the client gets them."""
        held, self._held = self._held, []
        return b"".join(_as_sent(event, self._relayed) for event in held)

    def answer(self, usage: Usage) -> bytes:
        """The round ended calling `brim_restore`; `usage` is the whole round's. What the client
        still gets of its held events; `feed` then takes the round that continues it."""
        held, self._held = self._held, []
        out = b"".join(_as_sent(event, self._kept, other=False) for event in held)
        self._before = self._before.added(usage)
        self.rounds += 1
        self._next_round()
        return out

    @abstractmethod
    def _calls(self, event: dict[str, Any]) -> bool:
        """Whether this event opens a tool call."""

    @abstractmethod
    def _relayed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A JSON event of the current round as the client gets it: the same object when
        unchanged, None when the client must not get it."""

    @abstractmethod
    def _kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A held event of a round that called `brim_restore`, as the client still gets it."""

    @abstractmethod
    def _next_round(self) -> None:
        """Forget what numbered the round just answered (`rounds` and usage are counted)."""

    def _plus_before(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event with the earlier rounds' usage added to each figure it reports."""
        return with_earlier_usage(event, self._before, self._read, self._write)


def _as_sent(
    event: SseEvent,
    rewrite: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    other: bool = True,
) -> bytes:
    """An event as the client gets it: `rewrite` of its JSON, its raw bytes when unchanged,
    nothing when dropped; an event that is not JSON (`[DONE]`, a comment) goes as it is if
    `other`, else not at all."""
    if event.json is None:
        return event.raw if other else b""
    out = rewrite(event.json)
    if out is event.json:
        return event.raw
    return b"" if out is None else with_data(event.raw, orjson.dumps(out))


def listed(value: Any) -> list[Any]:
    """`value` if it is a list, else an empty one (a field a client may send as anything)."""
    return value if isinstance(value, list) else []


def first_of(value: Any) -> Mapping[str, Any]:
    """The first item of a list of objects (a reply's first choice or candidate); empty if
    there is none."""
    found = listed(value)[:1]
    return found[0] if found and isinstance(found[0], Mapping) else {}


def named_tools(body: Mapping[str, Any]) -> frozenset[str]:
    """The names of a request's `tools` that carry theirs at the top (Messages, Responses)."""
    return frozenset(
        tool["name"]
        for tool in listed(body.get("tools"))
        if isinstance(tool, Mapping) and isinstance(tool.get("name"), str)
    )


def with_tool_last(body: Mapping[str, Any], tool: dict[str, Any]) -> dict[str, Any]:
    """`body` with `tool` at the end of its `tools` (where it stays turn after turn)."""
    return {**body, "tools": [*listed(body.get("tools")), tool]}


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A request brim makes of a model itself (a summary): the endpoint (the path after the
    upstream's base URL, as `Exchange.endpoint`), the body, and headers the API requires."""

    endpoint: str
    body: dict[str, Any]
    headers: Mapping[str, str]


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

    # The paths (aiohttp patterns) clients post this API's requests to, each served by brim's
    # one conversation route (proxy/routes/apis.py) through `target`. `{target}`: a part of the
    # URL that `target` reads.
    routes: tuple[str, ...]

    def target(self, route: str, url_part: str | None) -> Target:
        """What a request on `route` (one of `routes`) asks for; `url_part`: its `{target}`.
        Raises `NotServed` or `BodyError` for a URL the API would refuse."""
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
        """The cost outside the conversation (system prompt, tool definitions), in the raw
        encoding (`TokenCounter.request` scales it, and adds the items, the reply's schema and
        the reply priming)."""
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

    def response_model(self, payload: Any) -> str | None:
        """The model that answered, as a reply body or one stream event's data names it (the
        events that carry usage name it too), if it does."""
        ...

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        """Conversation items in the GenAI conventions' shape (for traces and transcripts)."""
        ...

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The system prompt outside the conversation, as GenAI parts (empty if none)."""
        ...

    # Tools brim answers itself (hidden rounds): pure functions of their arguments -------------

    def tool_names(self, body: Mapping[str, Any]) -> frozenset[str]:
        """The names of the tools the request defines."""
        ...

    def with_tool(self, body: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
        """A new body with `spec` appended at the end of the request's tools, in this API's
        shape; the same body and spec give the same bytes (prompt caches see a stable prefix)."""
        ...

    def reply_calls(self, reply: Mapping[str, Any]) -> list[ToolCall]:
        """The tool calls of a non-streamed reply, in the reply's order."""
        ...

    def continued(
        self,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: Sequence[ToolCall],
        results: Sequence[str],
    ) -> dict[str, Any]:
        """`body` with the reply's assistant turn appended — its text, thinking and reasoning
        as the API needs them back, but of its tool calls only `calls` — and then one result
        per call (`results[i]` answers `calls[i]`), paired as the API requires. Raises
        `ValueError` for a call the reply does not make."""
        ...

    def with_usage(self, reply: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        """The reply with its usage replaced by `usage` in this API's fields (a None field of
        `usage` leaves the reply's own figure): `usage(with_usage(r, u)) == usage(r).merged(u)`."""
        ...

    def with_tool_choice_none(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body with tool calling turned off for this request (tools still defined)."""
        ...

    def turn_reader(self) -> TurnReader:
        """A fresh reader for one streamed reply."""
        ...

    def splice(self, earlier: Usage | None) -> Splice:
        """A fresh `Splice` for one streamed reply to the client; `earlier` is the usage of
        hidden rounds answered before any of it was sent (added to every usage figure)."""
        ...

    # Another model: a request sent to a fallback, and calls brim makes itself ----------------

    def with_model(
        self, body: Mapping[str, Any], endpoint: str, model: str
    ) -> tuple[dict[str, Any], str]:
        """The request's body and endpoint addressed to `model` instead (the model is in the
        body, or in the endpoint's path: then the body is returned as the very same object);
        everything else as it was."""
        ...

    def model_call(self, model: str, system: str, text: str, max_tokens: int) -> ModelCall:
        """One unstreamed turn of `model`, without tools: `system` as its instructions, `text`
        as the user's message, at most `max_tokens` tokens of reply."""
        ...

    def reply_text(self, reply: Mapping[str, Any]) -> str:
        """The answer's text in an unstreamed reply (not its thinking or reasoning); empty if
        it has none."""
        ...


class ModelInBody:
    """`Wire.with_model` for wires whose request names its model in the body's `model`."""

    def with_model(
        self, body: Mapping[str, Any], endpoint: str, model: str
    ) -> tuple[dict[str, Any], str]:
        return {**body, "model": model}, endpoint


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


MODEL_NAME_MAX = 256  # characters: a longer "model" field is not a model's name


def model_name(payload: Any, key: str = "model") -> str | None:
    """`payload[key]` if it is a model's name (a non-empty string of at most `MODEL_NAME_MAX`
    characters), else None: the model a reply says answered."""
    value = payload.get(key) if isinstance(payload, Mapping) else None
    return value if isinstance(value, str) and 0 < len(value) <= MODEL_NAME_MAX else None


def body_check(shape: type) -> Callable[[Any], Any]:
    """The validator of a body check: `shape` is a TypedDict naming the fields it checks. Every
    other field is let through, untouched in the body as the client sent it; the validator
    returns a new dict of the named fields. A TypedDict validates in about a third of the time
    of a model (no instances built), and the bare core validator skips a wrapper call."""
    return TypeAdapter(shape).validator.validate_python


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


# Tools brim answers itself: what the wire modules share ----------------------------------------


def json_object(text: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict: a JSON object's text parsed, a dict as it is; anything else
    (not JSON, not an object, cut short) is no arguments."""
    if isinstance(text, Mapping):
        return dict(text)
    if not isinstance(text, str | bytes) or not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def lenient_json(value: Any) -> Any:
    """A JSON text parsed; anything else, and text that is not JSON, as it is (arguments as a
    dialect reports them: whatever the call holds)."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


def answered_in_order(
    calls: Sequence[ToolCall], results: Sequence[str], made: Sequence[tuple[int, ToolCall]]
) -> tuple[list[tuple[ToolCall, str]], set[int]]:
    """(call, result) pairs in the reply's order, and the positions of the reply's calls they
    leave unanswered (the turn sent back goes without them). `made` is the reply's calls with
    their positions, in its order. Raises `ValueError` when the counts differ or a call is not
    one the reply makes."""
    if len(calls) != len(results):
        raise ValueError(f"{len(calls)} tool calls but {len(results)} results")
    by_id = {call.id: (call, result) for call, result in zip(calls, results, strict=True)}
    order = [call.id for _, call in made]
    missing = [call_id for call_id in by_id if call_id not in order]
    if missing:
        raise ValueError(f"the reply makes no tool call {missing}")
    answered = [by_id.pop(call_id) for call_id in order if call_id in by_id]
    wanted = {call.id for call, _ in answered}
    return answered, {position for position, call in made if call.id not in wanted}


def with_earlier_usage(
    event: dict[str, Any], earlier: Usage, read: UsageRead, write: UsageWrite
) -> dict[str, Any]:
    """`event` with `earlier` added to each usage figure it reports (`Usage.plus`); the same
    object when there is nothing to add."""
    if earlier.empty:
        return event
    reported = read(event)
    if reported is None or reported.empty:
        return event
    return write(event, reported.plus(earlier))


def json_event(data: bytes) -> dict[str, Any] | None:
    """A stream event's data as a JSON object; None for anything else (`[DONE]`, nothing)."""
    if not data.startswith(b"{"):
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One whole event of a server-sent event stream, parsed once for everyone who reads it."""

    raw: bytes  # as it came, up to and including the blank line that ends it
    data: bytes  # its `data:` payload, stripped; b"" for an event without one
    json: dict[str, Any] | None  # the payload as a JSON object; None for anything else


class SseEvents:
    """A server-sent event stream's bytes as whole events (`SseEvent`), however its reads split
    them. The raw bytes of every event, in order, are the stream's bytes."""

    def __init__(self) -> None:
        self._pending = b""  # after the last line ending read
        self._lines: list[bytes] = []  # the current event's lines so far

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._pending + chunk
        end = data.rfind(b"\n") + 1  # a CR at the end may be half of a CRLF: wait for the LF
        self._pending = data[end:]
        events = []
        for line in data[:end].splitlines(keepends=True):
            self._lines.append(line)
            if not line.strip(b"\r\n"):
                events.append(self._take())
        return events

    def end(self) -> list[SseEvent]:
        """What is left when the stream ends (an event without its blank line), as it came."""
        if self._pending:
            self._lines.append(self._pending)
            self._pending = b""
        return [self._take()] if self._lines else []

    def _take(self) -> SseEvent:
        lines, self._lines = self._lines, []
        data = b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
        return SseEvent(b"".join(lines), data, json_event(data))


def with_data(raw: bytes, data: bytes) -> bytes:
    """An event (`SseEvents`' raw bytes) with `data` as its payload; its other lines kept."""
    out: list[bytes] = []
    written = False
    for line in raw.splitlines(keepends=True):
        if line.startswith(b"data:"):
            if not written:
                ending = line[len(line.rstrip(b"\r\n")) :] or b"\n"
                out.append(b"data: " + data + ending)
                written = True
            continue
        out.append(line)
    return b"".join(out)
