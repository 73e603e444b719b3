"""Exact, offline token counts, for every wire API.

Encodings: `o200k_base` (gpt-4o, 4.1, 4.5, 5, o-series, unknown modern models), `cl100k_base`
(gpt-4, gpt-3.5), and `claude` — Anthropic publishes no offline tokenizer, so Claude models are
counted with o200k_base.

Counts are made in the encoding's own tokens, and scaled once, by the request's *ratio*: the
provider's tokens per token of the encoding (`policies.ratios` learns it per model from the
providers' replies; before it has, the tokenizer's prior — `claude_factor` for Claude, 1 for
the others). Every count the guard compares with a budget — items, the fixed cost, the byte
bound — is scaled so (`ratio=`; None: the prior), each item's on its own (rounded up); the
caches hold the encoding's counts, so a ratio learned later needs no recount. `raw_text`,
`CounterMeter.tokens` and `CounterMeter.text_tokens` are in the encoding's tokens: a policy that
cuts a text by its tokens converts (`policies.conversation.text_tokens_for`).

What a message costs is each wire API's own rule (`policies.wires`), and so is the fixed cost
outside the conversation (`Wire.fixed_tokens`); this module holds what they share: encodings,
the caches, the request's shape (Σ item + fixed + 3 for reply priming), and OpenAI's accounting
of tool definitions:

    tools    = 12 + Σ tool: 7 (cl100k: 10) + tokens("name:description")
               + (3 + Σ property: 3 + tokens("key:type:description")
                  + enum: −3 + Σ item: 3 + tokens(item)) if it has properties
               (`required` is free; other schema keys and nested schemas: tokens of their JSON)

Counts of single messages are cached by content hash, so turn N+1 of a session tokenizes only
its new messages; so are texts and tool definitions (the system prompt and tools are counted
again by every request and every compression pass). `upper_bound` is free: a byte-level BPE
token is at least one byte long.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import tiktoken
from cachetools import LRUCache

from brim.policies.records import record
from brim.policies.remembered import Remembered

if TYPE_CHECKING:
    from brim.policies.wires.base import Wire


ANTHROPIC_TOOL_PROMPT = 346  # tokens Anthropic adds to the system prompt when tools are given
O200K = "o200k_base"
CL100K = "cl100k_base"
CLAUDE = "claude"
TOKENIZERS = (O200K, CL100K, CLAUDE)
DEFAULT_CLAUDE_FACTOR = 1.15
RAW = 1.0  # the ratio of counts in the encoding's own tokens, unscaled

PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 3
TOOLS_END = 12
PER_TOOL = {O200K: 7, CL100K: 10, CLAUDE: 7}
PROPERTIES_START = 3
PER_PROPERTY = 3
ENUM_START = -3
PER_ENUM_ITEM = 3
# Schema keys the provider's rendering of a tool spends no separate tokens on.
_RENDERED_WITHOUT_TOKENS = frozenset({"type", "properties", "required", "additionalProperties"})


@record
class ChatCount:
    """A request's tokens by where they are. `tools` is the whole fixed cost `Wire.fixed_tokens`
    counts: tool definitions, and the system prompt of the APIs that keep it outside the
    conversation (the name stays for its readers, `brim inspect` among them); the reply's schema
    is `response_format`."""

    messages: tuple[int, ...]
    tools: int
    response_format: int
    priming: int

    @property
    def total(self) -> int:
        return sum(self.messages) + self.tools + self.response_format + self.priming


def as_text(value: Any) -> str:
    """A string as it is, anything else as its JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


PIECE_CHARS = 1 << 20  # longer texts are encoded a piece at a time


def encoded_length(enc: tiktoken.Encoding, text: str) -> int:
    """`len(enc.encode_ordinary(text))` without holding every token of a huge text at once
    (a list of 6 M ints for 30 MB of text is ~250 MB): a long text is encoded in pieces of about
    `PIECE_CHARS`, each cut just before a space that starts a word — where the encodings'
    pre-tokenizers split anyway, so the sum is the same count."""
    if len(text) <= PIECE_CHARS:
        return len(enc.encode_ordinary(text))
    total, start, end = 0, 0, len(text)
    while start < end:
        cut = min(end, start + PIECE_CHARS)
        if cut < end:
            at = cut
            while at > start + PIECE_CHARS // 2:
                at = text.rfind(" ", start + PIECE_CHARS // 2, at)
                if at < 0:
                    break
                if not text[at - 1].isspace() and not text[at + 1].isspace():
                    cut = at
                    break
        total += len(enc.encode_ordinary(text[start:cut]))
        start = cut
    return total


def token_count(enc: tiktoken.Encoding) -> Callable[[Any], int]:
    """Tokens of a value in `enc`: a string as it is, anything else as its JSON; 0 for empty."""

    def count(value: Any) -> int:
        return encoded_length(enc, as_text(value)) if value else 0

    return count


TextCache = LRUCache[tuple[str, int, int], int]  # (tokenizer, length, hash) → tokens
MessageKey = tuple[str, int, int]  # (wire:tokenizer:model, length, hash of the message's JSON)


class TokenCounter:
    """Counts with tiktoken. Thread-safe, so large counts can run off the event loop."""

    def __init__(
        self,
        *,
        claude_factor: float = DEFAULT_CLAUDE_FACTOR,
        cache_size: int = 200_000,
        fixed_cache_size: int = 4_096,
    ) -> None:
        if claude_factor < 1:
            raise ValueError(f"claude_factor must be at least 1, not {claude_factor}")
        self.claude_factor = claude_factor
        self._cache: Remembered[MessageKey, int] = Remembered(cache_size)  # messages
        # Texts and tool definitions (system prompts, tools: few, long, counted every request),
        # apart from the messages so that a long session cannot evict them.
        self._fixed: LRUCache[tuple[str, int, int], int] = LRUCache(maxsize=fixed_cache_size)
        self._texts: LRUCache[tuple[str, int, int], int] = LRUCache(maxsize=50_000)  # any text
        self._lock = threading.Lock()
        self.cache_hits = 0
        self.cache_misses = 0

    @staticmethod
    def encoding(tokenizer: str) -> tiktoken.Encoding:
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; known: {', '.join(TOKENIZERS)}")
        encoding = tiktoken.get_encoding(O200K if tokenizer == CLAUDE else tokenizer)
        # tiktoken keeps a Python copy of the rank table (~35 MB for o200k) beside the Rust one
        # it encodes with; only pickling reads it, and brim never pickles an encoding.
        if getattr(encoding, "_mergeable_ranks", None):
            encoding._mergeable_ranks = {}
        return encoding

    def warm(self, tokenizers: Iterable[str] = (O200K,)) -> None:
        """Load encodings now (they take a moment), rather than on a first request. o200k_base
        serves most models; cl100k_base (~30 MB more) loads when a gpt-4/3.5 request needs it."""
        for name in tokenizers:
            self.encoding(name).encode_ordinary("warm")

    def prior(self, tokenizer: str) -> float:
        """The ratio a tokenizer's counts are scaled by until one is learned for the model."""
        return self.claude_factor if tokenizer == CLAUDE else 1.0

    def _ratio(self, tokenizer: str, ratio: float | None) -> float:
        return self.prior(tokenizer) if ratio is None else ratio

    def text(self, text: str, tokenizer: str, ratio: float | None = None) -> int:
        """Tokens of a text (cached by content: a system prompt is counted again every turn)."""
        if not text:
            return 0
        return scaled(self._counted(self._fixed, text, tokenizer), self._ratio(tokenizer, ratio))

    def raw_text(self, text: str, tokenizer: str) -> int:
        """Tokens of a text in the encoding itself, before any calibration factor; cached by
        content, shared by every request (tool results and summaries come back every turn)."""
        return self._counted(self._texts, text, tokenizer) if text else 0

    def _counted(
        self, cache: LRUCache[tuple[str, int, int], int], text: str, tokenizer: str
    ) -> int:
        # Keyed by encoding: "claude" counts in o200k_base (its factor is applied after), so a
        # text the guard measures for Claude and the summarizer for o200k is tokenized once.
        key = (O200K if tokenizer == CLAUDE else tokenizer, len(text), hash(text))
        with self._lock:
            cached = cache.get(key)
        if cached is not None:
            return cached
        counted = encoded_length(self.encoding(tokenizer), text)
        with self._lock:
            cache[key] = counted
        return counted

    def message(
        self,
        message: Mapping[str, Any],
        tokenizer: str,
        model: str,
        wire: Wire,
        ratio: float | None = None,
    ) -> int:
        """One item's tokens (cached by content), by the rule of the wire API it is written in."""
        kind = f"{wire.name}:{tokenizer}:{model}"
        raw = self._message(message, kind, tokenizer, model, wire)
        return scaled(raw, self._ratio(tokenizer, ratio))

    def _message(
        self, message: Mapping[str, Any], kind: str, tokenizer: str, model: str, wire: Wire
    ) -> int:
        """`message` in the encoding's tokens, where `kind` is the cache's name for the wire,
        tokenizer and model."""
        # In-process cache: Python's own hash of the serialized message (and its length) is
        # several times faster than a cryptographic digest, and collisions are negligible here.
        serialized = orjson.dumps(message)
        return self._keyed(
            message, (kind, len(serialized), hash(serialized)), tokenizer, model, wire
        )

    def _keyed(
        self, message: Mapping[str, Any], key: MessageKey, tokenizer: str, model: str, wire: Wire
    ) -> int:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self.cache_hits += 1
                return cached
            self.cache_misses += 1
        counted = wire.message_tokens(message, self.encoding(tokenizer), model)
        with self._lock:
            self._cache[key] = counted
        return counted

    def request(
        self,
        wire: Wire,
        body: Mapping[str, Any],
        tokenizer: str,
        model: str = "",
        ratio: float | None = None,
    ) -> ChatCount:
        """A whole request of `wire`'s API: Σ item + its fixed cost + reply priming."""
        ratio = self._ratio(tokenizer, ratio)
        tools, response_format = self._outside(wire, body, tokenizer, model, ratio)
        return ChatCount(
            messages=self.messages(wire.conversation(body), tokenizer, model, wire, ratio),
            tools=tools,
            response_format=response_format,
            priming=REPLY_PRIMING,
        )

    def _outside(
        self, wire: Wire, body: Mapping[str, Any], tokenizer: str, model: str, ratio: float
    ) -> tuple[int, int]:
        """The fixed cost outside the conversation (`Wire.fixed_tokens`) and the reply's
        schema, each scaled by `ratio`."""
        fixed = scaled(wire.fixed_tokens(self, body, tokenizer, model), ratio)
        return fixed, self.response_format(wire, body, tokenizer, ratio)

    def messages(
        self,
        items: Iterable[Any],
        tokenizer: str,
        model: str,
        wire: Wire,
        ratio: float | None = None,
    ) -> tuple[int, ...]:
        """Each item's tokens (those that are objects), as `message` counts them: the cached
        ones looked up together, under one lock (a long session's turn is mostly cached)."""
        raw = self._raw_messages(items, tokenizer, model, wire)
        ratio = self._ratio(tokenizer, ratio)
        if ratio == 1:
            return raw
        return tuple(scaled(count, ratio) for count in raw)

    def _raw_messages(
        self, items: Iterable[Any], tokenizer: str, model: str, wire: Wire
    ) -> tuple[int, ...]:
        """`messages` in the encoding's tokens."""
        kind = f"{wire.name}:{tokenizer}:{model}"
        keyed: list[tuple[Mapping[str, Any], MessageKey]] = []
        for item in items:
            if type(item) is dict or isinstance(item, Mapping):
                serialized = orjson.dumps(item)
                keyed.append((item, (kind, len(serialized), hash(serialized))))
        get = self._cache.get
        with self._lock:
            found = [get(key) for _, key in keyed]
            missing = found.count(None)
            self.cache_hits += len(found) - missing
        if not missing:  # a session's turns are counted again every turn: the common case
            return tuple(found)  # type: ignore[arg-type]  # no None among them
        return tuple(
            self._keyed(item, key, tokenizer, model, wire) if count is None else count
            for (item, key), count in zip(keyed, found, strict=True)
        )

    def fixed(
        self,
        wire: Wire,
        body: Mapping[str, Any],
        tokenizer: str,
        model: str = "",
        ratio: float | None = None,
    ) -> int:
        """Everything of a request but its conversation: what `request` counts besides the items."""
        fixed, response_format = self._outside(
            wire, body, tokenizer, model, self._ratio(tokenizer, ratio)
        )
        return fixed + response_format + REPLY_PRIMING

    def response_format(
        self, wire: Wire, body: Mapping[str, Any], tokenizer: str, ratio: float | None = None
    ) -> int:
        """Tokens of the schema the reply must follow (as its JSON), if the request gives one."""
        schema = wire.response_schema(body)
        return self.text(as_text(schema), tokenizer, ratio) if schema is not None else 0

    def tools(self, tools: Iterable[Any], tokenizer: str, ratio: float | None = None) -> int:
        """Tool definitions by OpenAI's accounting (cached by their JSON)."""
        definitions = [t.get("function", t) for t in tools if isinstance(t, Mapping)]
        if not definitions:
            return 0
        serialized = orjson.dumps(definitions)
        key = (f"tools:{tokenizer}", len(serialized), hash(serialized))
        with self._lock:
            cached = self._fixed.get(key)
        if cached is None:
            cached = self._tools_raw(definitions, tokenizer)
            with self._lock:
                self._fixed[key] = cached
        return scaled(cached, self._ratio(tokenizer, ratio))

    def _tools_raw(self, definitions: Sequence[Mapping[str, Any]], tokenizer: str) -> int:
        count = token_count(self.encoding(tokenizer))
        tokens = TOOLS_END
        for function in definitions:
            description = str(function.get("description") or "").removesuffix(".")
            tokens += PER_TOOL[tokenizer] + count(f"{function.get('name', '')}:{description}")
            parameters = function.get("parameters")
            if not isinstance(parameters, Mapping):
                continue
            properties = parameters.get("properties")
            if isinstance(properties, Mapping) and properties:
                tokens += PROPERTIES_START
                for key, schema in properties.items():
                    tokens += PER_PROPERTY + self._property_raw(key, schema, count)
            rest = {k: v for k, v in parameters.items() if k not in _RENDERED_WITHOUT_TOKENS}
            if rest:
                tokens += count(rest)
        return tokens

    @staticmethod
    def _property_raw(key: str, schema: Any, count: Callable[[Any], int]) -> int:
        if not isinstance(schema, Mapping):
            return count(f"{key}:{as_text(schema)}")
        description = str(schema.get("description") or "").removesuffix(".")
        tokens = count(f"{key}:{schema.get('type', '')}:{description}")
        enum = schema.get("enum")
        if isinstance(enum, list):
            tokens += ENUM_START + sum(PER_ENUM_ITEM + count(as_text(item)) for item in enum)
        rest = {k: v for k, v in schema.items() if k not in ("type", "description", "enum")}
        if rest:  # nested objects, arrays, formats: counted as their JSON, erring high
            tokens += count(rest)
        return tokens

    def upper_bound(
        self,
        raw: bytes,
        body: Mapping[str, Any],
        tokenizer: str,
        wire: Wire,
        ratio: float | None = None,
    ) -> int:
        """A bound no exact count (at the same `ratio`) can exceed, without tokenizing: every
        token is at least one byte of the text, and all text is inside the body's bytes. What
        costs more than its bytes: reply priming and each item's overhead (its role and
        separators), here; what else (tool calls, images, documents, tool definitions) the wire
        adds."""
        items = 0
        for item in wire.conversation(body):
            if type(item) is dict or isinstance(item, Mapping):
                items += 1
        overhead = REPLY_PRIMING + (PER_MESSAGE + PER_NAME) * items + wire.bound_overhead(body)
        return scaled(len(raw) + overhead, self._ratio(tokenizer, ratio))


def scaled(tokens: int, ratio: float) -> int:
    """`tokens` of the encoding in the provider's tokens, at `ratio`: rounded up (float noise
    first rounded away, so 1 000 × 1.1 is 1 100, not 1 101)."""
    return tokens if ratio == 1 else math.ceil(round(tokens * ratio, 6))


def tool_definitions_bound(definitions: Iterable[Any]) -> int:
    """What `TokenCounter.tools` can count beyond the definitions' own bytes: the fixed tokens
    per tool, per property and per enum item (an enum item `1,` is two bytes, four tokens)."""
    tokens = 0
    for tool in definitions:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function", tool)
        function = function if isinstance(function, Mapping) else {}
        tokens += PER_TOOL[CL100K] + PROPERTIES_START
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        for schema in properties.values() if isinstance(properties, Mapping) else ():
            tokens += PER_PROPERTY
            enum = schema.get("enum") if isinstance(schema, Mapping) else None
            tokens += PER_ENUM_ITEM * len(enum) if isinstance(enum, list) else 0
    return TOOLS_END + tokens if tokens else 0


class CounterMeter:
    """A `TokenCounter` bound to one request's tokenizer, model, wire API and ratio (the
    policies' `Meter`; `ratio` None: the tokenizer's prior)."""

    def __init__(
        self,
        counter: TokenCounter,
        tokenizer: str,
        model: str,
        wire: Wire,
        ratio: float | None = None,
    ) -> None:
        self.counter = counter
        self.tokenizer = tokenizer
        self.model = model
        self.wire = wire
        self.ratio = counter.prior(tokenizer) if ratio is None else ratio
        self._encoding = counter.encoding(tokenizer)
        self._kind = f"{wire.name}:{tokenizer}:{model}"  # the counter's name for all three

    def text_tokens(self, text: str) -> int:
        """Tokens of a text, from the counter's cache (a meter lives for one request; tool
        results and evicted transcripts come back every turn)."""
        return self.counter.raw_text(text, self.tokenizer)

    def message(self, message: Any) -> int:
        raw = self.counter._message(message, self._kind, self.tokenizer, self.model, self.wire)
        return scaled(raw, self.ratio)

    def messages(self, messages: Sequence[Any]) -> tuple[int, ...]:
        """`message` of each, the cached counts looked up together (`TokenCounter.messages`):
        a long session is counted whole at every compression, mostly from the cache."""
        if any(type(message) is not dict for message in messages):
            return tuple(map(self.message, messages))
        return self.counter.messages(messages, self.tokenizer, self.model, self.wire, self.ratio)

    def tokens(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._encoding.decode(list(tokens))

    def fixed(self, body: Mapping[str, Any]) -> int:
        """Everything but the conversation: system prompt, tool definitions, reply priming."""
        return self.counter.fixed(self.wire, body, self.tokenizer, self.model, self.ratio)
