"""Reading a coding CLI's output: each CLI's JSON (or stream-JSON) lines, one parsed line at a
time, into the events of a run — text, the usage it reports, or a failure it reports."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Used:
    prompt: int
    completion: int
    cached: int = 0


@dataclass(slots=True)
class Failed:
    """The CLI reported a failure: its message (the provider's, as the CLI words it), the HTTP
    status it names if any, and whether it says the prompt was too long."""

    message: str
    status: int | None = None
    overflow: bool = False


Event = Text | Used | Failed


class Reader:
    """Reads one CLI's JSON output, one parsed line at a time."""

    def __init__(self) -> None:
        self.texts = 0  # text events given
        self.final = False  # the CLI said its turn is over

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        raise NotImplementedError

    def end(self) -> list[Event]:
        """Events due once the output is over (a failure held back until the end)."""
        return []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class ClaudeReader(Reader):
    """`claude -p --output-format stream-json --verbose --include-partial-messages`: the API's
    own stream events (`stream_event`), then one `result` with the usage, or `is_error`."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "stream_event":
            event = line.get("event") or {}
            delta = event.get("delta") or {}
            if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                text = delta.get("text")
                if isinstance(text, str) and text:
                    self.texts += 1
                    return [Text(text)]
            return []
        if kind != "result":
            return []
        self.final = True
        usage = line.get("usage") or {}
        result = line.get("result")
        if line.get("is_error") or line.get("subtype") not in (None, "success"):
            status = line.get("api_error_status")
            message = result if isinstance(result, str) and result else str(line.get("subtype"))
            return [Failed(message, status if isinstance(status, int) else None)]
        events: list[Event] = []
        if not self.texts and isinstance(result, str) and result:
            self.texts += 1
            events.append(Text(result))
        cached = _int(usage.get("cache_read_input_tokens"))
        prompt = _int(usage.get("input_tokens")) + cached
        prompt += _int(usage.get("cache_creation_input_tokens"))
        events.append(Used(prompt, _int(usage.get("output_tokens")), cached))
        return events


class CursorReader(ClaudeReader):
    """`cursor-agent -p --output-format stream-json`: whole `assistant` messages (no partial
    ones asked for), then a `result` like Claude Code's."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        if line.get("type") == "assistant":
            message = line.get("message") or {}
            content = message.get("content")
            texts = [
                block.get("text")
                for block in (content if isinstance(content, list) else [])
                if isinstance(block, dict) and block.get("type") == "text"
            ]
            text = "".join(t for t in texts if isinstance(t, str))
            if text:
                self.texts += 1
                return [Text(text)]
            return []
        return super().feed(line)


class CodexReader(Reader):
    """`codex exec --json`: `item.completed` items (the answer is an `agent_message`), then
    `turn.completed` with the usage or `turn.failed`. Top-level `error` events may be followed by
    a retry, so only `turn.failed` (or the exit status) makes them final; an item of type
    `error` is a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "item.completed":
            item = line.get("item") or {}
            text = item.get("text")
            if item.get("type") == "agent_message" and isinstance(text, str) and text:
                self.texts += 1
                return [Text(("\n\n" if self.texts > 1 else "") + text)]
            return []
        if kind == "error":
            message = line.get("message")
            if isinstance(message, str):
                self.errors.append(message)
            return []
        if kind == "turn.completed":
            self.final = True
            usage = line.get("usage") or {}
            cached = _int(usage.get("cached_input_tokens"))
            return [Used(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")), cached)]
        if kind == "turn.failed":
            self.final = True
            error = line.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else None
            return [Failed(message if isinstance(message, str) else "; ".join(self.errors))]
        return []

    def end(self) -> list[Event]:
        return [Failed(self.errors[-1])] if self.errors and not self.final else []


class GeminiReader(Reader):
    """`gemini -p … --output-format stream-json`: `message` events (the assistant's as deltas),
    then a `result` with `stats`, or with `status` "error"."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "message" and line.get("role") == "assistant":
            text = line.get("content")
            if isinstance(text, str) and text:
                self.texts += 1
                return [Text(text)]
            return []
        if kind == "error":
            message = line.get("message")
            return [Failed(message if isinstance(message, str) else json.dumps(line))]
        if kind != "result":
            return []
        self.final = True
        if line.get("status") not in (None, "success"):
            error = line.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else None
            return [Failed(message if isinstance(message, str) else str(line.get("status")))]
        stats = line.get("stats") or {}
        return [
            Used(
                _int(stats.get("input_tokens")),
                _int(stats.get("output_tokens")),
                _int(stats.get("cached")),
            )
        ]


class OpencodeReader(Reader):
    """`opencode run --format json`: `text` parts (each whole), `step_finish` with the step's
    tokens, and `error` events (`ContextOverflowError` among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = Used(0, 0)
        self.steps = 0

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        part = line.get("part") or {}
        if kind == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                self.texts += 1
                return [Text(("\n\n" if self.texts > 1 else "") + text)]
            return []
        if kind == "step_finish":
            tokens = part.get("tokens") or {}
            cache = tokens.get("cache") or {}
            self.used.prompt += _int(tokens.get("input")) + _int(cache.get("read"))
            self.used.completion += _int(tokens.get("output")) + _int(tokens.get("reasoning"))
            self.used.cached += _int(cache.get("read"))
            self.steps += 1
            return []
        if kind == "error":
            error = line.get("error") or {}
            data = error.get("data") or {}
            message = data.get("message") if isinstance(data, dict) else None
            name = str(error.get("name") or "")
            status = data.get("statusCode") if isinstance(data, dict) else None
            return [
                Failed(
                    message if isinstance(message, str) else name or "opencode failed",
                    status if isinstance(status, int) else None,
                    overflow="ContextOverflow" in name,
                )
            ]
        return []

    def end(self) -> list[Event]:
        return [self.used] if self.steps else []


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One line of a CLI's output as a JSON object; None for anything else (its other output)."""
    text = line.strip()
    if not text.startswith(b"{"):
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
