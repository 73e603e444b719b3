"""The wire APIs brim serves, one module each behind one Protocol (`base.Wire`).

Stages and routes ask the wire object; nothing else branches on an API's name. Adding an API
costs its module and one line in `WIRES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brim.policies.wires.base import Wire
from brim.policies.wires.chat import CHAT
from brim.policies.wires.gemini import GEMINI
from brim.policies.wires.messages import MESSAGES
from brim.policies.wires.responses import RESPONSES

WIRES: dict[str, Wire] = {wire.name: wire for wire in (CHAT, MESSAGES, RESPONSES, GEMINI)}

# Every endpoint's API name → its wire (e.g. "anthropic.count_tokens" → Messages).
BY_ENDPOINT: Mapping[str, Wire] = {api: w for w in WIRES.values() for api in w.serving}


def wire_for(api: str) -> Wire:
    """The wire of any endpoint brim serves (for its errors); Chat Completions if unknown."""
    return BY_ENDPOINT.get(api, CHAT)


def conversation_wire(api: str) -> Wire | None:
    """The wire of a conversation endpoint (the ones the pipeline guards), else None."""
    return WIRES.get(api)


def wire_for_path(path: str) -> Wire:
    """Which wire a client on this URL path expects its errors from; Chat Completions (OpenAI's
    shape) for any path no wire claims. No two wires claim one path, so the order is free."""
    return next((wire for wire in WIRES.values() if wire.owns_path(path)), CHAT)


def wire_of_body(body: Mapping[str, Any]) -> Wire:
    """Which wire API a saved request body is written in, from its shape alone: Gemini has
    `contents`, Responses `input`, Anthropic Messages a top-level `system` or content blocks only
    it has; anything else is read as Chat Completions."""
    if "contents" in body:
        return GEMINI
    if "input" in body and "messages" not in body:
        return RESPONSES
    if "system" in body:
        return MESSAGES
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, Mapping) and block.get("type") in _ANTHROPIC_BLOCKS:
                return MESSAGES
    return CHAT


_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "image", "document", "thinking"})
