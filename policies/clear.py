"""`clear_tool_results`: replace old tool results with a one-line placeholder.

The placeholder names the tool, the original size in tokens and the sha256 key of the original
(under which the archive keeps it); the call and its pairing stay. The most recent `keep` tool
results are never cleared. Results are cleared lowest value first — exact copies and superseded
reads of a later result, then results that mention no term of the user's request (the first and
the last user message before them) and report no anomaly, then the ones that hold evidence —
oldest first within each class, in batches of at least `clear_at_least` tokens. A result's class
depends only on the session up to it and on later copies of it, never on the turn at hand, so
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
    editable,
    has_evidence,
    requests,
    snapped_count,
    stale_results,
)

STALE, PLAIN, EVIDENCE = 0, 1, 2  # value classes, cleared in this order


class ClearSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    keep: int = Field(3, ge=0)  # most recent tool results never cleared
    clear_at_least: int | None = Field(None, ge=0)  # None: the slack between limit and target
    by_value: bool = True  # copies and results without evidence first; False: oldest first


def placeholder(tool: str, tokens: int, key: str) -> str:
    return (
        f"[brim cleared this {tool} result ({tokens} tokens) to fit the context window; "
        f"archived as sha256:{key[:16]}]"
    )


class ClearToolResults:
    name = "clear_tool_results"

    def __init__(self, settings: ClearSettings | None = None) -> None:
        self.settings = settings or ClearSettings()

    @staticmethod
    def _values(conversation: Conversation, indices: list[int]) -> dict[int, int]:
        """Each message's value class: that of its most valuable result (a message is cleared
        whole)."""
        dialect = conversation.dialect
        names = dialect.tools_by_call(conversation.messages)
        stale = stale_results(conversation)
        request = requests(conversation)
        values = {}
        for index in indices:
            worth = STALE
            for result in dialect.tool_results(conversation.messages[index], names):
                if (index, result.call_id) in stale:
                    continue
                telling = has_evidence(result.text, request[index])
                worth = max(worth, EVIDENCE if telling else PLAIN)
            values[index] = worth
        return values

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
            for result in editable(dialect.tool_results(message, names)):
                key = archive_key(result.text)
                tokens = conversation.sizes[index]  # the message it is in: near enough, and free
                text = placeholder(result.tool, tokens, key)
                if len(text) < len(result.text):
                    updated = dialect.with_tool_result(updated, result.call_id, text)
                    keys.append((key, result.text))
            if updated is not message:
                candidates.append((index, updated, meter.message(updated), keys))
        step = self.settings.clear_at_least
        if step is None:
            step = max(1, goal.limit - goal.target)
        if self.settings.by_value:
            value = self._values(conversation, [index for index, _, _, _ in candidates])
            candidates.sort(key=lambda candidate: (value[candidate[0]], candidate[0]))
        savings = [conversation.sizes[index] - size for index, _, size, _ in candidates]
        taken = sorted(candidates[: snapped_count(savings, needed, step)], key=lambda c: c[0])
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
