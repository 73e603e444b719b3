"""`clear_tool_results`: replace old tool results with a one-line placeholder.

The placeholder names the tool, the original size in tokens and the sha256 key of the original
(under which the archive keeps it); the call and its pairing stay. The most recent `keep` tool
results are never cleared. Results are cleared lowest value first — exact copies and superseded
reads of a later result, then results that mention no term of the user's request (the first and
the last user message before them) and report no anomaly, then the ones that hold evidence —
oldest first within each class, in batches of at least `clear_at_least` tokens. A result's class
depends only on the session up to it and on later copies of it, never on the turn at hand, so
consecutive turns clear the same results and the request prefix changes rarely.

Older copies that `prune_tool_results` pointed onward to a result are cleared with it, in the
same step and with the same placeholder (same content, same sha256): a pointer never names a
result that is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from policies.conversation import (
    STALE,
    Conversation,
    FidelityRecord,
    Goal,
    Meter,
    ResultKey,
    archive_key,
    facts,
    result_values,
    snapped_count,
)


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


@dataclass(frozen=True, slots=True)
class _Cleared:
    """One result's placeholder: its text, the key it names and the text it stands for; for an
    older copy pointed onward, the call of the result it pointed to."""

    text: str
    key: str
    original: str
    pointed_to: str | None = None


@dataclass(slots=True)
class _Candidate:
    index: int  # the message whose results are cleared
    edits: dict[ResultKey, _Cleared]  # its results, and the pointers naming them
    saving: int


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
        known = facts(conversation)
        holding = [index for index, found in enumerate(known.results) if found]
        eligible = holding[: max(0, len(holding) - self.settings.keep)]
        candidates: list[_Candidate] = []
        for index in eligible:
            tokens = conversation.sizes[index]  # the message it is in: near enough, and free
            edits: dict[ResultKey, _Cleared] = {}
            for result in known.editable[index]:
                key = archive_key(result.text)
                text = placeholder(result.tool, tokens, key)
                if len(text) < len(result.text):
                    cleared = _Cleared(text, key, result.text)
                    edits[index, result.call_id] = cleared
                    self._with_pointers((index, result.call_id), cleared, known.pointers, edits)
            if edits:
                saving = sum(
                    conversation.sizes[i] - size
                    for i, (_, size) in self._rewritten(conversation, edits, meter).items()
                )
                candidates.append(_Candidate(index, edits, saving))
        if self.settings.by_value:
            values = result_values(conversation)
            candidates.sort(key=lambda c: (max(values[c.index], default=STALE), c.index))
        step = goal.step(self.settings.clear_at_least)
        taken = candidates[: snapped_count((c.saving for c in candidates), needed, step)]

        edits = {}
        for candidate in sorted(taken, key=lambda c: c.index):
            for at, cleared in candidate.edits.items():
                if cleared.pointed_to is None:
                    edits.setdefault(at, cleared)
                else:  # a pointer takes the placeholder of what it pointed to
                    edits[at] = cleared
        changes = self._rewritten(conversation, edits, meter)
        records = [
            FidelityRecord(
                self.name,
                "cleared",
                conversation.origin[index],
                conversation.sizes[index],
                changes[index][1],
                archive_key=cleared.key,
                detail=f"pointed to {cleared.pointed_to}" if cleared.pointed_to else "",
                original=cleared.original,
            )
            for (index, _), cleared in sorted(edits.items(), key=lambda edit: edit[0][0])
        ]
        return conversation.replace(changes), records

    @staticmethod
    def _with_pointers(
        at: ResultKey,
        cleared: _Cleared,
        pointers: dict[ResultKey, list[ResultKey]],
        edits: dict[ResultKey, _Cleared],
    ) -> None:
        """The older copies pointed onward to the result at `at` (and those pointed onward to
        them), each to take its placeholder."""
        pending = [at]
        while pending:
            named = pending.pop()
            for pointer in pointers.get(named, ()):
                if pointer not in edits:
                    edits[pointer] = _Cleared(cleared.text, cleared.key, cleared.original, at[1])
                    pending.append(pointer)

    @staticmethod
    def _rewritten(
        conversation: Conversation, edits: dict[ResultKey, _Cleared], meter: Meter
    ) -> dict[int, tuple[Any, int]]:
        """Each message the edits reach, with its results replaced, and its size."""
        dialect = conversation.dialect
        updated: dict[int, Any] = {}
        for (index, call_id), cleared in edits.items():
            message = updated.get(index, conversation.messages[index])
            updated[index] = dialect.with_tool_result(message, call_id, cleared.text)
        return {index: (message, meter.message(message)) for index, message in updated.items()}
