"""Which lines of a text to keep when it must be cut: by their information, not by position.

Used where brim cuts into text — a tool result cut to its most informative lines
(`prune_tool_results`), a message cut in the middle (`truncate`), a restored original that
still does not fit (`middleware.stages.restore`). Each run of dropped lines becomes one marker with
its count, so what was left out is said.

- `cut_middle`: by tokens, head and tail kept (a single huge line, a text of few lines);
- `relevant_lines`: head and tail, every anomaly, the lines that stand out and those with a
  task term (the relevant part of a long JSON string);
- `informative_lines` (and `digest_lines`, its share of a text): the first and last line, then
  the lines that say most that nothing else in the session says (`LineStats`): rare words,
  identifiers and numbers found nowhere else; a line repeated or differing from another only
  in its numbers counts once, anomalies included — the twentieth `return nil,
  fmt.Errorf(…, err)` of a file is no news, the one comment line unlike every other is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from brim.policies.conversation import Meter
from brim.policies.information import LineStats, scores_of, words
from brim.policies.text import is_anomaly, mentions

MARKER_TOKENS = 20  # what one "[… N lines … omitted by brim …]" line costs, about
DIGEST_MARKER_TOKENS = 12  # …and one "[… N lines omitted by brim …]", a digest's
FEW_ANOMALIES = 3  # a digest keeps this many anomaly lines wherever they fit
MIN_LINES = 8  # fewer lines than this: cut by tokens, not by lines
LINE_END_SHARE = 0.1  # a cut in the middle stops at a line end within this share of what it keeps


class Middle(NamedTuple):
    """The middle `cut_middle` takes out, and what stays around it."""

    removed: int  # tokens
    text: str  # what went
    head: str
    tail: str


def cut_middle(
    text: str,
    keep_tokens: int,
    meter: Meter,
    head_share: float = 1 / 3,
    *,
    tokens: Sequence[int] | None = None,
    marker: Callable[[Middle], str] | None = None,
) -> tuple[str, int]:
    """`text` with its middle replaced by a marker so about `keep_tokens` remain, cut at line
    ends where there are any (`tokens`: the text's own, when the caller has them already;
    `marker`: what the marker says, given the middle that went). Returns the new text and how
    many tokens were removed."""
    if tokens is None:
        tokens = meter.tokens(text)
    if len(tokens) <= keep_tokens:
        return text, 0
    head_n = max(1, int(keep_tokens * head_share))
    tail_n = max(1, keep_tokens - head_n)
    head = meter.decode(tokens[:head_n])
    tail = meter.decode(tokens[-tail_n:])
    # At a line end where one is near (a text of a few long lines would lose up to half of
    # what it keeps, and the request go out far below its budget), else where the tokens end.
    if "\n" in head[len(head) - _line_end_reach(head) :]:
        head = head[: head.rindex("\n") + 1]
    if "\n" in tail[: _line_end_reach(tail)]:
        tail = tail[tail.index("\n") + 1 :]
    removed = len(tokens) - len(meter.tokens(head)) - len(meter.tokens(tail))
    if marker is None:
        said = f"\n[… {removed} tokens cut from the middle by brim …]\n"
    else:
        end = len(text) - len(tail)
        exact = text.startswith(head) and text.endswith(tail) and len(head) <= end
        middle = text[len(head) : end] if exact else meter.decode(tokens[head_n:-tail_n])
        said = marker(Middle(removed, middle, head, tail))
    return head.rstrip("\n") + said + tail.lstrip("\n"), removed


def _line_end_reach(kept: str) -> int:
    """How far back (in characters) a cut keeping `kept` looks for a line end to stop at."""
    return int(len(kept) * LINE_END_SHARE)


def _line_marker(omitted: int, telling: int, brief: bool = False) -> str:
    if brief:  # a digest's: many of them, so short (and no anomaly word in it)
        if not telling:
            return f"[… {omitted} lines omitted by brim …]"
        return f"[… {omitted} lines omitted by brim, {telling} with task terms or anomalies …]"
    if not telling:
        return f"[… {omitted} lines without task terms or errors omitted by brim …]"
    return f"[… {omitted} lines omitted by brim, {telling} of them with task terms or errors …]"


# A marker of either kind, with its counts: a digest of a cut text adds them to its own.
_MARKER_COUNTS = re.compile(r"\[… (\d+) lines [^\]]*?omitted by brim(?:, (\d+) [^\]]*)? …\]")


class _Picker:
    """Which lines of a text to keep within a token budget, a line at a time, where each run of
    dropped lines costs one marker."""

    def __init__(self, cost: Sequence[int], marker: int) -> None:
        self.cost, self.marker = cost, marker
        self.count = len(cost)
        self.kept = [False] * self.count
        self.used = marker  # nothing kept yet: one run of dropped lines

    def add(self, index: int, within: int) -> bool:
        """Keep line `index` if the text stays within `within` tokens."""
        kept, count = self.kept, self.count
        before = index > 0 and not kept[index - 1]
        after = index < count - 1 and not kept[index + 1]
        runs = (before and after) - (not before and not after)  # a run split, or one closed
        added = self.cost[index] + self.marker * runs
        if self.used + added > within:
            return False
        kept[index] = True
        self.used += added
        return True

    def ends(self, within: int) -> None:
        """The first and the last line, always."""
        self.add(0, within + self.cost[0])
        self.add(self.count - 1, max(within, self.used + self.cost[-1]))

    def text(self, lines: Sequence[str], telling: Sequence[int], brief: bool = False) -> str:
        """The kept lines, each run of dropped ones as one marker with its count (and how many
        of them were `telling`); a dropped marker's counts are added to its run's."""
        out: list[str] = []
        index, count, kept = 0, self.count, self.kept
        while index < count:
            if kept[index]:
                out.append(lines[index])
                index += 1
                continue
            omitted = flagged = 0
            while index < count and not kept[index]:
                found = _MARKER_COUNTS.fullmatch(lines[index])
                if found:
                    omitted += int(found[1])
                    flagged += int(found[2] or 0)
                else:
                    omitted += 1
                    flagged += bool(telling[index])
                index += 1
            out.append(_line_marker(omitted, flagged, brief))
        return "\n".join(out)


def _ranks(lines: Sequence[str], terms: frozenset[str]) -> list[int]:
    """Each line's class: 2 if it reports an anomaly, 1 if it mentions a task term, else 0."""
    # A term is a piece of the line's lower-case text: most lines fail this cheaply.
    found = re.compile("|".join(map(re.escape, sorted(terms)))).search if terms else None
    # A line reports an anomaly only where the text it is in does (looked for a few thousand
    # lines at once): where none does, no line is asked.
    anomalous = any(map(is_anomaly, _chunks(lines)))
    if found is None and not anomalous:
        return [0] * len(lines)

    def rank(line: str) -> int:
        if anomalous and is_anomaly(line):
            return 2
        return int(found is not None and bool(found(line.lower())) and mentions(line, terms))

    ranks = {line: rank(line) for line in dict.fromkeys(lines)}  # a repeated line: once
    return [ranks[line] for line in lines]


def _chunks(lines: Sequence[str], size: int = 4_096) -> Iterator[str]:
    """The lines joined, a few thousand at a time: a line reports an anomaly only where the
    text it is in does, and one search of a chunk is far cheaper than one per line."""
    for start in range(0, len(lines), size):
        yield "\n".join(lines[start : start + size])


def relevant_lines(text: str, terms: frozenset[str], keep_tokens: int, meter: Meter) -> str:
    """`text` cut to about `keep_tokens` by lines: head and tail, then every line that reports an
    anomaly, then the lines that stand out (`policies.information.line_scores`: far rarer words
    than most lines have) within a quarter of what is left, then every line that mentions a
    task term (in that order, while they fit), then more head and tail; each run of dropped
    lines becomes one marker with its count. Each line is tokenized once, and the text as a
    whole not at all."""
    lines = text.split("\n")
    if len(lines) < MIN_LINES:
        return cut_middle(text, keep_tokens, meter)[0]
    cost = [len(meter.tokens(line)) + 1 for line in lines]
    if sum(cost) - 1 <= keep_tokens:
        return text
    count = len(lines)
    rank = _ranks(lines, terms)
    picker = _Picker(cost, MARKER_TOKENS)
    add, kept = picker.add, picker.kept
    picker.ends(keep_tokens)
    head = 1
    while head < count and not kept[head] and add(head, keep_tokens // 8):
        head += 1
    tail = count - 2
    while tail >= 0 and not kept[tail] and add(tail, keep_tokens // 8 + keep_tokens // 6):
        tail -= 1
    for index in range(count):
        if rank[index] == 2 and not kept[index]:
            add(index, keep_tokens)
    # Lines that stand out (twice as informative as the median line, best first) within a
    # quarter of what is left: the one line a templated log says once.
    scores = scores_of(text)
    positive = sorted(score for score in scores if score > 0)
    if positive:
        stand_out = 2 * positive[len(positive) // 2]
        within = picker.used + (keep_tokens - picker.used) // 4
        for index in sorted(range(count), key=lambda i: (-scores[i], i)):
            if scores[index] < stand_out:
                break
            if not kept[index]:
                add(index, within)
    for index in range(count):
        if rank[index] == 1 and not kept[index]:
            add(index, keep_tokens)
    spare = picker.used + (keep_tokens - picker.used) // 3
    while head < count and not kept[head] and add(head, spare):
        head += 1
    while tail >= 0 and not kept[tail] and add(tail, keep_tokens):
        tail -= 1
    shrunk = picker.text(lines, rank)
    if picker.used > keep_tokens * 1.25:  # a few giant lines (the first, the last): cut by tokens
        shrunk = cut_middle(shrunk, keep_tokens, meter)[0]
    return shrunk


def digest_lines(
    text: str,
    terms: frozenset[str],
    share: float,
    floor: int,
    meter: Meter,
    cap: int | None = None,
    stats: LineStats | None = None,
) -> str:
    """`text` cut by information to about `share` of its tokens (of at most `cap` of them: the
    share of what a cut to `cap` would keep; and at least `floor`): `informative_lines`."""
    lines = text.split("\n")
    if len(lines) < 3:
        tokens = meter.tokens(text)
        keep_tokens = max(floor, int(min(len(tokens), cap or len(tokens)) * share))
        return cut_middle(text, keep_tokens, meter, tokens=tokens)[0]
    total = meter.text_tokens(text)
    keep_tokens = max(floor, int(min(total, cap or total) * share))
    return informative_lines(text, keep_tokens, terms, meter, stats, total=total)


def informative_lines(
    text: str,
    keep_tokens: int,
    terms: frozenset[str],
    meter: Meter,
    stats: LineStats | None = None,
    *,
    total: int | None = None,
) -> str:
    """`text` cut by information to about `keep_tokens`: its first and last line, a few
    anomaly lines (one of each kind: an anomaly that repeats, or differs from another only in
    a few words, is one anomaly), the lines that mention a task term, then the most informative
    of the rest (`LineStats.scores`: rare words and identifiers across the session `stats`
    describes, or the text alone) — each class best first, while they fit; then, where room is
    left, the lines that say nothing new, from the head. Kept lines stay in order, each run of
    dropped ones becomes one short marker with its count. Never longer than `text`; the text is
    counted once (`total`: its tokens, if the caller has them), and each line costs its share
    of the text's characters (the size is a share of the text, not an exact count)."""
    lines = text.split("\n")
    if len(lines) < 3:
        return cut_middle(text, keep_tokens, meter)[0]
    if total is None:
        total = meter.text_tokens(text)
    if total <= keep_tokens:
        return text
    ratio = total / max(1, len(text))
    cost = [1 + int(len(line) * ratio) for line in lines]
    scores = (stats or LineStats.of([text])).scores(lines)
    rank = [0 if score < 0 else r for r, score in zip(_ranks(lines, terms), scores, strict=True)]
    if 2 * sum(1 for r in rank if r == 1) > len(lines):  # a term on most lines tells none apart
        rank = [r if r != 1 else 0 for r in rank]
    best_first = sorted(range(len(lines)), key=lambda index: (-scores[index], index))
    _one_of_each_kind(lines, rank, best_first)
    picker = _Picker(cost, DIGEST_MARKER_TOKENS)
    picker.ends(keep_tokens)
    # Anomalies, then task lines, each class up to half of what is left (best first), then the
    # most informative lines, then what is left of both classes while anything fits. The best
    # few anomalies are kept while they fit at all: half of what is left may be less than two
    # short lines and the markers around them.
    within = picker.used + (keep_tokens - picker.used) // 2
    few = 0
    for index in best_first:
        if few >= FEW_ANOMALIES:
            break
        if rank[index] == 2 and not picker.kept[index] and picker.add(index, keep_tokens):
            few += 1
    for wanted in (2, 1):
        if wanted == 1:
            within = picker.used + (keep_tokens - picker.used) // 2
        for index in best_first:
            if rank[index] == wanted and not picker.kept[index]:
                picker.add(index, within)
    for index in best_first:
        if not picker.kept[index] and (rank[index] or scores[index] > 0):
            picker.add(index, keep_tokens)
    # Room left: the lines that say nothing the kept ones do not, from the head — a cut goes
    # no further than it was asked to.
    for index in range(len(lines)):
        if not picker.kept[index] and scores[index] >= 0:
            picker.add(index, keep_tokens)
    shrunk = picker.text(lines, rank, brief=True)
    if picker.used > keep_tokens * 1.25:  # a few giant lines: cut by tokens too
        shrunk = cut_middle(shrunk, keep_tokens, meter)[0]
    return shrunk if len(shrunk) < len(text) else text


def _one_of_each_kind(lines: Sequence[str], rank: list[int], best_first: Sequence[int]) -> None:
    """Anomaly lines (rank 2) that repeat one already seen — the same words but for a few
    (`_SAME_KIND` of them or more shared, numbers masked), best first — ranked 0 in `rank`: an
    anomaly that comes again is no new anomaly, and is judged by its information alone."""
    seen: list[frozenset[str]] = []
    for index in best_first:
        if rank[index] != 2:
            continue
        found = frozenset(words(lines[index]))
        if any(_similar(found, earlier) for earlier in seen[-_KINDS_COMPARED:]):
            rank[index] = 0
        else:
            seen.append(found)


_SAME_KIND = 0.5  # two lines sharing this share of their words (numbers masked) are one kind
_KINDS_COMPARED = 64  # a line is compared with at most this many earlier kinds


def _similar(one: frozenset[str], other: frozenset[str]) -> bool:
    if not one or not other:
        return one == other
    return len(one & other) >= _SAME_KIND * len(one | other)
