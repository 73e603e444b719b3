"""Wire dialects for the neutral view. Chat Completions so far (Anthropic and Responses later)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.conversation import ToolResult, Unit

NO_RESULT = "[no result was recorded for this tool call]"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


class ChatDialect:
    """OpenAI Chat Completions: `tool_calls[].id` on assistant messages, answered by the `tool`
    messages (`tool_call_id`) that immediately follow. Leading system/developer messages are the
    system prompt; brim's notices are system messages too."""

    name = "openai.chat"

    @staticmethod
    def role(message: Any) -> str:
        return str(message.get("role", "")) if isinstance(message, Mapping) else ""

    def calls(self, message: Any) -> list[str]:
        if self.role(message) != "assistant":
            return []
        return [
            str(call.get("id"))
            for call in message.get("tool_calls") or ()
            if isinstance(call, Mapping) and call.get("id") is not None
        ]

    def units(self, messages: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(messages):
            role = self.role(messages[index])
            if role == "assistant" and self.calls(messages[index]):
                end = index + 1
                while end < len(messages) and self.role(messages[end]) == "tool":
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            kind = {
                "system": "system",
                "developer": "system",
                "user": "user",
                "assistant": "assistant",
                "tool": "orphan",
            }.get(role, "user")
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        for message in messages:
            if self.role(message) != "assistant":
                continue
            for call in message.get("tool_calls") or ():
                if isinstance(call, Mapping) and call.get("id") is not None:
                    function = call.get("function") or {}
                    names[str(call["id"])] = str(function.get("name") or "tool")
        return names

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if self.role(message) != "tool":
            return []
        call_id = str(message.get("tool_call_id", ""))
        text = _text_of(message.get("content"))
        return [ToolResult(call_id, tools_by_call.get(call_id, "tool"), text)]

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any:
        return {**message, "content": text}

    def text(self, message: Any) -> str:
        return _text_of(message.get("content")) if isinstance(message, Mapping) else ""

    def largest_text(self, message: Any) -> str | None:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            return content
        texts = (
            [
                part["text"]
                for part in content or ()
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            ]
            if isinstance(content, list)
            else []
        )
        return max(texts, key=len) if texts else None

    def with_largest_text(self, message: Any, text: str) -> Any:
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": text}
        largest = self.largest_text(message)
        parts = list(content)
        for position, part in enumerate(parts):
            if isinstance(part, Mapping) and part.get("text") == largest:
                parts[position] = {**part, "text": text}
                break
        return {**message, "content": parts}

    def notice(self, text: str) -> Any:
        return {"role": "system", "content": text}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def violations(self, messages: Sequence[Any]) -> list[str]:
        """Where `messages` break the pairing rules OpenAI enforces (empty: none)."""
        problems: list[str] = []
        pending: list[str] = []
        answered: set[str] = set()
        in_group = False
        for index, message in enumerate(messages):
            role = self.role(message)
            if role == "tool":
                call_id = str(message.get("tool_call_id", ""))
                if not in_group or call_id not in pending:
                    reason = "answered already" if call_id in answered else "answers no open call"
                    problems.append(f"messages[{index}]: tool result {call_id!r} {reason}")
                else:
                    pending.remove(call_id)
                    answered.add(call_id)
                continue
            if pending:
                problems.append(f"messages[{index}]: tool calls {pending} have no result")
            calls = self.calls(message)
            pending, answered, in_group = list(calls), set(), bool(calls)
        if pending:
            problems.append(f"end of messages: tool calls {pending} have no result")
        return problems

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """The smallest change that makes the pairing valid: orphan or duplicate results are
        dropped, unanswered calls get a short placeholder result. Returns what was done."""
        out: list[Any] = []
        done: list[str] = []
        pending: list[str] = []
        in_group = False

        def close() -> None:
            for call_id in pending:
                out.append(self.placeholder_result(call_id))
                done.append(f"added a result for unanswered call {call_id!r}")
            pending.clear()

        for message in messages:
            role = self.role(message)
            if role == "tool":
                call_id = str(message.get("tool_call_id", ""))
                if in_group and call_id in pending:
                    pending.remove(call_id)
                    out.append(message)
                else:
                    done.append(f"dropped tool result {call_id!r} that answers no open call")
                continue
            close()
            calls = self.calls(message)
            pending, in_group = list(dict.fromkeys(calls)), bool(calls)
            out.append(message)
        close()
        return out, done
