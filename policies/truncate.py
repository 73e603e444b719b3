"""`truncate`: cut the middle out of the largest message when one message alone is too big.

Head and tail are kept (a third and two thirds: the end of a log is where the error is), with a
marker saying how many tokens went and naming the key of the whole text (`marker`), which the
record keeps as its original; under it, as a cleared result's placeholder lists them, the names the
middle printed that head and tail do not show (ids, paths, names: `policies.information.names`), in
up to `names_share` of the characters that went and `names_of_kept` of those that stay — a number a
file states once in its middle is still in the request (a text cut to its floor, `min_keep_tokens`,
goes without them). The largest text goes first, then the next, until the request fits the budget
itself (`Goal.limit`, not the low-water mark: this cut destroys text, so it goes no further than
the budget needs, and only in compress's last-resort pass) or no text is left to cut. The newest
turn (the newest message, or a tool call with all its results) and the last user message
(`last_request`) are cut only after every other message has been, and only if the request still
does not fit (a system message after the newest turn does not make that turn older); evict's notice
after them (brim's own words, its ids line the one trace of the results it removed); system and
developer messages in the conversation (Chat's system, Responses' developer and system items —
Codex sends its instructions so) only after everything else, and only once evict's notice is gone:
brim's own words go before the client's instructions are cut (the evicted messages stay in the
archive, though the request no longer names their key). Instructions outside it (Anthropic's
`system`, Gemini's `systemInstruction`) are fixed cost: never cut. Tool-call arguments are never
cut (they must stay valid JSON); nor are the messages a wire's dialect offers no text of (thinking
turns, Anthropic's system messages).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from brim.policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    Meter,
    archive_key,
    text_tokens_taking,
)
from brim.policies.facts import facts, last_request
from brim.policies.information import names
from brim.policies.lines import Middle, cut_middle
from brim.policies.text import NAMES_LABEL, names_line
from brim.policies.wires.base import is_notice

MARKER_SLACK = 10  # tokens: where head, marker and tail meet, their tokens may merge or split
# Measured cuts of one text: the first by estimate, the others by what it took. Four left a text
# of long lines (a README of badge links) a few tokens over at one budget in eight: the names
# under the marker fill their room as the middle grows, and a cut moves by whole lines.
CUT_ATTEMPTS = 8


def marker(removed: int, key: str, named: Sequence[str] = ()) -> str:
    """What takes the place of a cut text's middle: how many tokens went, and the key of the
    whole text, as `prune` names the whole of what it shortens; then, if any, the names that
    went (`named`), as a cleared result's placeholder lists them."""
    said = f"\n[… {removed} tokens cut from the middle by brim; the whole is sha256:{key[:16]} …]\n"
    return f"{said}{names_line(named)}\n" if named else said


class _Marker:
    """The marker of one text's cut, its names given `room` characters: those the middle of the
    first cut printed that its head and tail do not (`policies.information.names`). A later,
    deeper cut of the same text keeps them (each is still in what went), so the marker does
    not grow as the cut is made to fit."""

    def __init__(self, key: str, room: int) -> None:
        self._key, self._room = key, room
        self._named: tuple[str, ...] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The names listed, once the first cut chose them."""
        return self._named or ()

    def __call__(self, middle: Middle) -> str:
        if self._named is None:
            skip = (middle.head, middle.tail)
            self._named = names(middle.text, self._room, skip) if self._room > 0 else ()
        return marker(middle.removed, self._key, self._named)


class TruncateSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    min_keep_tokens: int = Field(256, ge=16)  # what is left of a message at least
    # The names of what went, in at most this share of its characters (as clear's placeholder
    # lists a result's) and this share of what stays of the text
    names_share: float = Field(0.15, ge=0, le=0.3)
    names_of_kept: float = Field(0.5, ge=0, le=1)


def _notices(conversation: Conversation) -> set[int]:
    """Where evict's notices are (brim's own messages, naming what was removed)."""
    return {
        i
        for i, origin in enumerate(conversation.origin)
        if origin == -1 and is_notice(conversation.dialect, conversation.messages[i])
    }


def _without_notices(conversation: Conversation) -> Conversation:
    """The conversation without evict's notices, where it pairs validly without them; else as
    it is."""
    dialect = conversation.dialect
    notices = _notices(conversation)
    if not notices:
        return conversation
    without = conversation.keep(lambda i: i not in notices, {})
    return without if not dialect.violations(without.messages) else conversation


class Truncate:
    name = "truncate"

    def __init__(self, settings: TruncateSettings | None = None) -> None:
        self.settings = settings or TruncateSettings()

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        if not goal.cuts_text:  # a cut into text: only in compress's last-resort pass
            return conversation, []
        records: list[FidelityRecord] = []
        conversation = self._cut(conversation, goal, meter, records, system=False)
        if conversation.total > goal.limit:
            # Before the client's own instructions are cut: brim's own words (evict's notice).
            conversation = _without_notices(conversation)
            conversation = self._cut(conversation, goal, meter, records, system=True)
        return conversation, records

    def _cut(
        self,
        conversation: Conversation,
        goal: Goal,
        meter: Meter,
        records: list[FidelityRecord],
        *,
        system: bool,
    ) -> Conversation:
        """Cut the messages other than the system ones (or, with `system`, the system ones),
        largest first, until the request fits `goal.limit`; what was cut goes to `records`."""
        dialect = conversation.dialect
        known = facts(conversation)
        newest = next((u for u in reversed(known.units) if u.kind != "system"), None)
        # Cut last: the newest turn that is not a system message (a tool call and every result
        # of it), the last message, the last user message.
        spared = {len(conversation.messages) - 1, last_request(conversation)}
        spared |= set(newest.indices) if newest is not None else set()
        # After those: the one trace of what evict removed. Cut with the turns, not with the
        # client's instructions, though on Chat and Responses it is a system message: else a
        # request a few tokens over after the turns' cuts went without it whole.
        notices = _notices(conversation)
        instructions = {
            i for u in known.units if u.kind == "system" for i in u.indices if i not in notices
        }
        order = sorted(
            (i for i in range(len(conversation.messages)) if (i in instructions) == system),
            key=lambda i: (i in notices, i in spared, -conversation.sizes[i], i),
        )
        for index in order:
            excess = conversation.total - goal.limit
            if excess <= 0:
                break
            message = conversation.messages[index]
            text = dialect.largest_text(message)
            if not text:
                continue
            tokens = meter.tokens(text)
            key = archive_key(text)
            # The excess is in the provider's tokens of the whole message; a token of the text
            # may take more of them (JSON escapes: a tab, a quote, a newline; the model's
            # ratio), so the text is cut by what it takes, measured on this message.
            text_tokens = functools.partial(
                text_tokens_taking,
                message=conversation.sizes[index],
                without_text=meter.message(dialect.with_largest_text(message, "")),
                text=len(tokens),
                meter=meter,
            )
            # The marker's own tokens (with a count as long as it can get) are cut too; and the
            # names of what went, in a room sized by this first estimate of the cut, chosen
            # from the middle it takes out, are cut by what they take on the next attempt.
            allowance = meter.text_tokens(marker(len(tokens), key)) + MARKER_SLACK
            removing = text_tokens(excess) + allowance
            chars = len(text) / len(tokens)
            room = int(
                min(
                    self.settings.names_share * removing * chars,
                    self.settings.names_of_kept * max(0, len(tokens) - removing) * chars,
                )
            ) - len(NAMES_LABEL)
            said = _Marker(key, room)
            cut, removed, updated, size = text, 0, message, conversation.sizes[index]
            step = 0
            # Again where the middle took fewer tokens than the whole, or the names took room; a
            # cut moves by whole lines, so each retry goes a little further — twice the last
            # step where an attempt ended at the same line end as the one before it (a text of
            # long lines).
            for attempt in range(CUT_ATTEMPTS):
                removed_before = removed
                keep = max(self.settings.min_keep_tokens, len(tokens) - removing)
                if keep >= len(tokens):
                    break
                cut, removed = cut_middle(text, keep, meter, tokens=tokens, marker=said)
                if not removed:
                    break
                updated = dialect.with_largest_text(message, cut)
                size = meter.message(updated)
                over = excess - (conversation.sizes[index] - size)
                if over <= 0:
                    break
                if keep == self.settings.min_keep_tokens:
                    if not said.names:
                        break
                    said = _Marker(key, 0)  # at its floor, the text goes without the names
                    continue
                further = text_tokens(over) + MARKER_SLACK * attempt
                step = max(further, 2 * step) if removed == removed_before else further
                removing += step
            if not removed or size >= conversation.sizes[index]:
                continue
            result = next((r for r in known.results[index] if r.text == text), None)
            records.append(
                FidelityRecord(
                    self.name,
                    "truncated",
                    conversation.origin[index],
                    conversation.sizes[index],
                    size,
                    archive_key=key,
                    detail=f"tool_result:{result.call_id}" if result else "",
                    original=text,
                )
            )
            conversation = conversation.replace({index: (updated, size)})
        return conversation
