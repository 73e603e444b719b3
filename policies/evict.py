"""`evict`: remove whole units (a tool call always with its results) and leave one notice.

Always kept: the system prompt and every other system message (instructions the client put
between the turns, as Claude Code does on Anthropic's Messages API: each stays where it was),
the last user message, and the last tool call with its results when the conversation ends with
it (an ongoing tool loop, even with a system message after it). Kept unless nothing else helps
(the last resorts: only in compress's last-resort pass, after the cuts into text that spare
them, and only as far as the limit demands): the first user message, the most recent
`keep_recent_turns` turns (a turn is a user message or an assistant reply with its tool results:
agent sessions have many turns per user message), the turns right before and after each system
message between the turns (so it stays between the same two: Anthropic takes one only right
after a user turn and before an assistant turn), and brim's own notices from an earlier cut.
Everything else may go, lowest value first — tool groups whose results are all stale
(already cleared or pointed onward, exact copies or superseded reads of a later result; never a
group holding a result that an older copy points to, which goes only after the pointer) and
orphans, then plain assistant chatter, then the other tool groups, then user messages — and
least recently used first within each class (a unit is as recent as the last assistant turn
that acted on an identifier its results printed, `policies.facts.last_use`; else its own
place), in batches of at least `evict_at_least` tokens so the cut point moves only now and
then as a session grows. A batch saves what was needed rounded up to that grid, not whatever
its last unit saves: where the last is a long tool result that saves far more, the units
removed before it that the request has room for go back, the most valuable first (an older
copy pointed onward only with the result it names), and the request keeps them. Each
record names its batch (`FidelityRecord.batch`: its value class and grid step within the class,
or the last resorts' own grid): the summaries of evicted turns are made per batch.

One notice takes the place of the first removed unit — or goes before the system messages right in
front of it, never after one (Anthropic's notice is a user message, and Anthropic takes a system
message only right before an assistant turn) — saying how many messages and tokens went, which tools
had been called, and the user requests that were dropped, and ending with the one key that restores
them all: the sha256 of the removed messages as one JSON array, in order, which the notice's own
record keeps as its original. Under that line the notice quotes what the latest removed tool results
said: each one's gist (the most informative line of the whole result, as clear's placeholder quotes
it) and the names it printed (names and ids taken in turn, `ranked_names`, as many as fit
`NAMES_QUOTED` characters; for a cleared result, those its placeholder lists), newest first as far
as `gist_share` of the budget allows (and no more than a quarter of what was removed), shown in
conversation order. A name the request carries anyway — a kept message names or prints it, or a
newer line lists it — is not listed: its room goes to the result's next names (results that print
the same paths, the same commits, would otherwise spend the notice on one list). A line that would
say nothing new is left out, and a result pointed onward quotes nothing. Where every removed result
got its line and the allowance is not used up, the rest of it lists more of their names, past
`NAMES_QUOTED`: the newest result's first. Last, in `ids_share` of the budget of its own (and no
more than a tenth of what was removed), one line lists the ids (`is_id`: long numbers, names with
one in them) that every removed result printed and nothing above lists or the request carries —
those of results too old to get a line included: a quarter of its room for the newest results' ids
in the order printed, the rest for the cheapest ids of all the others (by size: a bare number before
a long path), shown in conversation order, those under one path written under it once
(`…/pull/{2385,2390}`). Names on every line are listed with a space between two, not a comma
(`NAMES_SEPARATOR`): a token less each. The notice is a function of the removed messages and the
budget alone, so the same removed set gives the same bytes on every turn — but where every other
unit is gone and the quoted lines would take the request over the limit: then they take the largest
rung of a ladder that fits under it (the newest results' lines first), and go only if none does. On
a first cut, the lines go down by quarters (three quarters of their room, nine sixteenths, …) while
the ids line keeps its whole room, then both do: what fits is quoted. On a re-cut of a session known
to grow (`Goal.room`), the lines and the ids line halve together: the slack a coarse rung leaves
under the limit lets the next turns fit without another re-cut. If the protected units alone are
over the limit, the notice's quoted lines go first, then the protected units are released oldest
first (never a system message or the last user message) — after which the lines take what room the
release left under the limit — and the notice itself goes if it is what does not fit. Where the
request is over the limit even without it (the recent turns, or the newest alone, take the budget)
and text may be cut (`Goal.text_cuts`: in compress's last-resort pass, which follows a reversible
pass over the limit), the notice keeps its ids line: the cuts into text make room for it, and
`truncate` cuts the newest turn before brim's notice, so the ids of the older results stay.

A notice evict wrote earlier in the same request (compress's first pass, before its last
resorts) stands for what it removed (`_Notices`, in the conversation's memo): when the last
resorts release it with the protected units, the one new notice counts the messages, tokens and
tools it stood for and quotes their results' lines and ids as well — not a notice of a notice,
which counted the earlier one as one message and named none of what went in the first pass.

Why batches: brim recomputes every request from the client's full history, so the cut stays put
only while the same units are removed. Removing at least the budget's slack (limit − target) at a
time means the following turns fit without moving the cut, about slack ÷ (2 × tokens per turn)
turns on average — and every one of them reuses the provider's prompt cache.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field

from brim.policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    Lasting,
    Meter,
    Unit,
    archive_key,
    snapped_count,
    text_tokens_for,
)
from brim.policies.facts import STALE, facts, last_request, last_use, pointed_at, result_values
from brim.policies.information import (
    cut_from,
    fitting,
    gist,
    name_counts,
    ranked_names,
)
from brim.policies.text import (
    NAMES_LABEL,
    NAMES_SEPARATOR,
    grouped,
    grouped_cost,
    id_under_path,
    is_id,
    is_placeholder,
    listed_names,
    names_line,
)
from brim.policies.wires.base import NOTICE_PREFIX, is_notice

# Value classes, lowest first: stale tool groups and orphans, chatter, evidence, user requests;
# least recently used first within each. (System units are never evicted: they have none.)
PRIORITY = {"orphan": STALE, "assistant": 1, "tools": 2, "user": 3}
QUOTE = 80
NAMES_QUOTED = 120  # characters of a result's names the notice quotes at most
NAMES_RANKED = 60  # of a result's names, the first `ranked_names` gives: those its line may list
GISTS_HEADER = "What the latest removed tool results said (the most informative line, the names):"
_REMOVED_SHARE = 4  # the quoted lines take at most a quarter of the tokens removed
IDS_LABEL = "Ids they also printed: "
_REMOVED_IDS_SHARE = 10  # the ids line takes at most a tenth of the tokens removed
NEWEST_IDS_SHARE = 0.25  # of the ids line's room: the newest results' ids, in order (`_ids_line`)
_PUT_BACK_ROUNDS = 3  # removed units put back where there is room: the notice shrinks each time


@dataclass(frozen=True)
class _Ladder:
    """Over the limit, the rooms the quoted lines try, largest first: `ratio` of the one before,
    `rungs` times (the first rung is `ratio` of the full room), before none; the ids line keeps
    its whole room while the lines go down the ladder (`ids_whole_first`), then goes down with
    them."""

    ratio: float
    rungs: int
    ids_whole_first: bool

    def rooms(self, ids_whole: bool) -> list[tuple[float, float]]:
        """Each rung's share of the full room: (the lines', the ids line's), largest first."""
        return [
            (self.ratio**rung, 1.0 if ids_whole else self.ratio**rung)
            for rung in range(1, self.rungs + 1)
        ]


# A re-cut of a session known to grow (`Goal.room`): the lines and the ids line halve together,
# down to 1/256 of their room. A coarse rung leaves slack under the limit, so the next turns fit
# without a re-cut. Their room to the token instead kept 0.4 point more of what later turns used,
# but re-cut the notice every turn: prefix kept 89.6 → 86.5 % of the ceiling's; rungs of three
# quarters, 89.6 → 88.3 % (Codex at 8K 44 → 28 %; bench.fidelity, 2026-12-07).
_RECUT = _Ladder(0.5, 8, ids_whole_first=False)
# A first cut (no room asked): rungs of three quarters (down to about 1/240), the ids line
# whole while it fits. Facts kept at 2.5–5× 72.5 → 78.8 % (Messages 64.9 → 73.4 %), what later
# turns used and the prefix the same (bench.fidelity, 2026-12-07).
_FIRST_CUT = _Ladder(0.75, 19, ids_whole_first=True)


class EvictSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    keep_recent_turns: int = Field(2, ge=0)
    evict_at_least: int | None = Field(None, ge=0)  # None: the slack between limit and target
    notice: bool = True
    # of the budget: the notice's quoted lines (0.15 kept more of what the next turns used than
    # 0.1, held-out sessions included: bench.fidelity, 2026-11-28; 0.2 more again once room
    # left lists more names, 2026-12-07; 0.25 lost facts of the last 8 messages)
    gist_share: float = Field(0.2, ge=0, le=0.5)
    # of the budget, beyond gist_share: the notice's last line, the ids the removed results
    # printed that no quoted line lists (0.05 kept 96–100 % of the planted facts at ≤ 2.5×,
    # was 78–95 %, for 0.0–0.9 point of what the next turns used; 0.025 kept fewer facts at
    # 2.5–5×, 0.1 lost more evidence and kept few more facts: bench.fidelity, 2026-12-07)
    ids_share: float = Field(0.05, ge=0, le=0.2)


class _Dumped:
    """Each unit's messages as a JSON array (its record's original), dumped once however many
    removed sets — passes of the batching loop, last resorts, the records — it is part of."""

    def __init__(self, conversation: Conversation) -> None:
        self._messages = conversation.messages
        self._arrays: dict[Unit, str] = {}

    def unit(self, unit: Unit) -> str:
        found = self._arrays.get(unit)
        if found is None:
            found = orjson.dumps([self._messages[i] for i in unit.indices]).decode()
            self._arrays[unit] = found
        return found

    def removed(self, removed: Sequence[Unit]) -> str:
        """The removed units' messages as one JSON array, in conversation order — what the
        notice's key restores — from the units' own arrays (orjson writes no whitespace: one
        array of all the messages is the units' items joined by commas)."""
        items = (self.unit(unit)[1:-1] for unit in sorted(removed, key=lambda unit: unit.start))
        return "[" + ",".join(item for item in items if item) + "]"


@dataclass(frozen=True, slots=True)
class _Said:
    """What one removed result can say in the notice: its tool, its most informative line (or
    the one its placeholder quotes) and the names it printed, in `ranked_names` order (or those
    its placeholder lists), with where each first appears, and every id among them (`is_id`),
    in the order printed — and again by size (`ids_by_size`, `_size`: each size's in the order
    printed)."""

    tool: str
    line: str
    ranked: tuple[str, ...]
    order: Mapping[str, int]
    ids: tuple[str, ...]
    ids_by_size: Mapping[int, list[str]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_size: dict[int, list[str]] = {}
        for name in self.ids:
            by_size.setdefault(_size(name), []).append(name)
        object.__setattr__(self, "ids_by_size", by_size)  # frozen: derived once, here

    def quoted(self, shown: set[str]) -> tuple[str, list[str]] | None:
        """Its line in the notice — the line, then as many of its names as fit `NAMES_QUOTED`
        characters, none of those `shown` by a newer line, in the order printed — and those
        names; None when it has nothing to say."""
        named = fitting(self.ranked, NAMES_QUOTED - len(NAMES_LABEL), shown)
        if not self.line and not named:
            return None
        return self.written(named), named

    def written(self, named: Sequence[str]) -> str:
        """Its line in the notice, listing `named` (in the order printed)."""
        said = self.line
        if named:
            listed = names_line(sorted(named, key=self.order.__getitem__))
            said = f"{said} · {listed}" if said else listed
        return f"> {self.tool}: {said}"


class _Standing(NamedTuple):
    """What a notice's head line says its removed units were (`_standing`): the client's
    messages and their tokens, the tools they called, the user requests among them."""

    messages: int
    tokens: int
    tools: Counter[str]
    requests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _StoodFor:
    """What a notice evict wrote stands for: its head line's `standing`, and the units it
    removed with what their results can say (`gists`, of the conversation they were removed
    from: worked out only if asked)."""

    standing: _Standing
    gists: _Gists
    units: tuple[Unit, ...]

    def said(self) -> Iterator[_Said]:
        """What the removed results can say, in conversation order."""
        for unit in self.units:
            yield from self.gists.unit(unit)


class _Notices(Lasting):
    """The memo entry of a conversation evict returned: what each notice in it stands for, by
    the notice's text. A later pass that releases such a notice (compress's last resorts, where
    the turns it kept must go too) makes one notice of all that went — its count, its tools and
    its quoted lines — rather than a notice of a notice. Lasts through rewrites of tool results
    (a notice is not one)."""

    __slots__ = ("by_text",)

    def __init__(self, by_text: Mapping[str, _StoodFor]) -> None:
        self.by_text = by_text

    def through(self, changed: frozenset[int]) -> Lasting:
        return self


_NOTICES = "evict.notices"  # the memo key of `_Notices`


def _stood_for(conversation: Conversation, notices: set[Unit]) -> dict[Unit, _StoodFor]:
    """Of the notices in `conversation`, those evict wrote in this request, with what each
    stands for (`_Notices`)."""
    known = conversation.memo.get(_NOTICES)
    if not isinstance(known, _Notices):
        return {}
    found = {}
    for unit in notices:
        entry = known.by_text.get(conversation.dialect.text(conversation.messages[unit.start]))
        if entry is not None:
            found[unit] = entry
    return found


class _Gists:
    """Each tool group's results as the notice can quote them (`_Said`) — the most informative
    line of the whole result (before any cut) and the names it printed, or what its placeholder
    quotes and names (nothing for a pointer onward) — worked out once however many removed sets
    are tried, and what each quoted line costs."""

    def __init__(
        self, conversation: Conversation, meter: Meter, stood: Mapping[Unit, _StoodFor]
    ) -> None:
        self._known = facts(conversation)
        self._before = cut_from(conversation)
        self._meter = meter
        self._stood = stood
        self._said: dict[Unit, list[_Said]] = {}
        self._costs: dict[str, int] = {}
        self._carried: list[frozenset[str]] | None = None  # each message's, once asked for

    def unit(self, unit: Unit) -> list[_Said]:
        found = self._said.get(unit)
        if found is None:
            found = self._said[unit] = list(self._of(unit))
        return found

    def _of(self, unit: Unit) -> Iterator[_Said]:
        if unit in self._stood:  # a notice of this request's: what its results could say
            yield from self._stood[unit].said()
            return
        if unit.kind != "tools":
            return
        known = self._known
        for index in unit.indices:
            for result in known.results[index]:
                if is_placeholder(result.text):  # cleared: the line it quotes and its names
                    line, ranked = _quoted(result.text) or "", _named(result.text)
                    order = {name: n for n, name in enumerate(ranked)}
                    ids = tuple(name for name in ranked if is_id(name))
                else:
                    whole = self._before.texts.get((index, result.call_id), result.text)
                    line = next(iter(gist(whole, 1)), "")
                    counts = name_counts(whole, skip=(line,))
                    ranked = tuple(ranked_names(counts))
                    order = {name: n for n, name in enumerate(counts)}
                    ids = tuple(name for name in counts if is_id(name))
                if line or ranked:
                    yield _Said(result.tool, line, ranked[:NAMES_RANKED], order, ids)

    def _listed_cost(self, name: str) -> int:
        """The tokens `name` adds to a names line (with its separator)."""
        return self._cost(NAMES_SEPARATOR + name) - 1

    def _cost(self, line: str) -> int:
        found = self._costs.get(line)
        if found is None:
            found = self._costs[line] = self._meter.text_tokens(line) + 1
        return found

    def chosen(self, removed: Sequence[Unit], allowance: int, id_room: int) -> list[str]:
        """The notice's quoted lines: those of the latest removed results that fit `allowance`
        (`_lines`), then, in `id_room` of its own, one line of the ids they all printed that no
        quoted line lists (`_ids_line`); tokens of the encoding, as the lines are measured. A
        name the kept messages carry (`Facts.carried`) is not listed."""
        if self._carried is None:  # the same for every removed set tried: worked out once
            self._carried = [self._known.carried(i) for i in range(len(self._known.messages))]
        gone = {i for unit in removed for i in unit.indices}
        shown: set[str] = set().union(
            *(names for i, names in enumerate(self._carried) if i not in gone)
        )
        picked = self._lines(removed, allowance, shown)
        ids = self._ids_line(removed, id_room, shown)
        return [*picked, ids] if ids else picked

    def _newest_first(self, removed: Sequence[Unit]) -> Iterator[_Said]:
        """What each removed result can say (`unit`), the newest result first."""
        for unit in sorted(removed, key=lambda unit: unit.start, reverse=True):
            yield from reversed(self.unit(unit))

    def _lines(self, removed: Sequence[Unit], allowance: int, shown: set[str]) -> list[str]:
        """The lines of the latest removed results that fit `allowance`, in conversation order:
        newest first until one does not fit. A name in `shown` or listed by a newer line is not
        listed (its room goes to the result's next names), and a line that would say nothing
        new is left out. Where every removed result has its line and room is left, that room
        lists more of their names (`_more_names`). Adds the names listed to `shown`."""
        picked: list[str] = []
        quoted_by: list[tuple[_Said, list[str]]] = []  # each picked line's result and names
        lines: set[str] = set()
        spent = 0
        for said in self._newest_first(removed):
            quoted = said.quoted(shown)
            if quoted is None:
                continue
            line, named = quoted
            if not named and said.line in lines:
                continue
            cost = self._cost(line)
            if spent + cost > allowance:
                return picked[::-1]
            picked.append(line)
            quoted_by.append((said, named))
            lines.add(said.line)
            shown.update(named)
            spent += cost
        for at in self._more_names(quoted_by, shown, allowance - spent):
            said, named = quoted_by[at]
            picked[at] = said.written(named)
        return picked[::-1]

    def _ids_line(self, removed: Sequence[Unit], room: int, shown: set[str]) -> str | None:
        """The notice's last line: ids the removed results printed (`_Said.ids`: quoted or not,
        cleared or whole) that `shown` lacks, listed in conversation order; None when there are
        none. An id is a fact a result states once and that nothing else in the request stands
        in for. `NEWEST_IDS_SHARE` of `room` goes to the newest results' ids, the newest
        result's first, each result's in the order printed, until one does not fit: what the
        next turns most likely act on. The rest goes to the cheapest ids of all the others,
        smallest first (`_Said.ids_by_size`; the newer result's first among equals): a bare
        number costs three tokens, a path with a version in it a dozen, and every id is one
        fact. Listed newest first alone, the line held the ids of the last few results and left
        a long session's older ones out whole (bench.fidelity, 2026-12-07: facts kept at 5–10×
        26.9 → 74.2 % in the default run, next-action evidence 82.0 → 82.9 %). The ids of a
        result's own line (its gist) are not among them, quoted or not: listing those of the
        lines not quoted kept fewer facts at 2.5–10× and no more evidence (bench.fidelity,
        2026-12-07): the room went to lines' ids ahead of the others. Ids under one path are
        written under it once (`grouped`: `…/pull/{2385,2390}`), ranked by their whole size as
        before, a path's second id charged its own part and the braces, the next ones their own
        part: grouping only adds ids (a fresh set's facts at ≤ 2.5× 90.3 → 91.9 %). Ranked by
        their own part, grouped paths took the room of bare numbers (facts at 5–10× on a fresh
        set 52.3 → 43.7 %); the braces charged to every path's first id, fewer ids fit where
        paths are distinct (held out, 5–10×: 72.4 → 67.9 %; bench.fidelity, 2026-12-07)."""
        room -= self._cost(IDS_LABEL)
        said = list(self._newest_first(removed))
        listed: dict[str, tuple[int, int]] = {}  # id: its result (newest 0), where it appears
        newest_room = int(room * NEWEST_IDS_SHARE)
        newest = ((result, each, name) for result, each in enumerate(said) for name in each.ids)
        for result, each, name in newest:  # the newest result's first, in the order printed
            if name in shown or name in listed:
                continue
            cost = self._listed_cost(name)
            if cost > newest_room:
                break
            listed[name] = (result, each.order[name])
            newest_room -= cost
            room -= cost
        # The rest, cheapest first — by size, which stands in for the tokens (those of a number
        # exactly, of a path or a hash within a token or two; counting every id's tokens took
        # seconds in a session of a hundred thousand ids) — the newer result's first among
        # equals; each measured once its turn comes.
        sizes = sorted({size for each in said for size in each.ids_by_size})
        # Ids under one path are written under it once (`grouped`): the first costs what
        # it costs alone, the second its own part and the braces, the next their own part.
        heads = Counter(parts[0] for name in listed if (parts := id_under_path(name)))
        for size, (result, each) in itertools.product(sizes, enumerate(said)):
            for name in each.ids_by_size.get(size, ()):
                if name in shown or name in listed:
                    continue
                cost = grouped_cost(name, heads, self._listed_cost)
                if parts := id_under_path(name):
                    heads[parts[0]] += 1
                if cost > room:
                    return self._listed_ids(listed, shown)
                listed[name] = (result, each.order[name])
                room -= cost
        return self._listed_ids(listed, shown)

    @staticmethod
    def _listed_ids(listed: dict[str, tuple[int, int]], shown: set[str]) -> str | None:
        """The ids line of the ids `listed` (each with its result, newest 0, and where it appears
        in it), in conversation order, those under one path under it once; None when there
        are none. Adds them to `shown`."""
        shown.update(listed)
        if not listed:
            return None
        in_order = sorted(listed, key=lambda name: (-listed[name][0], listed[name][1]))
        return IDS_LABEL + NAMES_SEPARATOR.join(grouped(in_order))

    def _more_names(
        self, quoted_by: list[tuple[_Said, list[str]]], shown: set[str], room: int
    ) -> list[int]:
        """`room` (tokens) spent on more of the quoted results' names, past `NAMES_QUOTED`:
        the newest result's next names first (in `ranked_names` order, none `shown` already),
        then the next newest result's, until a name does not fit; which lines now list more.
        An agent acts on any name a result printed, not only on its first few: a notice with
        room to spare lists them rather than leave the room unused."""
        grown: list[int] = []
        for at, (said, named) in enumerate(quoted_by):
            for name in (name for name in said.ranked if name not in shown):
                cost = self._listed_cost(name)
                if cost > room:
                    return grown
                if not grown or grown[-1] != at:
                    grown.append(at)
                named.append(name)
                shown.add(name)
                room -= cost
        return grown


def _size(name: str) -> int:
    """A third of a name's characters, rounded up: its tokens in o200k where it is a number
    (digits go three to a token), within a token or two for a path or a hash — a rank that
    costs no encoding (`_Gists._ids_line`)."""
    return -(-len(name) // 3)


def _quoted(placeholder: str) -> str | None:
    """The first line a placeholder quotes (clear's `> line` under its head), if any."""
    return next((line[2:] for line in placeholder.split("\n")[1:] if line.startswith("> ")), None)


def _named(placeholder: str) -> tuple[str, ...]:
    """The names a placeholder lists (clear's last line, `NAMES_LABEL`), in its order."""
    last = placeholder.rsplit("\n", 1)[-1]
    if not last.startswith(NAMES_LABEL):
        return ()
    return tuple(listed_names(last.removeprefix(NAMES_LABEL)))


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= QUOTE else text[: QUOTE - 1] + "…"


LAST_RESORT = 99  # the value class of units evicted only because nothing else helped


def _batches(
    ordered: Sequence[Unit],
    value: Mapping[Unit, int],
    size: Mapping[Unit, int],
    needed: int,
    step: int,
) -> dict[Unit, tuple[int, int]]:
    """The units to remove (`ordered` by value class, oldest first within each) so that they
    save `needed` — up to the next multiple of `step` tokens of their running sum
    (`snapped_count`) — each with its batch for the summaries: (class, grid step of that
    class's own running sum; every unit a batch of its own when `step` is 0)."""
    count = snapped_count([size[u] for u in ordered], needed, step)
    taken: dict[Unit, tuple[int, int]] = {}
    running: dict[int, int] = {}
    for unit in ordered[:count]:
        worth = value[unit]
        before = running.get(worth, 0)
        taken[unit] = (worth, before // step if step > 0 else len(taken))
        running[worth] = before + size[unit]
    return taken


def _points_to(conversation: Conversation) -> dict[Unit, set[Unit]]:
    """The units whose older copies are pointed onward, each with the units holding the
    results those pointers name."""
    unit_of = facts(conversation).unit_of
    points: dict[Unit, set[Unit]] = {}
    for (named, _), pointers in pointed_at(conversation).items():
        for index, _ in pointers:
            pointer, held = unit_of.get(index), unit_of.get(named)
            if pointer is not None and held is not None:
                points.setdefault(pointer, set()).add(held)
    return points


def _neighbours(units: list[Unit]) -> set[Unit]:
    """The turns right before and right after each system message in the conversation (not the
    leading system prompt): kept unless nothing else helps, so that the message stays where the
    client put it, between the same two turns (Anthropic takes one only right after a user turn
    and right before an assistant turn)."""
    found: set[Unit] = set()
    before: Unit | None = None
    waiting = False  # a system message after `before` wants the next turn too
    for unit in units:
        if unit.kind == "system":
            if before is not None:
                found.add(before)
                waiting = True
            continue
        if waiting:
            found.add(unit)
            waiting = False
        before = unit
    return found


def _is_notice(conversation: Conversation, unit: Unit) -> bool:
    """Whether a unit is a notice of brim's, of what an earlier cut removed (a user message or
    a system one, by the API): kept like the first request, it goes only as a last resort —
    into the new notice, whose original holds it (and so the key it names)."""
    if unit.kind not in ("user", "system"):
        return False
    return is_notice(conversation.dialect, conversation.messages[unit.start])


def _notice_at(conversation: Conversation, start: int) -> int:
    """Where the notice goes for removals that begin at `start`: there, or before the system
    messages right in front of it that follow some other message (never before the leading
    system prompt)."""
    units = facts(conversation).units
    position = next(i for i, unit in enumerate(units) if unit.start == start)
    first_other = next((i for i, unit in enumerate(units) if unit.kind != "system"), len(units))
    while position - 1 > first_other and units[position - 1].kind == "system":
        position -= 1
    return units[position].start


def _standing(
    conversation: Conversation, removed: Sequence[Unit], stood: Mapping[Unit, _StoodFor]
) -> _Standing:
    """What `removed` stands for, as the notice's head line says it — a notice of this
    request's (`stood`) counted as what it stood for."""
    dialect, messages = conversation.dialect, conversation.messages
    count = tokens = 0
    tools: Counter[str] = Counter()
    names = facts(conversation).names
    requests: list[str] = []
    for unit in removed:
        entry = stood.get(unit)
        if entry is not None:
            count, tokens = count + entry.standing.messages, tokens + entry.standing.tokens
            tools.update(entry.standing.tools)
            requests += entry.standing.requests
            continue
        count += len(unit.indices)
        tokens += sum(conversation.sizes[i] for i in unit.indices)
        if unit.kind == "tools":
            tools.update(names.get(call, "tool") for call in dialect.calls(messages[unit.start]))
        elif unit.kind == "user" and not _is_notice(conversation, unit):
            requests.append(_quote(dialect.text(messages[unit.start])))
    return _Standing(count, tokens, tools, tuple(requests))


class Evict:
    name = "evict"

    def __init__(self, settings: EvictSettings | None = None) -> None:
        self.settings = settings or EvictSettings()

    @staticmethod
    def _head(standing: _Standing, key: str) -> str:
        """The notice's head line: what went (`standing`), and the key that restores it."""
        count, tokens, tools, requests = standing
        parts = [
            f"{NOTICE_PREFIX}{count} earlier messages ({tokens} tokens) to fit the context window"
        ]
        if tools:
            listed = ", ".join(
                f"{name} ×{n}" for name, n in sorted(tools.items(), key=lambda t: (-t[1], t[0]))[:8]
            )
            parts.append(f"; tool calls: {listed}")
        if requests:
            quoted = "; ".join(f'"{r}"' for r in requests[:5])
            more = f" and {len(requests) - 5} more" if len(requests) > 5 else ""
            parts.append(f"; user requests removed: {quoted}{more}")
        return "".join(parts) + f"; restorable as sha256:{key[:16]}]"

    @staticmethod
    def _build(
        conversation: Conversation, removed: list[Unit], meter: Meter, head: str, said: list[str]
    ) -> Conversation:
        """The conversation without `removed`, with the notice (its `head` line, then `said`)
        in their place; without one where `head` is empty."""
        gone = {i for unit in removed for i in unit.indices}
        inserts: dict[int, tuple[Any, int]] = {}
        if head and removed:
            text = "\n".join([head, GISTS_HEADER, *said]) if said else head
            message = conversation.dialect.notice(text)
            at = _notice_at(conversation, min(unit.start for unit in removed))
            inserts[at] = (message, meter.message(message))
        return conversation.keep(lambda i: i not in gone, inserts)

    @staticmethod
    def _values(conversation: Conversation, units: list[Unit]) -> dict[Unit, int]:
        """Each unit's value class: a tool group whose every result is stale is worth no more
        than an orphan — unless an older copy points to one of them: the pointer goes first."""
        known = facts(conversation)
        values, named = result_values(conversation), pointed_at(conversation)
        worth = {}
        for unit in units:
            value = PRIORITY[unit.kind]
            if (
                unit.kind == "tools"
                and any(values[i] for i in unit.indices)
                and all(v == STALE for i in unit.indices for v in values[i])
                and not any(
                    (i, result.call_id) in named
                    for i in unit.indices
                    for result in known.editable[i]
                )
            ):
                value = STALE
            worth[unit] = value
        return worth

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        if conversation.total <= goal.target:
            return conversation, []
        units = facts(conversation).units
        notices = {unit for unit in units if _is_notice(conversation, unit)}
        system = {unit for unit in units if unit.kind == "system" and unit not in notices}
        users = [unit for unit in units if unit.kind == "user" and unit not in notices]
        last = last_request(conversation)
        always = {unit for unit in units if last in unit.indices}  # the last user message
        tail = next((unit for unit in reversed(units) if unit.kind != "system"), None)
        if tail is not None and tail.kind == "tools":  # an ongoing tool loop: the model needs it
            always.add(tail)
        neighbours = _neighbours([unit for unit in units if unit not in notices])
        turns = [
            unit
            for unit in units
            if unit.kind in ("user", "assistant", "tools") and unit not in notices
        ]
        recent_from = len(conversation.messages)
        if self.settings.keep_recent_turns and turns:
            recent_from = turns[-min(self.settings.keep_recent_turns, len(turns))].start
        optional = [
            unit
            for unit in units
            if unit not in system
            and unit not in always
            and (
                unit == (users[0] if users else None)
                or unit.start >= recent_from
                or unit in neighbours
                or unit in notices
            )
        ]
        kept = system | always | set(optional)
        candidates = [unit for unit in units if unit not in kept]
        size = {unit: sum(conversation.sizes[i] for i in unit.indices) for unit in units}
        value = self._values(conversation, candidates)
        used = last_use(conversation)
        recency = {unit: max(used[i] for i in unit.indices) for unit in candidates}
        ordered = sorted(candidates, key=lambda unit: (value[unit], recency[unit], unit.start))

        dumped = _Dumped(conversation)
        stood = _stood_for(conversation, notices)
        gists = _Gists(conversation, meter, stood)
        heads: dict[tuple[Unit, ...], tuple[_Standing, str]] = {}

        def head_of(removed: list[Unit]) -> tuple[_Standing, str]:
            """What `removed` stands for and the notice's head line saying it, worked out once
            per removed set however many rungs of quoted lines are tried under it."""
            found = heads.get(key := tuple(removed))
            if found is None:
                standing = _standing(conversation, removed, stood)
                restores = archive_key(dumped.removed(removed))
                found = heads[key] = (standing, self._head(standing, restores))
            return found

        share, ids_share = self.settings.gist_share, self.settings.ids_share

        def total_without(
            removed: list[Unit],
            notice: bool,
            quoting: bool = True,
            rung: tuple[float, float] = (1.0, 1.0),
        ) -> tuple[Conversation, int]:
            """The conversation without `removed`, with the notice (quoting the latest removed
            results' lines where `quoting`, the lines and the ids line in `rung`'s shares of their
            room) if `notice`, and its size."""
            said: list[str] = []
            if notice and quoting and (share > 0 or ids_share > 0):
                removed_tokens = head_of(removed)[0].tokens  # a notice: what it stood for
                allowance = min(int(goal.limit * share), removed_tokens // _REMOVED_SHARE)
                id_room = min(int(goal.limit * ids_share), removed_tokens // _REMOVED_IDS_SHARE)
                said = gists.chosen(
                    removed,
                    text_tokens_for(int(allowance * rung[0]), meter),
                    text_tokens_for(int(id_room * rung[1]), meter),
                )
            head = head_of(removed)[1] if notice and removed else ""
            built = self._build(conversation, removed, meter, head, said)
            return built, built.total

        def first_fit(
            removed: list[Unit], notice: bool, rooms: list[tuple[float, float]]
        ) -> tuple[Conversation, int] | None:
            """The conversation quoting in the largest of `rooms` that fits under the limit, and
            its size; None if none fits. Rungs 1, 2, 4, 8, … are tried until one fits, then the
            ones between by bisection (a smaller room never quotes more): the first that fits
            is found in a few builds, and is usually near the top."""
            built: dict[int, tuple[Conversation, int]] = {}

            def fits(at: int) -> bool:
                built[at] = total_without(removed, notice, True, rooms[at])
                return built[at][1] <= goal.limit

            low, high = 0, 0  # the first rung that fits is above `low - 1` and at most `high`
            while not fits(high):
                if high == len(rooms) - 1:
                    return None
                low, high = high + 1, min(2 * high + 1, len(rooms) - 1)
            at = bisect.bisect_left(range(low, high), True, key=fits) + low
            return built[at]  # `high` fit; a probe below it that fit built its own

        def within_limit(removed: list[Unit], notice: bool) -> tuple[Conversation, int, bool]:
            """The conversation without `removed`, its notice quoting as much as fits under the
            limit — the largest rung of the ladder that does (`_RECUT` where the session asks
            room for its next turns, else `_FIRST_CUT`), the newest results' lines first — or
            nothing where nothing fits; its size, and whether the notice quotes. A rung rather
            than the exact room left: the notice keeps its bytes from turn to turn while the
            same rung fits."""
            bare, bare_total = total_without(removed, notice, False)
            if bare_total >= goal.limit:
                return bare, bare_total, False
            ladder = _RECUT if goal.room > 0 else _FIRST_CUT
            for ids_whole in (True, False) if ladder.ids_whole_first else (False,):
                found = first_fit(removed, notice, ladder.rooms(ids_whole))
                if found is not None:
                    return found[0], found[1], True
            return bare, bare_total, False

        def put_back(
            removed: list[Unit], result: Conversation, total: int
        ) -> tuple[list[Unit], Conversation, int]:
            """`removed` less the units that the request has room for after all, the most
            valuable first: the batch's last unit may save far more than was still needed (one
            long tool result), and the ones removed before it need not go. Room under the
            target as the batch is snapped: what was needed, rounded up to the grid — the cut
            still moves only when that does. The notice shrinks with what it stands for, so
            the room is looked at again."""
            needed = conversation.total - goal.target
            snapped = -(-needed // step) * step if step > 0 else needed
            bound = max(total, conversation.total - snapped)
            points = _points_to(conversation)
            for _ in range(_PUT_BACK_ROUNDS):
                room, back = bound - total, list[Unit]()
                for unit in reversed(ordered):
                    if (
                        unit in batch
                        and size[unit] <= room
                        and len(back) < len(removed) - 1
                        # a pointer never names a result that is gone
                        and all(
                            target not in batch or target in back for target in points.get(unit, ())
                        )
                    ):
                        back.append(unit)
                        room -= size[unit]
                while back:  # built to be sure: the notice changes too
                    going = set(back)
                    kept_out = [unit for unit in removed if unit not in going]
                    built, built_total = total_without(kept_out, self.settings.notice)
                    if built_total <= bound:
                        break
                    back.pop()  # the least valuable of them stays out
                if not back:
                    break
                for unit in back:
                    del batch[unit]
                removed, result, total = kept_out, built, built_total
            return removed, result, total

        step = goal.step(self.settings.evict_at_least)
        removed: list[Unit] = []
        batch: dict[Unit, tuple[int, int]] = {}
        notice_allowance = 0
        result, total = conversation, conversation.total
        for _ in range(4):  # the notice's own size is only known once it is written
            needed = conversation.total - goal.target + notice_allowance
            batch = _batches(ordered, value, size, needed, step)
            removed = list(batch)
            result, total = total_without(removed, self.settings.notice)
            if total <= goal.target or len(removed) == len(candidates):
                break
            notice_allowance += total - goal.target

        if removed and total <= goal.target:
            removed, result, total = put_back(removed, result, total)

        quoting = True
        if total > goal.limit:  # the quoted lines are the first to go, as far as the limit needs
            result, total, quoting = within_limit(removed, self.settings.notice)
        running = 0  # last resorts are batched (for their summaries) on their own grid
        evictable = len(removed)  # the units removed before any last resort
        # Last resort, oldest first, only as far as the limit demands — and only in compress's
        # last-resort pass, after the cuts into text that spare these units.
        for unit in () if goal.reversible_only else optional:
            if total <= goal.limit:
                break
            if unit in batch:  # a notice released already, with the first unit
                continue
            # An earlier notice goes into the new one with the first unit released: one notice.
            released = [unit, *sorted(notices - {unit, *removed}, key=lambda u: u.start)]
            for each in released:
                removed.append(each)
                batch[each] = (LAST_RESORT, running // step if step > 0 else len(batch))
                running += size[each]
            result, total = total_without(removed, self.settings.notice, quoting)
        if not quoting and len(removed) > evictable and total < goal.limit:
            # The units released may leave room under the limit: the lines take what fits.
            result, total, quoting = within_limit(removed, self.settings.notice)
        if total > goal.limit and self.settings.notice and removed:
            without, smaller = total_without(removed, False)
            if smaller <= goal.limit:
                result, total = without, smaller
            elif goal.text_cuts and not quoting:
                # Over the limit whatever the notice says: text is cut next (in this pass, or
                # in the last-resort pass that follows a reversible one over the limit; the
                # newest turn at last). The ids line keeps its share — beside turns that take
                # the whole budget, the one trace of what the older results printed.
                result, total = total_without(removed, True, True, (0.0, 1.0))

        # what the notice as built stands for (worked out already where it was built)
        standing = head_of(removed)[0] if self.settings.notice and removed else None
        removed.sort(key=lambda unit: unit.start)
        records = [
            FidelityRecord(
                self.name,
                "evicted",
                conversation.origin[unit.start],
                size[unit],
                0,
                archive_key=archive_key(dumped.unit(unit)),
                detail=unit.kind,
                original=dumped.unit(unit),
                batch=batch[unit],
            )
            for unit in removed
        ]
        written = [
            i
            for i, origin in enumerate(result.origin)
            if origin == -1 and result.messages[i] not in conversation.messages
        ]
        if written:  # the notice names every removed message by one key: its record keeps them
            original = dumped.removed(removed)
            key = archive_key(original)
            records += [
                FidelityRecord(
                    self.name, "notice", -1, 0, result.sizes[i], archive_key=key, original=original
                )
                for i in written
            ]
            assert standing is not None  # a notice was written
            entry = _StoodFor(standing, gists, tuple(removed))
            known = {  # those of this request's notices that stay, and the new one
                conversation.dialect.text(conversation.messages[unit.start]): stood_for
                for unit, stood_for in stood.items()
                if unit not in removed
            }
            known |= {result.dialect.text(result.messages[i]): entry for i in written}
            result.memo[_NOTICES] = _Notices(known)
        return result, records
