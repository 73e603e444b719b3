"""Is this provider error a context overflow — and what limit does it state?

Providers word it differently; this table holds the wordings (and HTTP 413). Numbers in the text
are kept: the stated window (`limit`) teaches brim the model's real limit, and the provider's own
count of the request (`requested`) calibrates brim's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

NOT_OVERFLOW_STATUSES = frozenset({401, 403, 404, 408, 429})
OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# A field over the provider's length limit in characters (OpenAI's "Invalid 'messages[0].content':
# string too long. Expected a string with maximum length 10485760…", also for 'user' or a tool
# name). Not the context window: cutting the conversation would not make it pass, so no retry.
NOT_OVERFLOW_CODES = frozenset({"string_above_max_length"})
_NOT_OVERFLOW_TEXT = re.compile(r"\bstring too long\b", re.I)


@dataclass(frozen=True, slots=True)
class Overflow:
    message: str
    limit: int | None = None  # the window the provider states
    requested: int | None = None  # the provider's count of what was sent
    counts_output: bool = False  # the provider says input and max_tokens share the window
    empty_stream: bool = False  # a 200 stream that ended before any event: nothing to relay


def _n(text: str) -> int:
    return int(text.replace(",", ""))


N = r"([\d,]+)"
# (pattern, group holding the limit or None, group holding the requested count or None)
PATTERNS: list[tuple[re.Pattern[str], int | None, int | None]] = [
    # OpenAI, OpenRouter ("This endpoint's…"), DeepSeek, vLLM (OpenAI-compatible wording)
    (
        re.compile(
            rf"maximum context length is {N} tokens(?:.*?you requested {N} tokens)?", re.I | re.S
        ),
        1,
        2,
    ),
    (re.compile(r"input exceeds the context window", re.I), None, None),  # OpenAI Responses
    # Azure OpenAI
    (
        re.compile(
            rf"input tokens exceed the configured limit(?: of {N})?(?:.*?resulted in {N})?",
            re.I | re.S,
        ),
        1,
        2,
    ),
    # Anthropic
    (re.compile(rf"prompt is too long: {N} tokens > {N} maximum", re.I), 2, 1),
    # Claude Code's own report of it (`claude -p`): "Prompt is too long · the request is ~75257
    # tokens (limit 45000) …"
    (re.compile(rf"prompt is too long\W+the request is ~?{N} tokens \(limit {N}\)", re.I), 2, 1),
    # Codex CLI (`codex exec`)
    (re.compile(r"ran out of room in the model's context window", re.I), None, None),
    (
        re.compile(
            rf"input length and `?max_tokens`? exceed context limit: {N} \+ {N} > {N}", re.I
        ),
        3,
        1,
    ),
    # Gemini
    (
        re.compile(
            rf"input token count \(?{N}\)? exceeds the maximum number of tokens allowed \(?{N}\)?",
            re.I,
        ),
        2,
        1,
    ),
    # Bedrock
    (re.compile(r"input is too long|too many input tokens", re.I), None, None),
    # Mistral
    (
        re.compile(
            rf"prompt contains {N} tokens.*?too large for model with {N} maximum context length",
            re.I | re.S,
        ),
        2,
        1,
    ),
    (re.compile(rf"too large for model with {N} maximum context length", re.I), 1, None),
    # Cerebras, Groq
    (re.compile(rf"current length is {N} while limit is {N}", re.I), 2, 1),
    (re.compile(r"please reduce the length of the messages or completion", re.I), None, None),
    # xAI
    (
        re.compile(rf"maximum prompt length is {N}(?: but the request contains {N} tokens)?", re.I),
        1,
        2,
    ),
    # llama.cpp, LM Studio, vLLM, llama-cpp-python, Ollama
    (re.compile(r"exceeds the available context size", re.I), None, None),
    (
        re.compile(
            rf"(?:length {N}\) )?is longer than the (?:model's context length|maximum model length)(?: of)? ?{N}?",
            re.I,
        ),
        2,
        1,
    ),
    (re.compile(rf"requested tokens \({N}\) exceed context window of {N}", re.I), 2, 1),
    (
        re.compile(
            rf"(?:input|prompt) (?:length )?(?:too long|exceeds (?:the )?max(?:imum)? context length)(?:.*?{N})?",
            re.I | re.S,
        ),
        None,
        None,
    ),
    # Generic wordings
    (
        re.compile(
            r"context[ _]length[ _]exceeded|context window (?:is )?exceeded|exceeds? (?:the )?context window",
            re.I,
        ),
        None,
        None,
    ),
]


_SHARED_WINDOW = re.compile(r"input length and `?max_tokens`? exceed|in the completion", re.I)


def _messages(payload: Any) -> list[str]:
    """Every message-like string in a provider's error body, outermost first."""
    found: list[str] = []
    if isinstance(payload, str):
        found.append(payload)
    elif isinstance(payload, Mapping):
        for key in ("message", "error", "response", "detail", "msg", "type", "code", "status"):
            if key in payload:
                found += _messages(payload[key])
    elif isinstance(payload, list):
        for item in payload[:5]:
            found += _messages(item)
    return found


def _field(payload: Any, *names: str) -> Any:
    if isinstance(payload, Mapping):
        for name in names:
            if name in payload:
                return payload[name]
        error = payload.get("error")
        if isinstance(error, Mapping):
            return _field(error, *names)
    return None


def classify(status: int, body: bytes | str) -> Overflow | None:
    """An `Overflow` if the reply says the request was too long for the model, else None."""
    if status in NOT_OVERFLOW_STATUSES or (status < 400 and status != 200):
        return None
    raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload: Any = orjson.loads(raw) if raw.strip()[:1] in ("{", "[") else raw
    except orjson.JSONDecodeError:
        payload = raw
    texts = _messages(payload) or [raw]
    message = next((t for t in texts if len(t) > 12), texts[0] if texts else "")
    n_ctx, n_prompt = _field(payload, "n_ctx"), _field(payload, "n_prompt_tokens")  # llama.cpp
    field_limit = n_ctx if isinstance(n_ctx, int) else None
    field_requested = n_prompt if isinstance(n_prompt, int) else None
    code = _field(payload, "code", "type")
    if (isinstance(code, str) and code in NOT_OVERFLOW_CODES) or any(
        _NOT_OVERFLOW_TEXT.search(text) for text in texts
    ):
        return None
    for text in texts:
        for pattern, limit_group, requested_group in PATTERNS:
            match = pattern.search(text)
            if match:
                limit = match.group(limit_group) if limit_group else None
                requested = match.group(requested_group) if requested_group else None
                return Overflow(
                    message=text,
                    limit=_n(limit) if limit else field_limit,
                    requested=_n(requested) if requested else field_requested,
                    counts_output=bool(_SHARED_WINDOW.search(text)),
                )
    if isinstance(code, str) and code in OVERFLOW_CODES:
        return Overflow(message=message, limit=field_limit, requested=field_requested)
    if status == 413:
        return Overflow(message=message or "request entity too large")
    return None
