"""`clear_tool_results`: replace old tool results with a one-line placeholder.

The placeholder names the tool, the original size in tokens and the sha256 key of the original
(under which the archive keeps it); the call and its pairing stay. The most recent `keep` tool
results are never cleared. Results are cleared oldest first, in batches of at least
`clear_at_least` tokens: the batch boundaries depend only on the session's older part, so
consecutive turns clear the same results and the request prefix changes rarely.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    Meter,
    archive_key,
    snapped_count,
)


class ClearSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    keep: int = Field(3, ge=0)  # most recent tool results never cleared
    clear_at_least: int | None = Field(None, ge=0)  # None: the slack between limit and target


def placeholder(tool: str, tokens: int, key: str) -> str:
    return (
        f"[brim cleared this {tool} result ({tokens} tokens) to fit the context window; "
        f"archived as sha256:{key[:16]}]"
    )


class ClearToolResults:
    name = "clear_tool_results"

    def __init__(self, settings: ClearSettings | None = None) -> None:
        self.settings = settings or ClearSettings()

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        needed = conversation.total - goal.target
        if needed <= 0:
            return conversation, []
        dialect = conversation.dialect
        names = dialect.tools_by_call(conversation.messages)
        results = [
            index
            for index, message in enumerate(conversation.messages)
            if dialect.tool_results(message, names)
        ]
        eligible = results[: max(0, len(results) - self.settings.keep)]
        candidates: list[tuple[int, Any, int, list[tuple[str, str]]]] = []
        for index in eligible:
            message = conversation.messages[index]
            updated, keys = message, []
            for result in dialect.tool_results(message, names):
                key = archive_key(result.text)
                tokens = conversation.sizes[index]  # the message it is in: near enough, and free
                text = placeholder(result.tool, tokens, key)
                if len(text) < len(result.text):
                    updated = dialect.with_tool_result(updated, result.call_id, text)
                    keys.append((key, result.text))
            if updated is not message:
                candidates.append((index, updated, meter.message(updated), keys))
        savings = [conversation.sizes[index] - size for index, _, size, _ in candidates]
        step = self.settings.clear_at_least
        if step is None:
            step = max(1, goal.limit - goal.target)
        taken = candidates[: snapped_count(savings, needed, step)]
        records = [
            FidelityRecord(
                self.name,
                "cleared",
                conversation.origin[index],
                conversation.sizes[index],
                size,
                archive_key=key,
                original=original,
            )
            for index, _, size, keys in taken
            for key, original in keys
        ]
        changes = {index: (updated, size) for index, updated, size, _ in taken}
        return conversation.replace(changes), records
