"""Exact, offline token counts of Chat Completions requests.

Encodings: `o200k_base` (gpt-4o, 4.1, 4.5, 5, o-series, unknown modern models), `cl100k_base`
(gpt-4, gpt-3.5), and `claude` — Anthropic publishes no offline tokenizer, so Claude models are
counted with o200k_base times a calibration factor (default 1.15, erring high).

The formula, per OpenAI's published accounting for chat models:

    request  = Σ message + tool definitions + response_format schema + 3 (reply priming)
    message  = 3 + tokens(role) + tokens(content) [+ tokens(name) + 1]
               + Σ tool call: 3 + tokens(id) + tokens(name) + tokens(arguments)
               + tokens(tool_call_id) + tokens(reasoning_content) + tokens(refusal)
    content  = a string, or Σ parts: text → tokens(text); image_url → the tile rule in
               `policies.images`; any other part → tokens of its JSON
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
from typing import Any

import orjson
import tiktoken
from cachetools import LRUCache

from policies.dialects import with_conversation
from policies.images import anthropic_image_tokens, image_tokens, pdf_tokens

OPENAI = "openai.chat"
ANTHROPIC = "anthropic.messages"
RESPONSES = "openai.responses"
GEMINI = "gemini.generate"
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

    def _scale(self, tokens: int, tokenizer: str) -> int:
        return math.ceil(tokens * self.claude_factor) if tokenizer == CLAUDE else tokens

    def text(self, text: str, tokenizer: str) -> int:
        if not text:
            return 0
        return self._scale(len(self.encoding(tokenizer).encode_ordinary(text)), tokenizer)

    def message(
        self, message: Mapping[str, Any], tokenizer: str, model: str = "", shape: str = OPENAI
    ) -> int:
        """One message's tokens (cached by content); `shape` is the wire API it is written in."""
        # In-process cache: Python's own hash of the serialized message (and its length) is
        # several times faster than a cryptographic digest, and collisions are negligible here.
        serialized = orjson.dumps(message)
        key = (f"{shape}:{tokenizer}:{model}", len(serialized), hash(serialized))
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self.cache_hits += 1
                return cached
            self.cache_misses += 1
        encoding = self.encoding(tokenizer)
        if shape == ANTHROPIC:
            raw = self._anthropic_raw(message, encoding)
        elif shape == RESPONSES:
            raw = self._responses_raw(message, encoding, model)
        elif shape == GEMINI:
            raw = self._gemini_raw(message, encoding)
        else:
            raw = self._message_raw(message, encoding, model)
        counted = self._scale(raw, tokenizer)
        with self._lock:
            self._cache[key] = counted
        return counted

    def _message_raw(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        def count(value: Any) -> int:
            return len(enc.encode_ordinary(_text(value))) if value else 0

        tokens = PER_MESSAGE + count(message.get("role"))
        if message.get("name"):
            tokens += count(message["name"]) + PER_NAME
        tokens += self._content_raw(message.get("content"), enc, model)
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

    @staticmethod
    def _content_raw(content: Any, enc: tiktoken.Encoding, model: str) -> int:
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
                tokens += len(enc.encode_ordinary(_text(part)))
        return tokens

    def _anthropic_raw(self, message: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        def count(value: Any) -> int:
            return len(enc.encode_ordinary(_text(value))) if value else 0

        tokens = PER_MESSAGE + count(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            return tokens + count(content)
        for block in content if isinstance(content, list) else ():
            tokens += self._anthropic_block(block, count)
        return tokens

    @staticmethod
    def _anthropic_block(block: Any, count: Any) -> int:
        if not isinstance(block, Mapping):
            return int(count(block))
        kind = block.get("type")
        if kind == "text":
            return int(count(block.get("text")))
        if kind == "image":
            return anthropic_image_tokens(block.get("source"))
        if kind == "document":
            source = block.get("source")
            if isinstance(source, Mapping) and source.get("type") == "text":
                return int(count(source.get("data")))
            return pdf_tokens(source)
        if kind == "tool_use":
            return PER_TOOL_CALL + int(count(block.get("name"))) + int(count(block.get("input")))
        if kind == "tool_result":
            inner = block.get("content")
            parts = [{"type": "text", "text": inner}] if isinstance(inner, str) else inner or []
            return PER_TOOL_CALL + sum(TokenCounter._anthropic_block(p, count) for p in parts)
        if kind == "thinking":
            return int(count(block.get("thinking")))
        if kind == "redacted_thinking":
            return len(str(block.get("data", ""))) // 4
        return int(count({k: v for k, v in block.items() if k != "cache_control"}))

    def _responses_raw(self, item: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        def count(value: Any) -> int:
            return len(enc.encode_ordinary(_text(value))) if value else 0

        kind = item.get("type") or "message"
        tokens = PER_MESSAGE
        if kind == "message":
            tokens += count(item.get("role"))
            content = item.get("content")
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
            summary = " ".join(
                str(s.get("text", "")) for s in item.get("summary") or [] if isinstance(s, Mapping)
            )
            return tokens + count(summary) + len(str(item.get("encrypted_content") or "")) // 4
        tokens += count(item.get("name")) + count(item.get("arguments")) + count(item.get("input"))
        tokens += count(item.get("action")) + count(item.get("call_id"))
        output = item.get("output")
        return tokens + (
            count(output) if isinstance(output, str) else count(_text(output)) if output else 0
        )

    @staticmethod
    def _gemini_raw(item: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        def count(value: Any) -> int:
            return len(enc.encode_ordinary(_text(value))) if value else 0

        tokens = PER_MESSAGE + count(item.get("role"))
        for part in item.get("parts") or ():
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

    def gemini_request(self, body: Mapping[str, Any], tokenizer: str, model: str = "") -> ChatCount:
        """A generateContent request: `contents`; `systemInstruction` and tools as fixed cost."""
        items = [i for i in body.get("contents") or [] if isinstance(i, Mapping)]
        per_item = tuple(self.message(i, tokenizer, model, GEMINI) for i in items)
        system = body.get("systemInstruction") or body.get("system_instruction") or {}
        fixed = self.text(_text(system), tokenizer) if system else 0
        if body.get("tools"):
            fixed += self.text(_text(body["tools"]), tokenizer)
        return ChatCount(messages=per_item, tools=fixed, response_format=0, priming=REPLY_PRIMING)

    def responses_request(
        self, body: Mapping[str, Any], tokenizer: str, model: str = ""
    ) -> ChatCount:
        """A Responses request: its `input` items, plus `instructions` and tools as fixed cost."""
        value = body.get("input")
        items = (
            [{"type": "message", "role": "user", "content": value}]
            if isinstance(value, str)
            else value or []
        )
        per_item = tuple(
            self.message(i, tokenizer, model, RESPONSES) for i in items if isinstance(i, Mapping)
        )
        tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping)]
        fixed = self.text(str(body.get("instructions") or ""), tokenizer)
        fixed += self.tools(tools, tokenizer) if tools else 0
        return ChatCount(messages=per_item, tools=fixed, response_format=0, priming=REPLY_PRIMING)

    def messages_request(
        self, body: Mapping[str, Any], tokenizer: str, model: str = ""
    ) -> ChatCount:
        """An Anthropic Messages request: messages, plus the system prompt and tool list (and
        the tool-use prompt Anthropic adds when tools are given) as fixed cost."""
        messages = body.get("messages") or []
        per_message = tuple(
            self.message(m, tokenizer, model, ANTHROPIC) for m in messages if isinstance(m, Mapping)
        )
        system = body.get("system")
        system_text = (
            system
            if isinstance(system, str)
            else "\n".join(str(b.get("text", "")) for b in system or [] if isinstance(b, Mapping))
        )
        tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping)]
        tool_tokens = sum(
            self.text(_text({k: v for k, v in t.items() if k != "cache_control"}), tokenizer)
            for t in tools
        )
        if tools:
            tool_tokens += self._scale(ANTHROPIC_TOOL_PROMPT, tokenizer)
        return ChatCount(
            messages=per_message,
            tools=tool_tokens + self.text(system_text, tokenizer),
            response_format=0,
            priming=REPLY_PRIMING,
        )

    def request(
        self, api: str, body: Mapping[str, Any], tokenizer: str, model: str = ""
    ) -> ChatCount:
        if api == ANTHROPIC:
            return self.messages_request(body, tokenizer, model)
        if api == RESPONSES:
            return self.responses_request(body, tokenizer, model)
        if api == GEMINI:
            return self.gemini_request(body, tokenizer, model)
        return self.chat(body, tokenizer, model)

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
        return self._scale(tokens, tokenizer)

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

    def chat(self, body: Mapping[str, Any], tokenizer: str, model: str = "") -> ChatCount:
        messages = body.get("messages") or []
        per_message = tuple(
            self.message(m, tokenizer, model) for m in messages if isinstance(m, Mapping)
        )
        definitions = list(body.get("tools") or []) + list(body.get("functions") or [])
        response_format = body.get("response_format")
        schema_tokens = 0
        if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
            schema_tokens = self.text(_text(response_format.get("json_schema")), tokenizer)
        return ChatCount(
            messages=per_message,
            tools=self.tools(definitions, tokenizer),
            response_format=schema_tokens,
            priming=REPLY_PRIMING,
        )

    def upper_bound(self, raw: bytes, body: Mapping[str, Any], tokenizer: str) -> int:
        """A bound no exact count can exceed, without tokenizing: every token is at least one
        byte of the text, and all text is inside the body's bytes."""
        messages: Sequence[Any] = body.get("messages") or ()
        if not messages and isinstance(body.get("input"), list):
            messages = body["input"]  # Responses items
        if not messages and isinstance(body.get("contents"), list):
            messages = body["contents"]  # Gemini turns
        images = sum(
            1
            for m in messages
            if isinstance(m, Mapping) and isinstance(m.get("content"), list)
            for part in m["content"]
            if isinstance(part, Mapping) and part.get("type") in ("image_url", "image")
        ) + sum(
            1
            for m in messages
            if isinstance(m, Mapping)
            for part in m.get("parts") or ()
            if isinstance(part, Mapping) and ("inlineData" in part or "fileData" in part)
        )
        documents = sum(
            pdf_tokens(part.get("source"))
            for m in messages
            if isinstance(m, Mapping) and isinstance(m.get("content"), list)
            for part in m["content"]
            if isinstance(part, Mapping) and part.get("type") == "document"
        )
        calls = sum(len(m.get("tool_calls") or ()) for m in messages if isinstance(m, Mapping))
        tools = len(body.get("tools") or ()) + len(body.get("functions") or ())
        fixed = (
            (PER_MESSAGE + PER_NAME) * len(messages)
            + PER_TOOL_CALL * calls
            + TOOLS_END
            + (PER_TOOL[CL100K] + PROPERTIES_START) * tools
            + REPLY_PRIMING
            + MAX_IMAGE_TOKENS * images
            + documents
            + ANTHROPIC_TOOL_PROMPT
        )
        return self._scale(len(raw) + fixed, tokenizer)


class CounterMeter:
    """A `TokenCounter` bound to one request's tokenizer and model (the policies' `Meter`)."""

    def __init__(
        self, counter: TokenCounter, tokenizer: str, model: str = "", api: str = OPENAI
    ) -> None:
        self.counter = counter
        self.tokenizer = tokenizer
        self.model = model
        self.api = api
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
        return self.counter.message(message, self.tokenizer, self.model, self.api)

    def tokens(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._encoding.decode(list(tokens))

    def fixed(self, body: Mapping[str, Any]) -> int:
        """Everything but the messages: tool definitions, response format, reply priming."""
        bare = with_conversation(self.api, body, [])
        return self.counter.request(self.api, bare, self.tokenizer, self.model).total
