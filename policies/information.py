"""How much a line of a tool result says: its words' rarity within the result.

A tool result repeats itself: log lines that differ only in their numbers, a PASSED line per
test, a grep hit per call of the same function, code bodies that reuse the same identifiers.
What it says once — a comment, a config line, a one-off message — is where its information
is. Each line is scored by how rare its words are within the whole result (document frequency
over its lines, numbers and hex masked), so templated lines score low whatever their numbers,
and a line that stands out scores high. The same measure ranks the items of a JSON array.

Used by `prune_tool_results` (its digest keeps a result's most informative lines and items) and
by `clear_tool_results` (a placeholder quotes the result's gist: its few most informative lines,
and lists the names it printed, `names`).
The scores and the gist are pure functions of the text. A result prune cut is judged by its
whole text still: prune notes what each result it cut said before (`remember_cut`), on the
conversation it hands to the next policy, for clear's gist (`cut_from`).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, zip_longest
from typing import Any

import orjson

from brim.policies.conversation import Conversation
from brim.policies.facts import ResultKey
from brim.policies.remembered import Remembered
from brim.policies.text import (
    LONG_DIGITS,
    NAMES_SEPARATOR,
    grouped_cost,
    id_under_path,
    identifier_counts,
    identifiers,
    identifiers_among,
    identifiers_of,
    is_id,
    strings_of,
)

_HEX_WORD = re.compile(r"\b[0-9a-f]*\d[0-9a-f]*\b")  # a number, a hash, a key
_DIGITS = re.compile(r"\d+")
_NUMBER = re.compile(r"[\d.,:]+")  # a line number, a count, a version: a name only if long
# The line number a file read prints before each line (`    12\t`, `  12→`, `00012| `,
# `12:`), and grep's or ripgrep's before a context line (`12-`, not a date's `2024-11`), with
# the mark after it: where the line is, not what it says.
_GUTTER = re.compile(r"^([ \t]*)(\d+)(?:[\t→|:]| {2}|-(?!\d))", re.MULTILINE)
_WORD = re.compile(r"\w*[^\W\d_]\w*")  # a word with a letter in it
# The envelope Codex's exec_command puts around what a command printed: a chunk id, the wall
# time, the exit code and the output's size, then "Output:" (and, where Codex cut the output,
# its warning saying so). The same lines open every result, with a fresh id: facts about the
# call, not what the command said. In Codex's sessions one notice line in four quoted "Wall
# time: 0.0000 seconds", and nine in ten listed the chunk id as the result's first name (bench
# corpus, whole sessions at 5×, Chat).
_ENVELOPE = re.compile(
    r"\AChunk ID: \S+\nWall time: [^\n]*\nProcess exited with code [^\n]*\n"
    r"(?:Original token count: [^\n]*\n)?Output:\n"
    r"(?:Warning: truncated output \(original token count: \d+\)\n)?"
)
# The note that ends a result prune shortened, naming the key of its whole.
SHORTENED = "[brim shortened this result; the whole is sha256:"
# Brim's own markers (of omitted lines, items or tokens, and that note): they say nothing about
# the result.
_MARKER = re.compile(
    r"\[… \d+ [^\]]*by brim[^\]]*…\]|… \d+ more items …|" + re.escape(SHORTENED) + r"[0-9a-f]{16}\]"
)
_CUT_FROM = "cut_from"  # the memo key of `remember_cut`
_SMOOTHING = 2  # a line of one rare word is no more telling than a sentence of rare words
_GIST_RATIO = 0.6  # a gist quotes no line scoring below this share of its best line's
GIST_WIDTH = 200  # characters of a line a gist quotes at most

_GISTS: Remembered[tuple[int, int, int, int], tuple[str, ...]] = Remembered(maxsize=8_192)
_SCORES: Remembered[tuple[int, int], list[float]] = Remembered(maxsize=2_048)
_LOCK = threading.Lock()


def words(text: str) -> list[str]:
    """The lower-case words of `text` that can tell one line from another: numbers alone and
    hex strings (hashes, keys, ids) are left out, and digits inside a word are masked, so
    `test_total_12` and `test_total_13` are the same word and a line differing from its
    neighbours only by numbers has nothing of its own."""
    return _WORD.findall(_DIGITS.sub("0", _HEX_WORD.sub(" ", text.lower())))


def is_marker(line: str) -> bool:
    """Whether a line is one of brim's own markers of what it left out."""
    return bool(_MARKER.fullmatch(line.strip()))


def rarity_scores(pieces: Sequence[Sequence[str]]) -> list[float]:
    """For each piece (a line's or an item's words), how rare its words are among the pieces:
    the sum of each distinct word's inverse document frequency, log(pieces / pieces with the
    word), over its number of distinct words plus a small constant. A word every piece has
    scores nothing; a piece without words scores 0."""
    sets = list(map(frozenset, pieces))
    return _rarity(sets, sets)


def _rarity(pieces: Sequence[frozenset[str]], scored: Sequence[frozenset[str]]) -> list[float]:
    """`rarity_scores` of the pieces in `scored` among all `pieces` (each its distinct words)."""
    seen = Counter(chain.from_iterable(pieces))
    total = max(1, sum(1 for found in pieces if found))
    rarity = {word: math.log(total / count) for word, count in seen.items()}
    weigh = rarity.__getitem__
    return [
        math.fsum(map(weigh, found)) / (len(found) + _SMOOTHING) if found else 0.0
        for found in scored
    ]


def line_scores(lines: Sequence[str]) -> list[float]:
    """How informative each line is within `lines` (brim's markers score below every line). A
    line that comes again (a blank line, a repeated log line) is read and scored once."""
    at = {line: n for n, line in enumerate(dict.fromkeys(lines))}
    distinct = list(at)
    joined = "\n".join(distinct)
    masked = _DIGITS.sub("0", _HEX_WORD.sub(" ", joined.lower()))  # as `words`, all at once
    pieces = list(map(_WORD.findall, masked.split("\n")))
    if len(pieces) != len(distinct):  # a line with a line break in it: one at a time
        pieces = [words(line) for line in distinct]
    markers = [False] * len(distinct)
    if "by brim" in joined or "more items" in joined or SHORTENED in joined:
        markers = [is_marker(line) for line in distinct]
    sets = [
        frozenset(() if marker else piece) for piece, marker in zip(pieces, markers, strict=True)
    ]
    scores = _rarity([sets[at[line]] for line in lines], sets)
    scores = [-1.0 if marker else score for score, marker in zip(scores, markers, strict=True)]
    return [scores[at[line]] for line in lines]


def scores_of(text: str) -> list[float]:
    """`line_scores` of the lines of `text`, remembered by content: prune's cuts and digests and
    clear's gist all judge the same results."""
    key = (len(text), hash(text))
    with _LOCK:
        known = _SCORES.get(key)
    if known is None:
        known = line_scores(text.split("\n"))
        with _LOCK:
            _SCORES[key] = known
    return known


def item_scores(items: Sequence[Any]) -> list[float]:
    """How informative each item of a JSON array is among them: the rarity of the words in its
    strings (keys aside: the items of an array share theirs)."""
    return rarity_scores([words(" ".join(strings_of(item))) for item in items])


def rare_keys(items: Sequence[Any], share: float = 0.1) -> list[bool]:
    """For each item of a JSON array, whether it is an outlier by its fields: it has a value in
    a field that at most `share` of the array's objects have a value in (an object among five
    or more; a field with null, false, zero or an empty value has none)."""
    keys = [_filled_keys(item) if isinstance(item, dict) else frozenset() for item in items]
    objects = sum(1 for item in items if isinstance(item, dict))
    if objects < 5:
        return [False] * len(items)
    held = Counter(key for found in keys for key in found)
    most = max(1, int(objects * share))
    return [any(held[key] <= most for key in found) for found in keys]


def _filled_keys(item: dict[Any, Any]) -> frozenset[str]:
    return frozenset(
        str(key) for key, value in item.items() if value not in (None, False, 0, "", [], {})
    )


@dataclass(frozen=True, slots=True)
class CutFrom:
    """What the results a policy cut were before the cut (`remember_cut`)."""

    texts: dict[ResultKey, str] = field(default_factory=dict)  # by (message index, call key)
    sizes: dict[int, int] = field(default_factory=dict)  # their messages' tokens, by index


def remember_cut(conversation: Conversation, before: CutFrom) -> None:
    """Note on `conversation` (the one a policy returns) what each result it cut was before the
    cut: a result cut to its relevant part or its digest lost the rarity of its lines, which its
    gist is judged by, and a placeholder that replaces it later names the whole — its size and
    key — whether or not it was cut first, so it is the same every turn (`cut_from`). Kept as
    long as the conversation is."""
    if before.texts:
        conversation.memo[_CUT_FROM] = before


def cut_from(conversation: Conversation) -> CutFrom:
    """What the results of `conversation` were before a policy cut them (`remember_cut`);
    empty where nothing was noted."""
    found = conversation.memo.get(_CUT_FROM)
    return found if isinstance(found, CutFrom) else CutFrom()


def gist(text: str, count: int, width: int = GIST_WIDTH) -> tuple[str, ...]:
    """The `count` most informative lines of `text`, in their order, each stripped and cut to
    `width` characters: what a cleared result still says. For JSON, its string values are the
    lines, each with the key it is under (`description: …`). Remembered by content."""
    if count <= 0 or not text:
        return ()
    key = (len(text), hash(text), count, width)
    with _LOCK:
        known = _GISTS.get(key)
    if known is None:
        known = _gist(text, count, width)
        with _LOCK:
            _GISTS[key] = known
    return known


def printed(text: str) -> str:
    """What a tool result says: `text` without the envelope a CLI puts around a command's output
    (`_ENVELOPE`, Codex's exec_command)."""
    found = _ENVELOPE.match(text)
    return text[found.end() :] if found else text


def _gist(text: str, count: int, width: int) -> tuple[str, ...]:
    text = printed(text)
    lines = _json_lines(text)
    parsed: Parsed = {}
    if lines is None:
        lines = text.split("\n")
        scores = LineStats.of([text], parsed).scores(lines, parsed)
    else:
        scores = LineStats.of(["\n".join(lines)], parsed).scores(lines, parsed)
    lines = [line.strip() for line in lines]
    ranked = sorted(
        (index for index, line in enumerate(lines) if scores[index] > 0 and line),
        key=lambda index: (-scores[index], index),
    )
    if not ranked:
        return ()
    best = scores[ranked[0]]
    chosen = sorted(index for index in ranked[:count] if scores[index] >= _GIST_RATIO * best)
    return tuple(_clip(lines[index], width) for index in chosen)


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def _json_lines(text: str) -> list[str] | None:
    """The string values of a JSON text as lines, each after its key; None if it is no JSON."""
    stripped = text.strip()
    if not (stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]")):
        return None
    try:
        parsed = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None
    lines: list[str] = []
    pending: list[tuple[str, Any]] = [("", parsed)]
    while pending:  # depth first, in order, without recursion (the JSON may be deep)
        key, value = pending.pop()
        if isinstance(value, dict):
            pending += reversed([(str(k), v) for k, v in value.items()])
        elif isinstance(value, list):
            pending += reversed([(key, v) for v in value])
        elif isinstance(value, str) and value and not is_marker(value):
            label = f"{key}: " if key else ""
            lines += [label + line for line in value.split("\n") if not is_marker(line)]
    return lines


# ---------------------------------------------------------------- information across a session


@dataclass(frozen=True, slots=True)
class _TextTerms:
    """One text's part of a session's `LineStats`: its distinct lines with numbers masked
    (`lines`), in how many of those each word is, and in how many of its distinct lines as
    written each identifier is."""

    lines: int
    words: Counter[str]
    ids: Counter[str]


_TERMS: Remembered[tuple[int, int], _TextTerms] = Remembered(maxsize=4_096)

# A line's words (numbers masked) and identifiers, by the line: what `LineStats` counts and
# scores, worked out once where one caller does both.
Parsed = dict[str, tuple[tuple[str, ...], frozenset[str]]]


def _parse(lines: Iterable[str], parsed: Parsed, text: str | None = None) -> Parsed:
    """`parsed` with the words and identifiers of each of `lines` it lacks, worked out for all
    of them at once: their words as `words` does, on their text joined (a line break is no
    word character: each line's words are the same), and their identifiers among those of
    `text`, the text they are lines of, where given (`identifiers_among`)."""
    todo = [line for line in dict.fromkeys(lines) if line not in parsed]
    if not todo:
        return parsed
    masked = _DIGITS.sub("0", _HEX_WORD.sub(" ", "\n".join(todo).lower())).split("\n")
    if len(masked) != len(todo):  # a line with a line break in it: one at a time
        masked = [" ".join(words(line)) for line in todo]
    known = None if text is None else identifiers_of(text)
    for line, said in zip(todo, masked, strict=True):
        named = identifiers(line) if known is None else identifiers_among(line, known)
        parsed[line] = (tuple(_WORD.findall(said)), named)
    return parsed


def _markers(lines: Sequence[str], text: str | None = None) -> list[bool] | None:
    """Which of `lines` are brim's markers (`is_marker`); None where none can be: the text
    (`text`, the lines joined if not given) has no piece of one."""
    joined = "\n".join(lines) if text is None else text
    if "by brim" in joined or "more items" in joined or SHORTENED in joined:
        return [is_marker(line) for line in lines]
    return None


def _text_terms(text: str, parsed: Parsed | None = None) -> _TextTerms:
    key = (len(text), hash(text))
    with _LOCK:
        known = _TERMS.get(key)
    if known is None:
        distinct = list(dict.fromkeys(text.split("\n")))
        markers = _markers(distinct, text)
        if markers is not None:
            distinct = [line for line, marker in zip(distinct, markers, strict=True) if not marker]
        found = _parse(distinct, {} if parsed is None else parsed, text)
        parts = [found[line] for line in distinct]
        signatures = dict.fromkeys(signature for signature, _ in parts)  # in order, each once
        counted = Counter(chain.from_iterable(map(set, signatures)))
        ids = Counter(chain.from_iterable(named for _, named in parts))
        known = _TextTerms(len(signatures), counted, ids)
        with _LOCK:
            _TERMS[key] = known
    return known


@dataclass(frozen=True, slots=True)
class LineStats:
    """How common each word and identifier is across a session's texts (its tool results):
    words by the distinct lines that have them — a line repeated, or differing from another only
    in its numbers, counts once — and identifiers (`identifiers`) by the distinct lines that
    hold them. What a line says is judged against all of it: a line unlike every other line of
    the session is what a digest exists to keep."""

    lines: int  # distinct lines, numbers masked
    words: Counter[str]
    ids: Counter[str]

    @classmethod
    def of(cls, texts: Iterable[str], parsed: Parsed | None = None) -> LineStats:
        """The stats of `texts`; `parsed`, where given, keeps each line's words and identifiers
        for `scores` of the same lines."""
        parts = [_text_terms(text, parsed) for text in texts]
        if len(parts) == 1:  # one text's (a gist's): its own counts, never changed
            return cls(parts[0].lines, parts[0].words, parts[0].ids)
        counted: Counter[str] = Counter()
        ids: Counter[str] = Counter()
        for part in parts:
            counted.update(part.words)
            ids.update(part.ids)
        return cls(sum(part.lines for part in parts), counted, ids)

    def scores(self, lines: Sequence[str], parsed: Parsed | None = None) -> list[float]:
        """How informative each of `lines` (one text's) is: the rarity across the session of
        its distinct words and identifiers — log(distinct lines ÷ lines that have it, at least
        0) — over their number plus a small constant. Words are counted among the distinct
        lines with numbers masked, identifiers among the lines as written, both against the
        number of the former: a template repeated with a fresh id on each line is not news for
        its ids. The words of a line that comes again in the text, or differs from an earlier
        one only in its numbers, count once: at the first; its identifiers count each time (a
        fresh id is news). brim's own markers score -1, below every line."""
        whole = max(1, self.lines) + 1
        markers = _markers(lines)
        found = _parse(
            lines if markers is None else (x for x, m in zip(lines, markers, strict=True) if not m),
            {} if parsed is None else parsed,
        )
        # Each word's and identifier's rarity, worked out once (`fsum` sums exactly, so the
        # order the terms come in changes nothing); a line that comes again, once its words are
        # counted, scores its identifiers alone, the same each time.
        word_logs: dict[str, float] = {}
        id_logs: dict[str, float] = {}
        seen: set[tuple[str, ...]] = set()
        again: dict[str, float] = {}  # a line's score where its words counted already
        out: list[float] = []
        for index, line in enumerate(lines):
            if markers is not None and markers[index]:
                out.append(-1.0)
                continue
            score = again.get(line)
            if score is None:
                signature, ids = found[line]
                terms = set(signature)
                count = len(terms) + len(ids)
                named = 0.0
                if ids:
                    named += math.fsum([max(0.0, _log(id_logs, i, whole, self.ids)) for i in ids])
                if signature not in seen:
                    seen.add(signature)
                    said = math.fsum([_log(word_logs, w, whole, self.words) for w in terms])
                    said += named
                    score = said / (count + _SMOOTHING) if count else 0.0
                    again[line] = named / (count + _SMOOTHING) if count else 0.0
                else:
                    score = again[line] = named / (count + _SMOOTHING) if count else 0.0
            out.append(score)
        return out


def _log(known: dict[str, float], term: str, whole: int, counts: Counter[str]) -> float:
    """log(whole ÷ the lines `term` is on, at least 1), remembered in `known`."""
    found = known.get(term)
    if found is None:
        found = known[term] = math.log(whole / max(1, counts[term]))
    return found


def name_counts(text: str, skip: Sequence[str] = ()) -> dict[str, int]:
    """The names `text` printed — its identifiers (`identifiers`: paths, dotted, snake_case and
    CamelCase names, hashes and ids) that are not bare numbers, and its long numbers
    (`is_long_number`) but for the line numbers a file read or a grep prints before its lines
    (its context lines' too) — each with how often, in the order they first appear; none of
    those in the lines `skip`. Read from what the result printed (`printed`: not a CLI's
    envelope around it)."""
    # Read without its lines' numbers (a context line's dash would glue one to the line's
    # first name: `1004-result_2`), and none of those numbers a name where printed elsewhere.
    gutters: set[str] = set()

    def unnumbered(line: re.Match[str]) -> str:
        gutters.add(line[2])
        return line[1]

    text = _GUTTER.sub(unnumbered, printed(text))
    quoted = identifiers("\n".join(skip))
    return {
        token: n
        for token, n in identifier_counts(text).items()  # in order of first appearance
        if token not in quoted
        and token not in gutters
        and (not _NUMBER.fullmatch(token) or is_long_number(token))
    }


def is_long_number(token: str) -> bool:
    """Whether `token` is a number that starts with `LONG_NUMBER_DIGITS` digits or more
    (`48213`, `2024.01`): one that names a thing rather than counts it. A version, a time of
    day, a step label or a fraction (`2.14.0`, `12:30:45`, `3.119`, `0.0000`) is not."""
    return bool(_NUMBER.fullmatch(token) and LONG_DIGITS.match(token))


def ranked_names(counts: dict[str, int]) -> list[str]:
    """The names of `counts` (`name_counts`) in the order they are worth listing: the most
    repeated name first, then the first id printed (`is_id`), then the next name, the next id,
    and so on. A repeated name says what a result is about; an id is a fact it states once and
    nothing else in the conversation stands in for. Taking them in turn, neither crowds out the
    other: a directory listing's sizes do not hide its file names, nor its names a source
    file's one constant. (Ids first, or one id to two names, measured the same on four sets of real
    sessions; counting only bare numbers as ids kept fewer planted facts and no more of what
    later turns used: bench.fidelity, 2026-12-07.)"""
    named: list[str] = []
    ids: list[str] = []
    for name in counts:  # in the order printed
        (ids if is_id(name) else named).append(name)
    named.sort(key=counts.__getitem__, reverse=True)  # stable: the first printed first
    return [name for pair in zip_longest(named, ids) for name in pair if name is not None]


def names(text: str, width: int, skip: Sequence[str] = ()) -> tuple[str, ...]:
    """The names `text` printed (`name_counts`) as many as fit `width` characters (each with a
    separator), in the order `ranked_names` gives; listed in the order they first appear; none
    of those in the lines `skip` (its quoted gist). A pure function of the text."""
    return names_fitting(text, width, skip)[0]


def names_fitting(text: str, width: int, skip: Sequence[str] = ()) -> tuple[tuple[str, ...], bool]:
    """`names`, and whether they are all the names `text` printed (but those `skip` quotes):
    then any wider `width` lists the same."""
    counts = name_counts(text, skip)
    chosen = set(fitting(ranked_names(counts), width))
    return tuple(token for token in counts if token in chosen), len(chosen) == len(counts)


def _written_length(name: str) -> int:
    """The characters `name` adds to a names line written alone: itself and a separator."""
    return len(name) + len(NAMES_SEPARATOR)


def fitting(ranked: Iterable[str], width: int, shown: Container[str] = ()) -> list[str]:
    """The first of `ranked` names, in its order, while they fit `width` characters (each with
    a separator, `NAMES_SEPARATOR`), passing over those `shown` already and any first ones
    longer than the whole width (a long absolute path named most often would leave the line
    empty) — as `names_line`
    writes them: ids under one path (`id_under_path`) under it once, the first whole, the
    second its own part and the braces, the next ones their own part."""
    chosen: list[str] = []
    under: Counter[str] = Counter()  # ids chosen under each path
    used = 0
    for name in ranked:
        if name in shown:
            continue
        cost = grouped_cost(name, under, _written_length)
        if used + cost > width:
            if chosen:
                break
            continue  # a first name longer than the whole width: the next ones, not none
        chosen.append(name)
        used += cost
        if parts := id_under_path(name):
            under[parts[0]] += 1
    return chosen
