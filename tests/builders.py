"""Building blocks for test conversations in Chat Completions shape."""

from __future__ import annotations

from typing import Any


def tool_turn(
    call_id: str, content: str, name: str = "read_file", said: str | None = None
) -> list[dict[str, Any]]:
    """An assistant turn making one tool call, and the tool message answering it."""
    return [
        {
            "role": "assistant",
            "content": said,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]
