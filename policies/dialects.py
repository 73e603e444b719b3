"""Wire dialects for the neutral view. Chat Completions so far (Anthropic and Responses later)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from policies.conversation import ToolResult, Unit

NO_RESULT = "[no result was recorded for this tool call]"


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""


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


def _repeats(ids: Sequence[str]) -> list[str]:
    """Ids that occur more than once, in order of their first repeat."""
    seen: set[str] = set()
    repeated: list[str] = []
    for item in ids:
        if item in seen and item not in repeated:
            repeated.append(item)
        seen.add(item)
    return repeated


def _first_of_each(items: Sequence[Any], id_of: Callable[[Any], str | None]) -> list[Any]:
    """`items` without those whose id (`id_of(item)`, None for items without one) came before."""
    seen: set[str] = set()
    kept = []
    for item in items:
        key = id_of(item)
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept.append(item)
    return kept


class ChatDialect:
    """OpenAI Chat Completions: `tool_calls[].id` on assistant messages, answered by the `tool`
    messages (`tool_call_id`) that immediately follow. Leading system/developer messages are the
    system prompt; brim's notices are system messages too."""

    name = "openai.chat"

    role = staticmethod(_role)

    def calls(self, message: Any) -> list[str]:
        if self.role(message) != "assistant":
            return []
        return [i for call in message.get("tool_calls") or () if (i := _call_id(call)) is not None]

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
            if repeated := _repeats(calls):
                problems.append(f"messages[{index}]: tool call ids {repeated} repeat")
            pending, answered, in_group = list(dict.fromkeys(calls)), set(), bool(calls)
        if pending:
            problems.append(f"end of messages: tool calls {pending} have no result")
        return problems

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """The smallest change that makes the pairing valid: orphan or duplicate results are
        dropped, a call repeating an id in its message is dropped, unanswered calls get a short
        placeholder result. Returns what was done."""
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
            if repeated := _repeats(calls):
                message = {**message, "tool_calls": _first_of_each(message["tool_calls"], _call_id)}
                done.append(f"dropped repeated tool calls {repeated}")
            pending, in_group = list(dict.fromkeys(calls)), bool(calls)
            out.append(message)
        close()
        return out, done


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _block_text(block: Any) -> str:
    if not isinstance(block, Mapping):
        return ""
    if block.get("type") == "text":
        return str(block.get("text", ""))
    if block.get("type") == "tool_result":
        return _text_of(block.get("content"))
    return ""


class AnthropicDialect:
    """Anthropic Messages: `tool_use` blocks in an assistant message are answered by
    `tool_result` blocks (which must come first) in the very next user message; the two messages
    form one unit. `system` is outside `messages`, so it is fixed cost. Assistant messages with
    `thinking` / `redacted_thinking` blocks are never edited — only removed whole."""

    name = "anthropic.messages"

    role = staticmethod(_role)

    def calls(self, message: Any) -> list[str]:
        if self.role(message) != "assistant":
            return []
        return [
            i for block in _blocks(message.get("content")) if (i := _tool_use_id(block)) is not None
        ]

    def answers(self, message: Any) -> list[str]:
        if self.role(message) != "user":
            return []
        return [
            str(block.get("tool_use_id"))
            for block in _blocks(message.get("content"))
            if isinstance(block, Mapping) and block.get("type") == "tool_result"
        ]

    @staticmethod
    def thinks(message: Any) -> bool:
        return any(
            isinstance(block, Mapping) and block.get("type") in ("thinking", "redacted_thinking")
            for block in _blocks(message.get("content") if isinstance(message, Mapping) else None)
        )

    def units(self, messages: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(messages):
            message = messages[index]
            if self.calls(message):
                end = index + 1
                if end < len(messages) and self.answers(messages[end]):
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            role = self.role(message)
            kind = (
                "orphan"
                if self.answers(message)
                else ("assistant" if role == "assistant" else "user")
            )
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        for message in messages:
            if self.role(message) == "assistant":
                for block in _blocks(message.get("content")):
                    if isinstance(block, Mapping) and block.get("type") == "tool_use":
                        names[str(block.get("id"))] = str(block.get("name") or "tool")
        return names

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if self.role(message) != "user" or not isinstance(message.get("content"), list):
            return []
        return [
            ToolResult(
                str(block.get("tool_use_id")),
                tools_by_call.get(str(block.get("tool_use_id")), "tool"),
                _text_of(block.get("content")),
            )
            for block in message["content"]
            if isinstance(block, Mapping)
            and block.get("type") == "tool_result"
            and _text_of(block.get("content"))
        ]

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any:
        content = [
            {**block, "content": text}
            if isinstance(block, Mapping)
            and block.get("type") == "tool_result"
            and str(block.get("tool_use_id")) == call_id
            else block
            for block in message["content"]
        ]
        return {**message, "content": content}

    def text(self, message: Any) -> str:
        if not isinstance(message, Mapping):
            return ""
        return "\n".join(
            block["text"]
            for block in _blocks(message.get("content"))
            if isinstance(block, Mapping) and block.get("type") == "text"
        )

    def largest_text(self, message: Any) -> str | None:
        if not isinstance(message, Mapping) or self.thinks(message):
            return None
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [_block_text(block) for block in _blocks(content)]
        texts = [text for text in texts if text]
        return max(texts, key=len) if texts else None

    def with_largest_text(self, message: Any, text: str) -> Any:
        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": text}
        largest = self.largest_text(message)
        blocks = list(content)
        for position, block in enumerate(blocks):
            if _block_text(block) == largest:
                field = "text" if block.get("type") == "text" else "content"
                blocks[position] = {**block, field: text}
                break
        return {**message, "content": blocks}

    def notice(self, text: str) -> Any:
        return {"role": "user", "content": text}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "user", "content": [_result_block(call_id, text)]}

    def violations(self, messages: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        if messages and self.role(messages[0]) != "user":
            problems.append("messages[0]: the first message must be a user message")
        for index, message in enumerate(messages):
            role = self.role(message)
            if role not in ("user", "assistant"):
                problems.append(f"messages[{index}]: role {role!r} is not user or assistant")
            answered = self.answers(message)
            if answered:
                previous = messages[index - 1] if index else None
                open_calls = self.calls(previous)
                for call_id in answered:
                    if call_id not in open_calls:
                        problems.append(
                            f"messages[{index}]: tool_result {call_id!r} answers no tool_use of the previous message"
                        )
                if len(set(answered)) != len(answered):
                    problems.append(f"messages[{index}]: a tool_use is answered twice")
                kinds = [
                    b.get("type") for b in _blocks(message.get("content")) if isinstance(b, Mapping)
                ]
                if kinds[: len(answered)] != ["tool_result"] * len(answered):
                    problems.append(f"messages[{index}]: tool_result blocks must come first")
            calls = self.calls(message)
            if repeated := _repeats(calls):
                problems.append(f"messages[{index}]: tool_use ids {repeated} repeat")
            if calls:
                following = messages[index + 1] if index + 1 < len(messages) else None
                missing = [c for c in calls if c not in self.answers(following)]
                if missing:
                    problems.append(
                        f"messages[{index}]: tool_use {missing} not answered in the next message"
                    )
        return problems

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Drop tool_result blocks that answer nothing (and messages left empty) and tool_use
        blocks repeating an id in their message (not in thinking turns: those are never edited),
        add a placeholder result for each unanswered tool_use, put results first, start with a
        user."""
        out: list[Any] = []
        done: list[str] = []
        for message in messages:
            open_calls = self.calls(out[-1]) if out else []
            if self.role(message) == "user":
                fixed, notes = self._fix_results(message, open_calls)
                done += notes
                if fixed is not None:
                    out.append(fixed)
                continue
            if open_calls:  # the previous assistant's tool_use got no user message after it
                out.append({"role": "user", "content": [_result_block(c) for c in open_calls]})
                done.append(f"added results for unanswered tool_use {open_calls}")
            if (repeated := _repeats(self.calls(message))) and not self.thinks(message):
                blocks = _first_of_each(_blocks(message.get("content")), _tool_use_id)
                message = {**message, "content": blocks}
                done.append(f"dropped repeated tool_use {repeated}")
            out.append(message)
        if out and self.calls(out[-1]):
            out.append({"role": "user", "content": [_result_block(c) for c in self.calls(out[-1])]})
            done.append("added results for the last message's unanswered tool_use")
        if out and self.role(out[0]) != "user":
            out.insert(0, {"role": "user", "content": "[earlier messages were removed]"})
            done.append("started the conversation with a user message")
        return out, done

    def _fix_results(self, message: Any, open_calls: list[str]) -> tuple[Any | None, list[str]]:
        blocks = _blocks(message.get("content"))
        results, others, notes, seen = [], [], [], set()
        for block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                call_id = str(block.get("tool_use_id"))
                if call_id in open_calls and call_id not in seen:
                    results.append(block)
                    seen.add(call_id)
                else:
                    notes.append(f"dropped tool_result {call_id!r} that answers no tool_use")
            else:
                others.append(block)
        missing = [c for c in open_calls if c not in seen]
        if missing:
            notes.append(f"added results for unanswered tool_use {missing}")
        results += [_result_block(c) for c in missing]
        fixed_blocks = results + others
        if not notes and [b.get("type") if isinstance(b, Mapping) else None for b in blocks] == [
            b.get("type") if isinstance(b, Mapping) else None for b in fixed_blocks
        ]:
            return message, []
        if not fixed_blocks:
            return None, notes
        if not notes:
            notes.append("moved tool_result blocks before the other content")
        return {**message, "content": fixed_blocks}, notes


def _call_id(call: Any) -> str | None:
    return str(call["id"]) if isinstance(call, Mapping) and call.get("id") is not None else None


def _tool_use_id(block: Any) -> str | None:
    if isinstance(block, Mapping) and block.get("type") == "tool_use":
        return str(block.get("id"))
    return None


def _result_block(call_id: str, text: str = NO_RESULT) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


DIALECTS: dict[str, Any] = {"openai.chat": ChatDialect(), "anthropic.messages": AnthropicDialect()}


CALL_TYPES = {"function_call", "custom_tool_call", "local_shell_call"}
OUTPUT_OF = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
}
OUTPUT_TYPES = set(OUTPUT_OF.values())


def _kind(item: Any) -> str:
    if not isinstance(item, Mapping):
        return ""
    return str(item.get("type") or ("message" if "role" in item else ""))


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping):
        return str(output.get("output") or output.get("text") or "")
    return _text_of(output)


class ResponsesDialect:
    """OpenAI Responses `input` items: `function_call` (and custom / local shell calls) answered
    by the output item with the same `call_id`, somewhere later; a calling block (reasoning items
    and calls) with the outputs that follow is one unit. `reasoning` items — `encrypted_content`
    never touched — stay with the item after them. `instructions` is fixed cost."""

    name = "openai.responses"

    def role(self, item: Any) -> str:
        kind = _kind(item)
        if kind == "message":
            return str(item.get("role", "user"))
        if kind in OUTPUT_TYPES:
            return "tool"
        return "assistant" if kind in CALL_TYPES or kind == "reasoning" else kind

    def calls(self, item: Any) -> list[str]:
        return [str(item.get("call_id"))] if _kind(item) in CALL_TYPES else []

    def answers(self, item: Any) -> list[str]:
        return [str(item.get("call_id"))] if _kind(item) in OUTPUT_TYPES else []

    def units(self, items: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(items):
            kind = _kind(items[index])
            if kind in ("reasoning", *CALL_TYPES):
                end = index
                while end < len(items) and _kind(items[end]) in ("reasoning", *CALL_TYPES):
                    end += 1
                has_calls = any(_kind(items[i]) in CALL_TYPES for i in range(index, end))
                if not has_calls:  # reasoning before a message: kept (or dropped) together
                    end = min(end + 1, len(items))
                    units.append(Unit("assistant", index, end))
                    index = end
                    continue
                while end < len(items) and _kind(items[end]) in OUTPUT_TYPES:
                    end += 1
                units.append(Unit("tools", index, end))
                index = end
                continue
            role = self.role(items[index])
            unit_kind = {
                "system": "system",
                "developer": "system",
                "user": "user",
                "assistant": "assistant",
                "tool": "orphan",
            }.get(role, "assistant")
            units.append(Unit(unit_kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, items: Sequence[Any]) -> dict[str, str]:
        return {
            str(item.get("call_id")): str(item.get("name") or _kind(item))
            for item in items
            if _kind(item) in CALL_TYPES
        }

    def tool_results(self, item: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        if _kind(item) not in OUTPUT_TYPES:
            return []
        call_id = str(item.get("call_id"))
        return [
            ToolResult(
                call_id, tools_by_call.get(call_id, "tool"), _output_text(item.get("output"))
            )
        ]

    def with_tool_result(self, item: Any, call_id: str, text: str) -> Any:
        return {**item, "output": text}

    def text(self, item: Any) -> str:
        return _text_of(item.get("content")) if _kind(item) == "message" else ""

    def largest_text(self, item: Any) -> str | None:
        kind = _kind(item)
        if kind in OUTPUT_TYPES:
            return _output_text(item.get("output")) or None
        if kind != "message":
            return None
        content = item.get("content")
        if isinstance(content, str):
            return content
        texts = [
            str(p.get("text")) for p in content or [] if isinstance(p, Mapping) and p.get("text")
        ]
        return max(texts, key=len) if texts else None

    def with_largest_text(self, item: Any, text: str) -> Any:
        if _kind(item) in OUTPUT_TYPES:
            return {**item, "output": text}
        content = item.get("content")
        if isinstance(content, str):
            return {**item, "content": text}
        largest = self.largest_text(item)
        parts = list(content)
        for position, part in enumerate(parts):
            if isinstance(part, Mapping) and part.get("text") == largest:
                parts[position] = {**part, "text": text}
                break
        return {**item, "content": parts}

    def notice(self, text: str) -> Any:
        return {"type": "message", "role": "developer", "content": text}

    def placeholder_result(
        self, call_id: str, text: str = NO_RESULT, kind: str = "function_call"
    ) -> Any:
        return {
            "type": OUTPUT_OF.get(kind, "function_call_output"),
            "call_id": call_id,
            "output": text,
        }

    def violations(self, items: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        called: dict[str, int] = {}
        answered: set[str] = set()
        for index, item in enumerate(items):
            for call_id in self.calls(item):
                called[call_id] = index
            for call_id in self.answers(item):
                if call_id not in called:
                    problems.append(f"input[{index}]: output for {call_id!r} has no earlier call")
                elif call_id in answered:
                    problems.append(f"input[{index}]: {call_id!r} is answered twice")
                answered.add(call_id)
        for call_id, index in called.items():
            if call_id not in answered:
                problems.append(f"input[{index}]: no tool output found for call {call_id!r}")
        return problems

    def repaired(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Outputs with no earlier call are dropped; a call with no output gets a placeholder
        right after its calling block."""
        answered = {c for item in items for c in self.answers(item)}
        out: list[Any] = []
        done: list[str] = []
        called: set[str] = set()
        seen: set[str] = set()
        pending: list[tuple[str, str]] = []
        for item in items:
            kind = _kind(item)
            if kind not in ("reasoning", *CALL_TYPES, *OUTPUT_TYPES) and pending:
                out += [self.placeholder_result(c, kind=k) for c, k in pending]
                done += [f"added an output for call {c!r}" for c, _ in pending]
                pending = []
            if kind in OUTPUT_TYPES:
                call_id = str(item.get("call_id"))
                if call_id not in called or call_id in seen:
                    done.append(f"dropped an output for {call_id!r} that answers no earlier call")
                    continue
                seen.add(call_id)
            for call_id in self.calls(item):
                called.add(call_id)
                if call_id not in answered:
                    pending.append((call_id, kind))
            out.append(item)
        out += [self.placeholder_result(c, kind=k) for c, k in pending]
        done += [f"added an output for call {c!r}" for c, _ in pending]
        return out, done


DIALECTS["openai.responses"] = ResponsesDialect()
CONVERSATION_FIELD = {"openai.responses": "input"}


def conversation_of(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The request's conversation (messages, or Responses `input` items) as a list."""
    value = body.get(CONVERSATION_FIELD.get(api, "messages"))
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def with_conversation(api: str, body: Mapping[str, Any], items: Sequence[Any]) -> dict[str, Any]:
    return {**body, CONVERSATION_FIELD.get(api, "messages"): list(items)}


def _parts(item: Any) -> list[Any]:
    parts = item.get("parts") if isinstance(item, Mapping) else None
    return list(parts) if isinstance(parts, list) else []


class GeminiDialect:
    """Gemini generateContent `contents`: a `model` turn's `functionCall` parts are answered by
    the `functionResponse` parts of the very next `user` turn (by `id` where present, else by
    name, in order); the two turns are one unit. `thought` parts and `thoughtSignature`s are never
    edited. `systemInstruction` and `tools` are fixed cost."""

    name = "gemini.generate"

    @staticmethod
    def role(item: Any) -> str:
        return str(item.get("role", "user")) if isinstance(item, Mapping) else ""

    @staticmethod
    def _call_key(call: Mapping[str, Any]) -> str:
        return str(call.get("id") or call.get("name") or "")

    def calls(self, item: Any) -> list[str]:
        if self.role(item) != "model":
            return []
        return [
            self._call_key(p["functionCall"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        ]

    def answers(self, item: Any) -> list[str]:
        if self.role(item) != "user":
            return []
        return [
            self._call_key(p["functionResponse"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
        ]

    def units(self, items: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(items):
            if self.calls(items[index]):
                end = (
                    index + 2
                    if index + 1 < len(items) and self.answers(items[index + 1])
                    else index + 1
                )
                units.append(Unit("tools", index, end))
                index = end
                continue
            kind = (
                "orphan"
                if self.answers(items[index])
                else ("assistant" if self.role(items[index]) == "model" else "user")
            )
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, items: Sequence[Any]) -> dict[str, str]:
        return {
            self._call_key(p["functionCall"]): str(p["functionCall"].get("name", "tool"))
            for item in items
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        }

    def tool_results(self, item: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        results = []
        for part in _parts(item) if self.role(item) == "user" else []:
            response = part.get("functionResponse") if isinstance(part, Mapping) else None
            if isinstance(response, Mapping):
                text = (
                    orjson.dumps(response.get("response")).decode()
                    if not isinstance(response.get("response"), str)
                    else str(response.get("response"))
                )
                results.append(
                    ToolResult(self._call_key(response), str(response.get("name", "tool")), text)
                )
        return results

    def with_tool_result(self, item: Any, call_id: str, text: str) -> Any:
        parts = [
            {**p, "functionResponse": {**p["functionResponse"], "response": {"output": text}}}
            if isinstance(p, Mapping)
            and isinstance(p.get("functionResponse"), Mapping)
            and self._call_key(p["functionResponse"]) == call_id
            else p
            for p in _parts(item)
        ]
        return {**item, "parts": parts}

    def text(self, item: Any) -> str:
        return "\n".join(
            str(p["text"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought")
        )

    def largest_text(self, item: Any) -> str | None:
        if any(
            isinstance(p, Mapping) and (p.get("thought") or p.get("thoughtSignature"))
            for p in _parts(item)
        ):
            return None
        texts = [
            str(p["text"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]
        return max(texts, key=len) if texts else None

    def with_largest_text(self, item: Any, text: str) -> Any:
        largest = self.largest_text(item)
        parts = _parts(item)
        for position, part in enumerate(parts):
            if isinstance(part, Mapping) and part.get("text") == largest:
                parts[position] = {**part, "text": text}
                break
        return {**item, "parts": parts}

    def notice(self, text: str) -> Any:
        return {"role": "user", "parts": [{"text": text}]}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {
            "role": "user",
            "parts": [{"functionResponse": {"name": call_id, "response": {"output": text}}}],
        }

    def violations(self, items: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        for index, item in enumerate(items):
            if self.role(item) not in ("user", "model"):
                problems.append(f"contents[{index}]: role must be user or model")
            answered = self.answers(item)
            if answered:
                previous = self.calls(items[index - 1]) if index else []
                if sorted(answered) != sorted(previous):
                    problems.append(
                        f"contents[{index}]: function responses {answered} do not answer the calls {previous} of the turn before"
                    )
            calls = self.calls(item)
            if calls:
                following = self.answers(items[index + 1]) if index + 1 < len(items) else []
                if sorted(following) != sorted(calls):
                    problems.append(
                        f"contents[{index}]: function calls {calls} are not answered by the next turn"
                    )
        return problems

    def repaired(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Responses that answer nothing dropped; unanswered calls given a placeholder."""
        out: list[Any] = []
        done: list[str] = []
        for item in items:
            open_calls = self.calls(out[-1]) if out else []
            answered = self.answers(item)
            if answered or open_calls:
                kept = [
                    p
                    for p in _parts(item)
                    if not (
                        isinstance(p, Mapping)
                        and isinstance(p.get("functionResponse"), Mapping)
                        and self._call_key(p["functionResponse"]) not in open_calls
                    )
                ]
                have = [
                    self._call_key(p["functionResponse"])
                    for p in kept
                    if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
                ]
                missing = [c for c in open_calls if c not in have]
                if len(kept) != len(_parts(item)):
                    done.append("dropped function responses that answer no call")
                if missing and self.role(item) == "user":
                    kept = [
                        *(
                            {"functionResponse": {"name": c, "response": {"output": NO_RESULT}}}
                            for c in missing
                        ),
                        *kept,
                    ]
                    done.append(f"added responses for unanswered calls {missing}")
                elif missing:  # the next turn is not the user's: answer in a turn of our own
                    out.append({"role": "user", "parts": [_no_response(c) for c in missing]})
                    done.append(f"added responses for unanswered calls {missing}")
                if not kept:
                    continue
                item = {**item, "parts": kept} if kept != _parts(item) else item
            out.append(item)
        if out and self.calls(out[-1]):
            missing = self.calls(out[-1])
            out.append(
                {
                    "role": "user",
                    "parts": [
                        {"functionResponse": {"name": c, "response": {"output": NO_RESULT}}}
                        for c in missing
                    ],
                }
            )
            done.append(f"added responses for unanswered calls {missing}")
        return out, done


def _no_response(call: str, text: str = NO_RESULT) -> dict[str, Any]:
    return {"functionResponse": {"name": call, "response": {"output": text}}}


DIALECTS["gemini.generate"] = GeminiDialect()
CONVERSATION_FIELD["gemini.generate"] = "contents"
