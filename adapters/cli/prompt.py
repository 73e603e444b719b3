"""The conversation as one prompt: what a coding CLI reads on its stdin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

PREAMBLE = (
    "Below is a conversation between a user and an AI assistant, turn by turn. Reply as the "
    "assistant to the last turn: write only the assistant's next message."
)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("refusal"), str):
                    parts.append(part["refusal"])
                elif kind in ("image_url", "input_image", "image"):
                    parts.append("[an image, not shown]")
                elif kind in ("input_audio", "audio"):
                    parts.append("[an audio clip, not shown]")
                elif kind in ("file", "input_file"):
                    parts.append("[a file, not shown]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def render_prompt(messages: Sequence[Any]) -> str:
    """The conversation as one prompt: a lone user message as it is; anything more as tagged
    turns — system and developer prompts, user and assistant turns, each tool call with its id,
    name and arguments, each tool result with the id it answers."""
    items = [m for m in messages if isinstance(m, dict)]
    if len(items) == 1 and items[0].get("role") == "user":
        return _content_text(items[0].get("content"))
    blocks = [PREAMBLE]
    for message in items:
        role = str(message.get("role") or "user")
        text = _content_text(message.get("content"))
        if role in ("system", "developer"):
            blocks.append(f"<system>\n{text}\n</system>")
        elif role == "assistant":
            lines = [text] if text else []
            for call in message.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                function = call.get("function") or {}
                lines.append(
                    f'<tool_call id="{call.get("id", "")}" name="{function.get("name", "")}">'
                    f"{function.get('arguments', '')}</tool_call>"
                )
            legacy = message.get("function_call")
            if isinstance(legacy, dict):
                lines.append(
                    f'<tool_call name="{legacy.get("name", "")}">'
                    f"{legacy.get('arguments', '')}</tool_call>"
                )
            body = "\n".join(lines)
            blocks.append(f"<assistant>\n{body}\n</assistant>")
        elif role in ("tool", "function"):
            answered = message.get("tool_call_id") or message.get("name") or ""
            blocks.append(f'<tool_result id="{answered}">\n{text}\n</tool_result>')
        else:
            blocks.append(f"<user>\n{text}\n</user>")
    return "\n\n".join(blocks) + "\n"
