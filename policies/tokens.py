"""Exact, offline token counts, for every wire API.

Encodings: `o200k_base` (gpt-4o, 4.1, 4.5, 5, o-series, unknown modern models), `cl100k_base`
(gpt-4, gpt-3.5), and `claude` — Anthropic publishes no offline tokenizer, so Claude models are
counted with o200k_base times a calibration factor (default 1.15, erring high).

What a message costs is each wire API's own rule (`policies.wires`); this module holds what they
share: encodings, the per-message cache, and OpenAI's accounting of tool definitions:

    tools    = 12 + Σ tool: 7 (cl100k: 10) + tokens("name:description")
               + (3 + Σ property: 3 + tokens("key:type:description")
                  + enum: −3 + Σ item: 3 + tokens(item)) if it has properties
               (`required` is free; other schema keys and nested schemas: tokens of their JSON)

Counts of single messages are cached by content hash, so turn N+1 of a session tokenizes only
its new messages. `upper_bound` is free: a byte-level BPE token is at least one byte long.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import tiktoken
from cachetools import LRUCache

if TYPE_CHECKING:
    from policies.wires.base import Wire


GEMINI_IMAGE_TOKENS = 258  # Gemini bills an image (up to 384 px a side) as 258 tokens
ANTHROPIC_TOOL_PROMPT = 346  # tokens Anthropic adds to the system prompt when tools are given
O200K = "o200k_base"
CL100K = "cl100k_base"
CLAUDE = "claude"
TOKENIZERS = (O200K, CL100K, CLAUDE)
DEFAULT_CLAUDE_FACTOR = 1.15

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
MAX_IMAGE_TOKENS = 2833 + 5667 * 8  # the most one image can cost under any rule counted here


@dataclass(frozen=True, slots=True)
class ChatCount:
    messages: tuple[int, ...]
    tools: int
    response_format: int
    priming: int

    @property
    def total(self) -> int:
        return sum(self.messages) + self.tools + self.response_format + self.priming


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class TokenCounter:
    """Counts with tiktoken. Thread-safe, so large counts can run off the event loop."""

    def __init__(
        self, *, claude_factor: float = DEFAULT_CLAUDE_FACTOR, cache_size: int = 200_000
    ) -> None:
        if claude_factor < 1:
            raise ValueError(f"claude_factor must be at least 1, not {claude_factor}")
        self.claude_factor = claude_factor
        self._cache: LRUCache[tuple[str, int, int], int] = LRUCache(maxsize=cache_size)
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

    def scale(self, tokens: int, tokenizer: str) -> int:
        return math.ceil(tokens * self.claude_factor) if tokenizer == CLAUDE else tokens

    def text(self, text: str, tokenizer: str) -> int:
        if not text:
            return 0
        return self.scale(len(self.encoding(tokenizer).encode_ordinary(text)), tokenizer)

    def message(self, message: Mapping[str, Any], tokenizer: str, model: str, wire: Wire) -> int:
        """One item's tokens (cached by content), by the rule of the wire API it is written in."""
        # In-process cache: Python's own hash of the serialized message (and its length) is
        # several times faster than a cryptographic digest, and collisions are negligible here.
        serialized = orjson.dumps(message)
        key = (f"{wire.name}:{tokenizer}:{model}", len(serialized), hash(serialized))
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self.cache_hits += 1
                return cached
            self.cache_misses += 1
        raw = wire.message_tokens(message, self.encoding(tokenizer), model)
        counted = self.scale(raw, tokenizer)
        with self._lock:
            self._cache[key] = counted
        return counted

    def request(
        self, wire: Wire, body: Mapping[str, Any], tokenizer: str, model: str = ""
    ) -> ChatCount:
        """A whole request of `wire`'s API: per item, plus its fixed cost."""
        return wire.count(self, body, tokenizer, model)

    def tools(self, tools: Iterable[Any], tokenizer: str) -> int:
        definitions = [t.get("function", t) for t in tools if isinstance(t, Mapping)]
        if not definitions:
            return 0
        enc = self.encoding(tokenizer)

        def count(text: str) -> int:
            return len(enc.encode_ordinary(text)) if text else 0

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
                tokens += count(orjson.dumps(rest).decode())
        return self.scale(tokens, tokenizer)

    @staticmethod
    def _property_raw(key: str, schema: Any, count: Any) -> int:
        if not isinstance(schema, Mapping):
            return int(count(f"{key}:{_text(schema)}"))
        description = str(schema.get("description") or "").removesuffix(".")
        tokens = int(count(f"{key}:{schema.get('type', '')}:{description}"))
        enum = schema.get("enum")
        if isinstance(enum, list):
            tokens += ENUM_START + sum(PER_ENUM_ITEM + count(_text(item)) for item in enum)
        rest = {k: v for k, v in schema.items() if k not in ("type", "description", "enum")}
        if rest:  # nested objects, arrays, formats: counted as their JSON, erring high
            tokens += int(count(orjson.dumps(rest).decode()))
        return tokens

    def upper_bound(self, raw: bytes, body: Mapping[str, Any], tokenizer: str, wire: Wire) -> int:
        """A bound no exact count can exceed, without tokenizing: every token is at least one
        byte of the text, and all text is inside the body's bytes; what costs more than its
        bytes (per-item overheads, images, documents) the wire adds."""
        return self.scale(len(raw) + wire.bound_overhead(body), tokenizer)


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
    """A `TokenCounter` bound to one request's tokenizer, model and wire API (the policies'
    `Meter`)."""

    def __init__(self, counter: TokenCounter, tokenizer: str, model: str, wire: Wire) -> None:
        self.counter = counter
        self.tokenizer = tokenizer
        self.model = model
        self.wire = wire
        self._encoding = counter.encoding(tokenizer)
        self._text_sizes: LRUCache[bytes, int] = LRUCache(maxsize=50_000)

    def text_tokens(self, text: str) -> int:
        """Tokens of a text, cached by content (tool results are measured again every turn)."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        size = self._text_sizes.get(key)
        if size is None:
            size = self._text_sizes[key] = len(self._encoding.encode_ordinary(text))
        return size

    def message(self, message: Any) -> int:
        return self.counter.message(message, self.tokenizer, self.model, self.wire)

    def tokens(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._encoding.decode(list(tokens))

    def fixed(self, body: Mapping[str, Any]) -> int:
        """Everything but the conversation: system prompt, tool definitions, reply priming."""
        bare = self.wire.with_conversation(body, [])
        return self.counter.request(self.wire, bare, self.tokenizer, self.model).total
