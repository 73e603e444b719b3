"""`clear_tool_results`: replace old tool results with a placeholder and the result's gist.

The placeholder's one line names the tool, the original size in tokens and the sha256 key of the
original (under which the archive keeps it); under it, quoted, the result's gist: its `gist_lines`
most informative lines (`policies.information.gist`; of the whole result, where `prune_tool_results`
cut it), as many as still save two thirds of the result; then the names it printed — paths, dotted
and snake_case names, hashes and ids (`policies.information.names`) — in up to `names_share` of the
result's characters (ids under one path written under it once, as a shell writes them:
`github.com/o/r/pull/{2385,2390}`, `policies.text.grouped`): what an agent's next steps act on, so a
cleared result still says which files, commits and functions it was about. Where the same results,
listing their names in `names_share_with_room` of their characters, still save all that their batch
reached (the grid point, below), they list that many: a shallow cut has the room, and spends it on
names; a deeper one, which would clear more results or evict for it, keeps `names_share`. The call
and its pairing stay; a result cleared already stays as it is. The most recent `keep` tool results
are never cleared, nor is a result whose placeholder would not save two thirds of it (a small result
is worth its tokens: it goes whole, with its turn, if anything), nor a small one whose placeholder,
saving two thirds, has less room for names than `names_share` gives and could not list every name it
printed (a file of pins: names are what the next step acts on, and it holds them densely) — while
such small results kept whole take at most `small_whole_share` of the budget together, the most
valuable first; past it they are cleared as any result is. The
`recent` results before those are a last resort, as evict's recent turns are: cleared only in
compress's last-resort pass, after every older one, and only as far as the budget itself needs
(`Goal.limit`): the room below the budget that a batch leaves for later turns comes from older
content, never from the results the next step works from. Results are cleared lowest value first —
exact copies and superseded reads of a later result, then results that mention no term of the user's
request (the first and the last user message before them) and report no anomaly, then the ones that
hold evidence — least recently used first within each class: a result is as recent as the last
assistant turn that acted on an identifier it printed (a path, a name, a number:
`policies.facts.last_use`), else as its own place, so what the agent keeps working from stays
longest; in batches of at least `clear_at_least` tokens, so consecutive turns clear the same results
and the request prefix changes rarely.

Older copies that `prune_tool_results` pointed onward to a result are cleared with it, in the
same step and with the same placeholder (same content, same sha256): a pointer never names a
result that is gone.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from brim.policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    Meter,
    ToolResult,
    archive_key,
    snapped_count,
)
from brim.policies.facts import STALE, Facts, ResultKey, facts, last_use, result_values
from brim.policies.information import CutFrom, cut_from, gist, names_fitting
from brim.policies.remembered import Remembered
from brim.policies.text import NAMES_LABEL, is_placeholder, names_line


class ClearSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    keep: int = Field(3, ge=0)  # most recent tool results never cleared
    # the next most recent: cleared only to fit the budget, never to leave room below it
    recent: int = Field(2, ge=0)
    clear_at_least: int | None = Field(None, ge=0)  # None: the slack between limit and target
    by_value: bool = True  # copies, then results without evidence, least recently used first
    #                        within each; False: oldest first
    gist_lines: int = Field(1, ge=0)  # the result's most informative lines, quoted after it
    # The names the result printed, listed after its gist, in up to this share of its characters
    # (0.15 kept more of what the next turns used than 0.1, with evict's gist_share at 0.2, on
    # four sets of real sessions: bench.fidelity, 2026-12-07)
    names_share: float = Field(0.15, ge=0, le=0.3)
    # The share where the same results, cleared with it, still save all their batch reached
    # (0.3 against 0.15 alone: facts kept at ≤ 2.5× 99.5 → 99.6 %, next-action evidence there
    # 90.5 → 90.7 %; on a fresh set, facts 89.5 → 90.3 %; nothing deeper changed:
    # bench.fidelity, 2026-12-07)
    names_share_with_room: float = Field(0.3, ge=0, le=0.5)
    # Small results kept whole (their placeholder could not list their names) take at most this
    # share of the budget, the most valuable first; the others are cleared as any result is
    # (0.2 against no bound: facts kept at 5–10× 71.1 → 74.1 %, next-action evidence 84.4 →
    # 84.2 %; on a fresh set 57.5 → 58.3 % and 84.7 → 84.5 %; held out 60.1 → 65.3 % and
    # 86.5 → 86.6 %: bench.fidelity, 2026-12-08)
    small_whole_share: float = Field(0.2, ge=0, le=1)


CLEARED_PREFIX = "[brim cleared this "
_WHOLE = 8  # where clearing every candidate would not do, a multiple of this many are cleared


def placeholder(
    tool: str, tokens: int, key: str, quoted: Sequence[str] = (), named: Sequence[str] = ()
) -> str:
    """What a cleared result becomes: one line naming the tool, the result's size and the key
    the archive keeps it under, then the lines of its gist, if any (`quoted`), then the names
    it printed, if any (`named`)."""
    head = f"{CLEARED_PREFIX}{tool} result ({tokens} tokens); the whole is sha256:{key[:16]}]"
    lines = [head]
    if quoted:
        lines += [f"> {line}" for line in quoted]
    if named:
        lines.append(names_line(named))
    return "\n".join(lines)


@dataclass(slots=True)  # not frozen: made for every candidate, every turn (and never changed)
class _Cleared:
    """One result's placeholder: its text, the key it names and the text it stands for; for an
    older copy pointed onward, the call of the result it pointed to."""

    text: str
    key: str
    original: str
    pointed_to: str | None = None


class _Placeholder(NamedTuple):
    text: str
    every: bool  # it lists every name the result printed
    small: bool  # the result is too small for it to: kept whole, within `small_whole_share`


@dataclass(slots=True)
class _Candidate:
    index: int  # the message whose results are cleared
    edits: dict[ResultKey, _Cleared]  # its results, and the pointers naming them
    saving: int
    every_name: bool  # its placeholders list every name: with a wider share, the same


class ClearToolResults:
    name = "clear_tool_results"

    def __init__(self, settings: ClearSettings | None = None) -> None:
        self.settings = settings or ClearSettings()
        # (tool, tokens, the whole's length and hash, whether the text is a placeholder, the
        # names' share) → (the whole's archive key, the placeholder): `_placeholder` depends on
        # nothing else.
        self._placeholders: Remembered[
            tuple[str, int, int, int, bool, float], tuple[str, _Placeholder]
        ] = Remembered(maxsize=20_000)
        self._lock = threading.Lock()

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        needed = conversation.total - goal.target
        if needed <= 0:
            return conversation, []
        known = facts(conversation)
        before_cut = cut_from(conversation)  # a placeholder names and quotes the whole
        holding = [index for index, found in enumerate(known.results) if found]
        eligible = holding[: max(0, len(holding) - self.settings.keep)]
        split = max(0, len(eligible) - self.settings.recent)
        older, recent = eligible[:split], eligible[split:]
        if self.settings.by_value:
            values, used = result_values(conversation), last_use(conversation)

            def value(index: int) -> tuple[float, int, int]:
                return (max(values[index], default=STALE), used[index], index)

            older.sort(key=value)
            recent.sort(key=value)

        rewritten = _Rewritten(conversation, meter)
        room = int(goal.limit * self.settings.small_whole_share)
        cleared_anyway = self._small_past(conversation, known, before_cut, [*older, *recent], room)

        def candidate_of(index: int, share: float) -> _Candidate | None:
            return self._candidate(
                conversation, known, before_cut, index, rewritten, share, cleared_anyway
            )

        def candidates(indices: list[int], share: float) -> Iterator[_Candidate]:  # as taken
            for index in indices:
                if made := candidate_of(index, share):
                    yield made

        def savings(source: Iterator[_Candidate], made: list[_Candidate]) -> Iterator[int]:
            for candidate in source:
                made.append(candidate)
                yield candidate.saving

        step = goal.step(self.settings.clear_at_least)
        share = self.settings.names_share
        made: list[_Candidate] = []
        remaining = candidates(older, share)
        taken = made[: snapped_count(savings(remaining, made), needed, step, _WHOLE)]
        wide_share = self.settings.names_share_with_room
        # Enough is the grid point the batch reached, not the room needed now: the same while
        # the session grows within the batch, so the placeholders (and the prefix) stay put.
        reached = sum(candidate.saving for candidate in taken)
        enough = max(needed, reached - reached % step) if step > 0 else needed
        if 0 < share < wide_share and (
            wide := _still_enough(taken, enough, wide_share, candidate_of)
        ):
            taken = wide  # they save all that was needed: the last resort below never follows
        over = conversation.total - sum(candidate.saving for candidate in taken) - goal.limit
        if over > 0 and not goal.reversible_only:  # last resort: the recent, as needed
            later: list[_Candidate] = []
            pool = itertools.chain(made[len(taken) :], remaining, candidates(recent, share))
            taken += later[: snapped_count(savings(pool, later), over, 0)]

        edits: dict[ResultKey, _Cleared] = {}
        for candidate in sorted(taken, key=lambda c: c.index):
            for at, cleared in candidate.edits.items():
                if cleared.pointed_to is None:
                    edits.setdefault(at, cleared)
                else:  # a pointer takes the placeholder of what it pointed to
                    edits[at] = cleared
        changes = rewritten(edits)
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
        return conversation.with_results(changes), records

    def _candidate(
        self,
        conversation: Conversation,
        known: Facts,
        before_cut: CutFrom,
        index: int,
        rewritten: _Rewritten,
        share: float,
        cleared_anyway: Container[ResultKey],
    ) -> _Candidate | None:
        """The results of message `index` cleared, with what that saves; None if nothing would.
        A small result stays whole unless it is one of `cleared_anyway` (`_small_past`)."""
        edits: dict[ResultKey, _Cleared] = {}
        every_name = True
        for result, whole, key, made in self._placeholders_in(
            conversation, known, before_cut, index, share
        ):
            if made.small and (index, result.call_id) not in cleared_anyway:
                every_name = False  # too small to say what it named: worth its tokens
                continue
            text, listed = made.text, made.every
            if 3 * len(text) > len(result.text):  # a result prune cut: without the names?
                text, listed = text.split(f"\n{NAMES_LABEL}", 1)[0], False
            every_name = every_name and listed
            if 3 * len(text) <= len(result.text):
                cleared = _Cleared(text, key, whole)
                edits[index, result.call_id] = cleared
                self._with_pointers((index, result.call_id), cleared, known.pointers, edits)
        if not edits:
            return None
        saving = sum(conversation.sizes[i] - size for i, (_, size) in rewritten(edits).items())
        return _Candidate(index, edits, saving, every_name)

    def _small_past(
        self,
        conversation: Conversation,
        known: Facts,
        before_cut: CutFrom,
        eligible: Sequence[int],
        room: int,
    ) -> set[ResultKey]:
        """The small results (`_Placeholder.small`) past the `room` that small results
        kept whole may take: taken from the most valuable (the last of `eligible`, which is in
        the order they are cleared) while they fit; those left are cleared as any result is. Kept
        without a bound, they took the room that deep cuts then freed by evicting larger results,
        whose ids only evict's notice keeps."""
        past: set[ResultKey] = set()
        share = self.settings.names_share
        for index in reversed(eligible):
            texts = max(1, sum(len(result.text) for result in known.editable[index]))
            for result, _, _, made in self._placeholders_in(
                conversation, known, before_cut, index, share
            ):
                if not made.small:
                    continue
                # Its share of its message (by characters): near enough, and free.
                size = conversation.sizes[index] * len(result.text) // texts
                if size > room:
                    past.add((index, result.call_id))
                else:
                    room -= size
        return past

    def _placeholders_in(
        self,
        conversation: Conversation,
        known: Facts,
        before_cut: CutFrom,
        index: int,
        share: float,
    ) -> Iterator[tuple[ToolResult, str, str, _Placeholder]]:
        """Each result of message `index` not cleared already, with the whole it stands for
        (before any cut), the whole's archive key and its placeholder at `share`."""
        # The message it is in, before any cut: near enough, free, and the same every turn.
        tokens = before_cut.sizes.get(index, conversation.sizes[index])
        for result in known.editable[index]:
            if result.text.startswith(CLEARED_PREFIX):  # cleared already (a retry's cut)
                continue
            whole = before_cut.texts.get((index, result.call_id), result.text)
            key, made = self._placeholder_of(result.tool, tokens, result.text, whole, share)
            yield result, whole, key, made

    def _placeholder_of(
        self, tool: str, tokens: int, text: str, whole: str, share: float
    ) -> tuple[str, _Placeholder]:
        """The archive key of the `whole` result and the placeholder of `text`
        (`_placeholder`), remembered: the same results are cleared again every turn."""
        # Python's own string hash (cached on the string) and the length, as in tokens.py.
        cache_key = (tool, tokens, len(whole), hash(whole), is_placeholder(text), share)
        with self._lock:
            known = self._placeholders.get(cache_key)
        if known is None:
            key = archive_key(whole)
            known = (key, self._placeholder(tool, tokens, key, text, whole, share))
            with self._lock:
                self._placeholders[cache_key] = known
        return known

    def _placeholder(
        self, tool: str, tokens: int, key: str, text: str, whole: str, share: float
    ) -> _Placeholder:
        """The placeholder of `text` with the gist of the `whole` result (before any cut), where
        that still saves two thirds of the whole (else the bare placeholder), and the names the
        whole printed, in what room is left of `share` of it: a pure function of the result and
        the share, the same every turn whether or not it was cut first; and whether it lists
        every name (with a wider share, the same); and whether the result is small — too small
        for that room to hold all its names, so worth its tokens whole (`_small_past` bounds how
        many stay so)."""
        bare = placeholder(tool, tokens, key)
        if is_placeholder(text):
            return _Placeholder(bare, True, False)
        quoted: tuple[str, ...] = ()
        for count in range(self.settings.gist_lines, 0, -1):  # fewer where more would not do
            if 3 * len(placeholder(tool, tokens, key, lines := gist(whole, count))) <= len(whole):
                quoted = lines
                break
        shared = int(len(whole) * share)  # the names' room, before saving two thirds
        third = len(whole) // 3 - len(placeholder(tool, tokens, key, quoted))
        room = min(third, shared) - len(NAMES_LABEL)
        named, every = names_fitting(whole, room, skip=quoted) if room > 0 else ((), False)
        # Saving two thirds leaves the names less room than the share, and the placeholder would
        # not say all it named: a small result, worth its tokens — names are what the next step
        # acts on, and a small result holds them densely.
        small = not every and third < shared
        return _Placeholder(placeholder(tool, tokens, key, quoted, named), every, small)

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


def _still_enough(
    taken: list[_Candidate],
    enough: int,
    share: float,
    candidate: Callable[[int, float], _Candidate | None],
) -> list[_Candidate] | None:
    """The results `taken` again, listing their names in `share` of their characters, where
    they still save `enough`; else None: never more results cleared (nor evicted) for the sake
    of names. Stops at the first that leaves too little: in a deep cut, after a few."""
    spare = sum(each.saving for each in taken) - enough
    if spare < 0 or not taken:
        return None
    again: list[_Candidate] = []
    for each in taken:
        wider = each if each.every_name else candidate(each.index, share)
        if wider is None:
            return None
        spare -= each.saving - wider.saving
        if spare < 0:
            return None
        again.append(wider)
    return again


class _Rewritten:
    """The messages edits reach, each with its results replaced, and their sizes — each message
    written and measured once per set of its edits, though a candidate's edits are asked for
    again when the ones taken are put together."""

    def __init__(self, conversation: Conversation, meter: Meter) -> None:
        self._conversation, self._meter = conversation, meter
        self._made: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Any, int]] = {}

    def __call__(self, edits: Mapping[ResultKey, _Cleared]) -> dict[int, tuple[Any, int]]:
        replaced: dict[int, list[tuple[str, str]]] = {}
        for (index, call_id), cleared in edits.items():
            replaced.setdefault(index, []).append((call_id, cleared.text))
        written: dict[int, tuple[Any, int]] = {}
        for index, texts in replaced.items():
            key = (index, tuple(texts))
            found = self._made.get(key)
            if found is None:
                message = self._conversation.messages[index]
                for call_id, text in texts:
                    message = self._conversation.dialect.with_tool_result(message, call_id, text)
                found = self._made[key] = (message, self._meter.message(message))
            written[index] = found
        return written
