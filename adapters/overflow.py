"""Is this provider error a context overflow — and what limit does it state?

Providers word it differently; `WORDINGS` holds the wordings (and HTTP 413), each matched against
a whole message, never found inside one: a client can make a provider quote any text back (an
unknown field's name), and that must not read as an overflow. Numbers in the text are kept: the
stated window (`limit`) may teach brim the model's real limit (where brim's own count of the
request bears it out: `policies.evidence`), and the provider's own count of the request
(`requested`) calibrates brim's.
"""

from __future__ import annotations

import dataclasses
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
    output: int | None = None  # the output limit the provider counted in the window
    counts_output: bool = False  # the provider says input and max_tokens share the window
    empty_stream: bool = False  # a 200 stream that ended before any event: nothing to relay


def _n(text: str) -> int:
    return int(text.replace(",", ""))


N = r"([\d,]+)"
# What may follow an overflow sentence: the provider's own closing sentences ("Please reduce the
# length of the messages."), never a colon — so that "<field>: Extra inputs are not permitted",
# Anthropic's answer to an unknown field whose name is an overflow sentence, is not one.
TAIL = r"[^:]*"


@dataclass(frozen=True, slots=True)
class Wording:
    """One provider's overflow sentence: `pattern` must match a message whole (start to end),
    so that the sentence quoted inside another error ("Unrecognized request argument supplied:
    <sentence>") is not taken for it. The groups that hold the stated window (`limit`), the
    provider's count of the request (`requested`) and of its output limit (`output`), where the
    wording states them; `counts_output`: the wording says output shares the window."""

    pattern: re.Pattern[str]
    limit: int | None = None
    requested: tuple[int, ...] = ()  # the first of these groups that matched
    output: int | None = None
    counts_output: bool = False


def _wording(regex: str, **groups: Any) -> Wording:
    return Wording(re.compile(regex, re.I | re.S), **groups)


# The messages' own words, as each provider writes them (tests/adapters/test_overflow.py holds
# one real example of each).
WORDINGS: tuple[Wording, ...] = (
    # OpenAI, Azure OpenAI, OpenRouter ("This endpoint's…"), DeepSeek, vLLM. "you requested N
    # tokens (M in the messages, K in the completion)": the completion shares the window.
    _wording(
        rf"(?:This|The) (?:model|endpoint)'s maximum context length is {N} tokens"
        rf"(?:\.? However, you requested (?:about [\d,]+|{N}) tokens"
        rf"(?: \({N} in the messages,(?: {N} in the functions,)? (?:and )?{N} in the completion\))?"
        rf"|\.? However, your (?:messages resulted in|request has) {N}(?: input)? tokens)?{TAIL}",
        limit=1,
        requested=(2, 6),
        output=5,
    ),
    # vLLM: the output limit is what does not fit
    _wording(
        rf"'max_tokens' or 'max_completion_tokens' is too large: {N}\. This model's maximum "
        rf"context length is {N} tokens and your request has {N} input tokens \({N} > {N} - {N}\)\.?",
        limit=2,
        requested=(3,),
        output=1,
        counts_output=True,
    ),
    _wording(rf"Your input exceeds the context window of this model\.{TAIL}"),  # OpenAI Responses
    # Azure OpenAI
    _wording(
        rf"Input tokens exceed the configured limit of {N} tokens\."
        rf"(?: Your messages resulted in {N} tokens\.)?{TAIL}",
        limit=1,
        requested=(2,),
    ),
    # Anthropic
    _wording(rf"prompt is too long: {N} tokens > {N} maximum", limit=2, requested=(1,)),
    _wording(
        rf"input length and `?max_tokens`? exceed context limit: {N} \+ {N} > {N}{TAIL}",
        limit=3,
        requested=(1,),
        output=2,
        counts_output=True,
    ),
    # Claude Code's own report of it (`claude -p`): "Prompt is too long · the request is ~75257
    # tokens (limit 45000) but this conversation is only ~50681 tokens — …"
    _wording(
        rf"Prompt is too long(?: \W the request is ~?{N} tokens \(limit {N}\){TAIL}"
        rf"| \W {TAIL})?",
        limit=2,
        requested=(1,),
    ),
    # Codex CLI (`codex exec`)
    _wording(rf"(?:Codex )?ran out of room in the model's context window{TAIL}"),
    # Gemini
    _wording(
        rf"The input token count \(?{N}\)? exceeds the maximum number of tokens allowed "
        rf"\(?{N}\)?\.?",
        limit=2,
        requested=(1,),
    ),
    # Bedrock
    _wording(
        rf"(?:ValidationException: |The model returned the following errors: )?"
        rf"(?:Input is too long for requested model|too many input tokens){TAIL}"
    ),
    # Mistral
    _wording(
        rf"Prompt contains {N} tokens(?: and {N} draft tokens)?, too large for model with "
        rf"{N} maximum context length{TAIL}",
        limit=3,
        requested=(1,),
    ),
    # Cerebras, Groq
    _wording(
        rf"Please reduce the length of the messages or completion\.?"
        rf"(?: Current length is {N} while limit is {N})?{TAIL}",
        limit=2,
        requested=(1,),
    ),
    # xAI
    _wording(
        rf"This model's maximum prompt length is {N}(?: but the request contains {N} "
        rf"tokens)?{TAIL}",
        limit=1,
        requested=(2,),
    ),
    # llama.cpp (its window in `n_ctx`), LM Studio, vLLM, llama-cpp-python, Ollama
    _wording(rf"the request exceeds the available context size{TAIL}"),
    _wording(
        rf"(?:The decoder prompt \(length {N}\)|The prompt \(length {N}\)|The number of "
        rf"tokens to keep from the initial prompt) is longer than the (?:model's context length"
        rf"|maximum model length)(?: of)? {N}{TAIL}",
        limit=3,
        requested=(1,),
    ),
    _wording(
        rf"Requested tokens \({N}\) exceed context window of {N}{TAIL}", limit=2, requested=(1,)
    ),
    _wording(
        rf"(?:input|prompt) (?:length )?(?:too long|exceeds (?:the )?max(?:imum)? context "
        rf"length){TAIL}"
    ),
    # Generic wordings, and error codes
    _wording(r"(?:the )?(?:context[ _]length[ _]exceeded|context window (?:is )?exceeded)\.?"),
)

# The errors a provider gives for a field it does not know, naming the field as the client
# spelled it (OpenAI, Anthropic, Gemini): never an overflow, whatever the name says.
ECHOES = re.compile(
    r"Unrecognized request argument supplied|Extra inputs are not permitted|"
    r"Unknown name \"|Unknown parameter|Invalid JSON payload received",
    re.I,
)
# A prefix litellm (and its provider mapping) puts before the provider's own message:
# "litellm.ContextWindowExceededError: litellm.BadRequestError: OpenAIException - <message>".
LITELLM_PREFIX = re.compile(
    r"(?:(?:litellm\.)?\w+(?:Error|Exception)(?::| -) |Context Window Error - )+"
)
# Claude Code's report of a provider's error reply: "API Error: 400 {…the provider's body…}".
CLI_API_ERROR = re.compile(r"API Error: (\d{3}) (\{.*\})", re.S)
MAX_DEPTH = 2  # replies wrapped in replies, read at most this deep


def read_wording(text: str) -> Overflow | None:
    """The overflow a provider's message states, if the message is one of `WORDINGS` whole."""
    text = text.strip()
    for wording in WORDINGS:
        match = wording.pattern.fullmatch(text)
        if match is None:
            continue

        def number(*groups: int | None, match: re.Match[str] = match) -> int | None:
            found = next((match.group(g) for g in groups if g and match.group(g)), None)
            return _n(found) if found else None

        output = number(wording.output)
        return Overflow(
            message=text,
            limit=number(wording.limit),
            requested=number(*wording.requested),
            output=output,
            counts_output=wording.counts_output or output is not None,
        )
    return None


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


def classify(status: int, body: bytes | str, *, depth: int = 0) -> Overflow | None:
    """An `Overflow` if the reply says the request was too long for the model, else None.

    Only a provider's own words count: a message that is one of `WORDINGS` whole, an overflow
    error code, HTTP 413. An error about a field the provider does not know (`ECHOES`) is never
    one, whatever the field's name says; nor is a sentence quoted inside another message."""
    if status in NOT_OVERFLOW_STATUSES or (status < 400 and status != 200):
        return None
    raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload: Any = orjson.loads(raw) if raw.strip()[:1] in ("{", "[") else raw
    except orjson.JSONDecodeError:
        payload = raw
    texts = _messages(payload) or [raw]
    if any(ECHOES.search(text) for text in texts):
        return None
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
        found = _read(status, text, depth)
        if found is not None:
            return dataclasses.replace(
                found,
                limit=found.limit or field_limit,
                requested=found.requested or field_requested,
            )
    if isinstance(code, str) and code in OVERFLOW_CODES:
        return Overflow(message=message, limit=field_limit, requested=field_requested)
    if status == 413:
        return Overflow(message=message or "request entity too large")
    return None


def _read(status: int, text: str, depth: int) -> Overflow | None:
    """The overflow one message states: in its own words, or the provider's reply that a relay
    wrapped in its own (litellm's prefixes; Claude Code's "API Error: 400 {body}")."""
    text = text.strip()
    prefix = LITELLM_PREFIX.match(text)
    if prefix is not None:
        text = text[prefix.end() :]
    if depth < MAX_DEPTH:
        relayed = CLI_API_ERROR.fullmatch(text)
        if relayed is not None:
            return classify(int(relayed.group(1)), relayed.group(2), depth=depth + 1)
        if text.startswith("{") and prefix is not None:
            return classify(status, text, depth=depth + 1)
    return read_wording(text)
