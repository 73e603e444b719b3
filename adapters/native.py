"""Providers' own token counters (Anthropic `count_tokens`, Gemini `countTokens`), by upstream
`api`: the one list of which upstreams have one (`adapters.upstream_config.NATIVE_COUNT_APIS` is its
keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from brim.adapters.exchange import Exchange

# Fields of a Messages request that `count_tokens` takes; it refuses the others (`max_tokens`,
# `stream`, sampling settings, `metadata`, …) as extra inputs.
ANTHROPIC_COUNT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")
# What of a generateContent request `countTokens` counts (its `generateContentRequest`), in
# either spelling the API accepts.
GEMINI_COUNT_FIELDS = (
    "contents",
    "systemInstruction",
    "system_instruction",
    "tools",
    "toolConfig",
    "tool_config",
)


def _anthropic_count_body(exchange: Exchange) -> dict[str, Any]:
    body = exchange.body or {}
    return {key: body[key] for key in ANTHROPIC_COUNT_FIELDS if key in body}


def _gemini_count_body(exchange: Exchange) -> dict[str, Any]:
    body = exchange.body or {}
    request = {key: body[key] for key in GEMINI_COUNT_FIELDS if key in body}
    return {"generateContentRequest": {"model": f"models/{exchange.model}", **request}}


@dataclass(frozen=True, slots=True)
class NativeCount:
    """A provider's own token counter: which client API's requests it counts, its path (from
    the conversation endpoint's), the body it takes, and the field of its answer."""

    counts: str
    path: Callable[[str], str]
    body: Callable[[Exchange], dict[str, Any]]
    answer: str


NATIVE_COUNTS = {
    "anthropic": NativeCount(
        "anthropic.messages",
        lambda endpoint: f"{endpoint}/count_tokens",  # /v1/messages/count_tokens
        _anthropic_count_body,
        "input_tokens",
    ),
    "gemini": NativeCount(
        "gemini.generate",
        lambda endpoint: f"{endpoint.rpartition(':')[0]}:countTokens",
        _gemini_count_body,
        "totalTokens",
    ),
}


def native_count_for(api: str, exchange: Exchange) -> NativeCount | None:
    """The counter of an upstream of kind `api` that counts `exchange` (a request in the API it
    counts), or None: the upstream has none, or this request is of another API."""
    native = NATIVE_COUNTS.get(api)
    return native if native is not None and native.counts == exchange.api else None
