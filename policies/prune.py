"""`prune_tool_results`: shrink large tool results by their information, not by position.

Four steps, the cheapest first; the results of the tool loop at hand (the newest tool turn,
unless a user request came after it) are never touched:

1. Lossless, on every result: JSON minified, noise fields dropped (URLs, images, base64 blobs,
   nulls by default).
2. Nearly lossless, on every result: an exact copy of a later result (a file read twice with the
   same content, the same command output again) becomes a one-line pointer to the next copy,
   with the sha256 under which the archive keeps the copy (`policies.conversation.pointer`).
3. Lossy, only while the request is still over its target, oldest result first, in batches of at
   least `cut_at_least` tokens (by default the budget's slack): a text result over
   `max_text_tokens` keeps its head and tail and, in between, the lines that report an anomaly
   (errors, warnings, failures, tracebacks, non-2xx statuses, non-zero exit codes) and those
   that mention a task term, with a count of what went; a long JSON array keeps head, tail and
   the items with a task term, an anomaly or a field few other items fill. The task terms are
   those of the task the result was fetched for: the user's first and last request before it
   and the arguments of the calls that fetched it (`policies.conversation.requests`,
   `call_terms`).
4. Lossier, only once step 3 has cut every result and the request is still over its target,
   oldest first and in the same batches — but past the oldest results that the next policy
   must replace with placeholders anyway (an estimate from their sizes, moved in steps of
   `_DIGEST_GRID` results): each result becomes its digest, about `digest_share`
   of its tokens (of at most `max_text_tokens`; at least `digest_min_tokens`) — its first and
   last lines, its anomaly and task lines, then its most informative lines (those whose words
   are rare within it, `policies.information`: the line that says something once, not the
   hundred that differ only in their numbers); a JSON array keeps as many of its items, the
   outliers and the most informative first.

Each step is a pure function of the session up to the result (and later copies of it), cached,
so a result is pruned the same way every turn and the request prefix stays put; the batches
move the lossy frontier only now and then as a session grows. What each cut result said before
its cut is noted on the conversation returned (`policies.information.remember_cut`), so a
placeholder that later replaces it quotes the gist of the whole result.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from brim.policies.conversation import (
    Conversation,
    Facts,
    FidelityRecord,
    Goal,
    Meter,
    ToolResult,
    Unit,
    archive_key,
    copies,
    facts,
    is_anomaly,
    keys_in,
    keys_of,
    mentions,
    pointer,
    snapped_count,
    strings_of,
    text_tokens_for,
)
from brim.policies.information import (
    SHORTENED,
    CutFrom,
    item_scores,
    rare_keys,
    remember_cut,
    scores_of,
)
from brim.policies.nesting import SAFE_DEPTH, nests_deeper_than
from brim.policies.remembered import Remembered

_BASE64 = re.compile(r"^(data:[\w/+.-]+;base64,)?[A-Za-z0-9+/=\s]{512,}$")
_MARKER_TOKENS = 20  # what one "[… N lines … omitted by brim …]" line costs, about
_DIGEST_MARKER_TOKENS = 12  # …and one "[… N lines omitted by brim …]", a digest's
_FEW_ANOMALIES = 3  # a digest keeps this many anomaly lines wherever they fit
_PLACEHOLDER_TOKENS = 40  # what a cleared result's placeholder costs at least
_DIGEST_NEWEST = 4  # results digested where even placeholders for all would not suffice
_DIGEST_GRID = 8  # where digests start moves by this many results at a time
_MIN_LINES = 8  # fewer lines than this: cut by tokens, not by lines


class PruneSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    min_tokens: int = Field(200, ge=0)  # results smaller than this are left alone
    max_text_tokens: int = Field(2_000, ge=64)
    max_array_items: int = Field(20, ge=3)
    array_head: int = Field(8, ge=1)
    array_tail: int = Field(4, ge=0)
    drop_fields: tuple[str, ...] = ("*_url", "url", "image", "image_data", "thumbnail", "avatar*")
    drop_nulls: bool = True
    dedupe: bool = True  # older exact copies of a result become a pointer to the next copy
    cut_at_least: int | None = Field(None, ge=0)  # None: the slack between limit and target
    # Step 4: a result's digest keeps about this share of its tokens (1: no digests)…
    digest_share: float = Field(0.2, gt=0, le=1)
    digest_min_tokens: int = Field(150, ge=16)  # …and at least this many


def cut_middle(
    text: str,
    keep_tokens: int,
    meter: Meter,
    head_share: float = 1 / 3,
    *,
    tokens: Sequence[int] | None = None,
    marker: Callable[[int], str] | None = None,
) -> tuple[str, int]:
    """`text` with its middle replaced by a marker so about `keep_tokens` remain, cut at line
    ends where there are any (`tokens`: the text's own, when the caller has them already;
    `marker`: what the marker says, given the tokens removed). Returns the new text and how
    many tokens were removed."""
    if tokens is None:
        tokens = meter.tokens(text)
    if len(tokens) <= keep_tokens:
        return text, 0
    head_n = max(1, int(keep_tokens * head_share))
    tail_n = max(1, keep_tokens - head_n)
    head = meter.decode(tokens[:head_n])
    tail = meter.decode(tokens[-tail_n:])
    if "\n" in head[len(head) // 2 :]:
        head = head[: head.rindex("\n") + 1]
    if "\n" in tail[: len(tail) // 2]:
        tail = tail[tail.index("\n") + 1 :]
    removed = len(tokens) - len(meter.tokens(head)) - len(meter.tokens(tail))
    said = marker(removed) if marker else f"\n[… {removed} tokens cut from the middle by brim …]\n"
    return head.rstrip("\n") + said + tail.lstrip("\n"), removed


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
_ITEMS_MARKER = re.compile(r"… (\d+) more items …")


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
    if len(lines) < _MIN_LINES:
        return cut_middle(text, keep_tokens, meter)[0]
    cost = [len(meter.tokens(line)) + 1 for line in lines]
    if sum(cost) - 1 <= keep_tokens:
        return text
    count = len(lines)
    rank = _ranks(lines, terms)
    picker = _Picker(cost, _MARKER_TOKENS)
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
) -> str:
    """`text` cut by information to about `share` of its tokens (of at most `cap` of them: the
    share of what a cut to `cap` would keep; and at least `floor`): its first and last line,
    the lines that report an anomaly, those that mention a task term, then the most
    informative of the rest (`policies.information.line_scores`: lines whose words are rare
    within the text) — each class best first, while they fit; a line whose words every other
    line has too (one that differs from them only in its numbers) is not kept for itself.
    Kept lines stay in order, each run of dropped ones becomes one short marker with its count.
    Never longer than `text`; the text is counted once, and each line costs its share of the
    text's characters (a digest's size is a share of the text, not an exact count)."""
    lines = text.split("\n")
    if len(lines) < 3:
        tokens = meter.tokens(text)
        keep_tokens = max(floor, int(min(len(tokens), cap or len(tokens)) * share))
        return cut_middle(text, keep_tokens, meter, tokens=tokens)[0]
    total = meter.text_tokens(text)
    ratio = total / max(1, len(text))
    cost = [1 + int(len(line) * ratio) for line in lines]
    keep_tokens = max(floor, int(min(total, cap or total) * share))
    if total <= keep_tokens:
        return text
    scores = scores_of(text)
    rank = [0 if score < 0 else r for r, score in zip(_ranks(lines, terms), scores, strict=True)]
    if 2 * sum(1 for r in rank if r == 1) > len(lines):  # a term on most lines tells none apart
        rank = [r if r != 1 else 0 for r in rank]
    best_first = sorted(range(len(lines)), key=lambda index: (-scores[index], index))
    picker = _Picker(cost, _DIGEST_MARKER_TOKENS)
    picker.ends(keep_tokens)
    # Anomalies, then task lines, each class up to half of what is left (where they are many,
    # best first: the same warning a hundred times is worth one), then the most informative
    # lines, then what is left of both classes while anything fits. The best few anomalies
    # (different lines) are kept while they fit at all: half of what is left may be less than
    # two short lines and the markers around them.
    within = picker.used + (keep_tokens - picker.used) // 2
    few: set[str] = set()
    for index in best_first:
        if (
            rank[index] == 2
            and not picker.kept[index]
            and len(few) < _FEW_ANOMALIES
            and lines[index] not in few
            and picker.add(index, keep_tokens)
        ):
            few.add(lines[index])
    for wanted in (2, 1):
        if wanted == 1:
            within = picker.used + (keep_tokens - picker.used) // 2
        for index in best_first:
            if rank[index] == wanted and not picker.kept[index]:
                picker.add(index, within)
    for index in best_first:
        if not picker.kept[index] and (rank[index] or scores[index] > 0):
            picker.add(index, keep_tokens)  # a line scoring 0 says nothing the others do not
    shrunk = picker.text(lines, rank, brief=True)
    if picker.used > keep_tokens * 1.25:  # a few giant lines: cut by tokens too
        shrunk = cut_middle(shrunk, keep_tokens, meter)[0]
    return shrunk if len(shrunk) < len(text) else text


def _with_gaps(items: Sequence[Any], keep: set[int]) -> list[Any]:
    """The items at `keep`, each run of the others as one "… N more items …" marker (a dropped
    marker's count added to its run's)."""
    out: list[Any] = []
    gap = 0
    for index, item in enumerate(items):
        if index in keep:
            if gap:
                out.append(f"… {gap} more items …")
                gap = 0
            out.append(item)
            continue
        found = _ITEMS_MARKER.fullmatch(item) if isinstance(item, str) else None
        gap += int(found[1]) if found else 1
    if gap:
        out.append(f"… {gap} more items …")
    return out


_NAMED = re.compile(re.escape(SHORTENED) + r"[0-9a-f]{16}\]")


def shortened(text: str, key: str) -> str:
    """A result cut by its information, naming the key of the whole (under which the archive
    and the restore store keep it, for people and for `brim_restore`): in a last line — or,
    so that JSON stays JSON, as the last item of an array or a last `"brim"` field of an
    object. A text that names its whole already (cut on an earlier turn) keeps that name."""
    if _NAMED.search(text, max(0, len(text) - 100)):
        return text
    note = f"{SHORTENED}{key[:16]}]"
    if text[:1] in ("[", "{") and text[-1:] in ("]", "}"):
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(text)
            if isinstance(parsed, list) and parsed:
                return orjson.dumps([*parsed, note]).decode()
            if isinstance(parsed, dict) and parsed and "brim" not in parsed:
                return orjson.dumps({**parsed, "brim": note}).decode()
    return f"{text}\n{note}"


def _naming(text: str, shrunk: str, named: str | None) -> str:
    """`shrunk`, cut from `text`, naming the whole's key `named` where it was cut and a key is
    given (`shortened`)."""
    return shortened(shrunk, named) if named is not None and shrunk != text else shrunk


def matched_terms(text: str, terms: frozenset[str]) -> frozenset[str]:
    """The task terms `text` mentions (`keys_of`), found without splitting the text into its
    keys where none of them is even a piece of it."""
    if not terms:
        return terms
    key = (len(text), hash(text), terms)
    with _MATCHED_LOCK:
        known = _MATCHED.get(key)
    if known is None:
        known = _matched_terms(text, terms)
        with _MATCHED_LOCK:
            _MATCHED[key] = known
    return known


def _matched_terms(text: str, terms: frozenset[str]) -> frozenset[str]:
    lowered = text.lower()
    present = frozenset(term for term in terms if term in lowered)
    if not present or len(text) < 4_096:
        return present & keys_of(text) if present else present
    # A key lies within a line: only the lines with a term in them need splitting.
    found = re.compile("|".join(map(re.escape, sorted(present)))).search
    lines = [line for line in lowered.split("\n") if found(line)]
    return present & keys_in("\n".join(lines))  # a throwaway text: not remembered


_MATCHED: Remembered[tuple[int, int, frozenset[str]], frozenset[str]] = Remembered(maxsize=8_192)
_MATCHED_LOCK = threading.Lock()

Key = tuple[int, str]  # (message index, call key)
_Edits = Callable[[int, int, set[str]], dict[str, str]]  # (index, size, calls to skip) → texts


class PruneToolResults:
    name = "prune_tool_results"

    def __init__(self, settings: PruneSettings | None = None) -> None:
        self.settings = settings or PruneSettings()
        # A result is pruned the same way every turn; remember it instead of re-tokenizing.
        self._pruned: Remembered[tuple[str, int, int, Hashable], str] = Remembered(maxsize=20_000)
        self._lock = threading.Lock()
        # A noise field's name matches one of `drop_fields` (as `fnmatch.fnmatchcase` does).
        fields = self.settings.drop_fields
        self._noisy = re.compile("|".join(map(fnmatch.translate, fields))).match if fields else None

    def _noise(self, key: str) -> bool:
        return self._noisy is not None and self._noisy(key.lower()) is not None

    def _clean(self, value: Any) -> Any:
        """Lossless in all that matters: noise fields, nulls and base64 blobs go."""
        if isinstance(value, dict):
            return {
                key: self._clean(item)
                for key, item in value.items()
                if not self._noise(str(key)) and not (self.settings.drop_nulls and item is None)
            }
        if isinstance(value, list):
            return [self._clean(item) for item in value]
        if isinstance(value, str) and len(value) >= 512 and _BASE64.match(value):
            return f"[{len(value)} characters of base64 data removed by brim]"
        return value

    def _relevant(self, value: Any, terms: frozenset[str], meter: Meter, budget: int) -> Any:
        """Long arrays to head, tail and the items with task terms or anomalies; long multi-line
        strings to their relevant lines."""
        settings = self.settings
        if isinstance(value, dict):
            return {key: self._relevant(item, terms, meter, budget) for key, item in value.items()}
        if isinstance(value, list):
            if len(value) > settings.max_array_items:
                value = self._relevant_items(value, terms)
            return [self._relevant(item, terms, meter, budget) for item in value]
        if isinstance(value, str) and len(value) > budget and value.count("\n") >= _MIN_LINES:
            return relevant_lines(value, terms, budget, meter)
        return value

    def _relevant_items(self, items: list[Any], terms: frozenset[str]) -> list[Any]:
        settings = self.settings
        count = len(items)
        keep = set(range(settings.array_head)) | set(range(count - settings.array_tail, count))
        outlier = rare_keys(items)
        telling = 0
        for index in range(settings.array_head, count - settings.array_tail):
            if telling >= settings.max_array_items:
                break
            item = items[index]
            # Fields without a value say nothing: `{"failed": false}` is no failure.
            said = item if isinstance(item, str) else orjson.dumps(_said(item)).decode()
            if outlier[index] or is_anomaly(said) or mentions(" ".join(strings_of(item)), terms):
                keep.add(index)
                telling += 1
        return _with_gaps(items, keep)

    def _json(self, text: str) -> Any | None:
        stripped = _bracketed(text)
        if stripped is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(stripped)
                # Deeper JSON than brim can write back stays text.
                if not nests_deeper_than(parsed, SAFE_DEPTH):
                    return parsed
        return None

    def _cached(self, meter: Meter, text: str, mode: Hashable, make: Callable[[], str]) -> str:
        # Python's own string hash (cached on the string) and the length: several times faster
        # than a digest, and collisions are negligible at this cache's size (as in tokens.py).
        key = (getattr(meter, "tokenizer", ""), len(text), hash(text), mode)
        with self._lock:
            cached = self._pruned.get(key)
        if cached is None:
            cached = make()
            with self._lock:
                self._pruned[key] = cached
        return cached

    def lossless_text(self, text: str, meter: Meter) -> str:
        """`text` with JSON minified and its noise dropped; other text as it is."""
        if _bracketed(text) is None:  # no JSON: nothing to look up
            return text

        def make() -> str:
            parsed = self._json(text)
            return text if parsed is None else orjson.dumps(self._clean(parsed)).decode()

        return self._cached(meter, text, "lossless", make)

    def lossy_text(
        self,
        text: str,
        meter: Meter,
        terms: frozenset[str] = frozenset(),
        at_most: int | None = None,
        *,
        named: str | None = None,
    ) -> str:
        """`text` (already lossless) cut to its relevant part. `at_most` bounds its tokens (the
        encoding's) when the caller knows it (from its message's size): a text that cannot be
        over `max_text_tokens` is not tokenized to find out. `named`: the key of the whole
        result, which a cut text names (`shortened`)."""
        matched = matched_terms(text, terms)  # all a relevance cut depends on
        short = at_most is not None and at_most <= self.settings.max_text_tokens
        mode = ("lossy", short, matched, named)

        def make() -> str:
            return _naming(text, self._lossy(text, matched, meter, short), named)

        return self._cached(meter, text, mode, make)

    def _lossy(self, text: str, terms: frozenset[str], meter: Meter, short: bool) -> str:
        limit = self.settings.max_text_tokens
        parsed = self._json(text)
        if parsed is not None:
            long_strings = sum(
                1 for s in strings_of(parsed) if len(s) > limit and s.count("\n") >= _MIN_LINES
            )
            budget = max(256, limit // max(1, long_strings))
            text = orjson.dumps(self._relevant(parsed, terms, meter, budget)).decode()
        if short:  # known to fit `max_text_tokens`: no need to count
            return text
        if parsed is None and len(text) > limit:
            return relevant_lines(text, terms, limit, meter)
        return cut_middle(text, limit, meter)[0]

    def digest_text(
        self,
        text: str,
        meter: Meter,
        terms: frozenset[str] = frozenset(),
        *,
        named: str | None = None,
    ) -> str:
        """`text` cut to its digest: about `digest_share` of its tokens (at least
        `digest_min_tokens`), its most informative lines and items kept (`digest_lines`); a
        cut text names the whole result's key `named` (`shortened`). A pure function of the
        text, the task terms it mentions and the settings: remembered."""
        matched = matched_terms(text, terms)
        settings = self.settings
        mode = ("digest", settings.digest_share, settings.digest_min_tokens, matched, named)

        def make() -> str:
            return _naming(text, self._digest(text, matched, meter), named)

        return self._cached(meter, text, mode, make)

    def _digest(self, text: str, terms: frozenset[str], meter: Meter) -> str:
        settings = self.settings
        share, floor = settings.digest_share, settings.digest_min_tokens
        if share >= 1:
            return text
        parsed = self._json(text)
        cap = settings.max_text_tokens
        if parsed is None:
            return digest_lines(text, terms, share, floor, meter, cap)
        size = meter.text_tokens(text)  # a count, remembered: no token list is needed here
        keep_tokens = max(floor, int(min(size, cap) * share))
        if size <= keep_tokens:
            return text
        shrunk = orjson.dumps(self._digest_value(parsed, terms, meter)).decode()
        left = meter.tokens(shrunk)
        if len(left) > max(2 * keep_tokens, cap):
            # JSON with little to thin out (an object of many fields): cut as text, as step 3
            # does with JSON over `max_text_tokens`
            shrunk = cut_middle(shrunk, keep_tokens, meter, tokens=left)[0]
        return shrunk if len(shrunk) < len(text) else text

    def _digest_value(self, value: Any, terms: frozenset[str], meter: Meter) -> Any:
        """Arrays thinned to their telling items, multi-line strings to their digests."""
        settings = self.settings
        if isinstance(value, dict):
            return {key: self._digest_value(item, terms, meter) for key, item in value.items()}
        if isinstance(value, list):
            items = self._digest_items(value, terms)
            return [self._digest_value(item, terms, meter) for item in items]
        if isinstance(value, str) and value.count("\n") >= 2:
            share, floor = settings.digest_share, settings.digest_min_tokens
            return digest_lines(value, terms, share, floor, meter, settings.max_text_tokens)
        return value

    def _digest_items(self, items: list[Any], terms: frozenset[str]) -> list[Any]:
        """About `digest_share` of an array's items: its first and last, then the outliers (a
        field few others fill), those with a task term, then the most informative (rare words
        in their strings); "… N more items …" for each run of the others."""
        real = [
            index
            for index, item in enumerate(items)
            if not (isinstance(item, str) and _ITEMS_MARKER.fullmatch(item))
        ]
        settings = self.settings
        most = min(len(real), 2 * settings.max_array_items)  # about what a cut keeps, at most
        keep_count = max(3, math.ceil(most * settings.digest_share))
        if keep_count >= len(real):
            return items
        found = [items[index] for index in real]
        outlier = rare_keys(found)
        scores = item_scores(found)
        telling = [mentions(" ".join(strings_of(item)), terms) for item in found]
        keep = {real[0], real[-1]}
        head = 1
        while len(keep) < keep_count // 4 + 1:  # a little more of the head: what it looks like
            keep.add(real[head])
            head += 1
        ranked = sorted(
            range(len(found)), key=lambda j: (not outlier[j], not telling[j], -scores[j], j)
        )
        for j in ranked:
            if len(keep) >= keep_count:
                break
            keep.add(real[j])
        return _with_gaps(items, keep)

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        settings = self.settings
        dialect = conversation.dialect
        known = facts(conversation)
        # The tool loop at hand (the newest tool turn, unless the user has spoken since) whole.
        newest_tools = next((u for u in reversed(known.units) if u.kind == "tools"), None)
        ongoing = newest_tools is not None and newest_tools.end > known.last_request
        spared = set(newest_tools.indices) if newest_tools and ongoing else set()
        results = known.editable
        prunable = [
            index
            for index, found in enumerate(results)
            if found and index not in spared and conversation.sizes[index] >= settings.min_tokens
        ]

        # 1. lossless, and 2. older exact copies pointed onward, on every result: both lose
        # (next to) nothing, and doing them everywhere keeps them out of the cut's arithmetic —
        # a copy pointed onward only when needed would move the cut as rereads come and go.
        texts: dict[Key, str] = {}
        for index in prunable:
            for result in results[index]:
                lossless = self.lossless_text(result.text, meter)
                if lossless != result.text:
                    texts[index, result.call_id] = lossless
        pointed: dict[Key, str] = {}  # (index, call) → the call of the next copy
        if settings.dedupe:
            collide = known.call_counts
            for (index, call_id), (later, copy) in copies(results, texts).items():
                if index in spared:
                    continue
                original = next(r for r in results[index] if r.call_id == call_id)
                at = conversation.origin[later] if collide[copy.call_id] > 1 else None
                sha = archive_key(original.text)
                texts[index, call_id] = pointer(copy.tool, copy.call_id, sha, at)
                pointed[index, call_id] = copy.call_id
        changes = self._rewritten(conversation, results, texts, meter)
        pruned = conversation.with_results(changes)

        # 3. cuts to the relevant part, oldest first, only while over the target, in batches;
        # 4. once every result is cut so and the request is still over, digests, likewise.
        edited: dict[int, tuple[Any, int]] = {}
        cut: dict[int, set[str]] = {}  # index → the calls whose results were cut
        digested: dict[int, set[str]] = {}  # …and those cut further, to their digests
        needed = pruned.total - goal.target
        if needed > 0:
            skip: dict[int, set[str]] = {}
            for index, call_id in pointed:
                if (index, call_id) in texts:
                    skip.setdefault(index, set()).add(call_id)

            def shrink(
                edits: _Edits, done: dict[int, set[str]], among: Sequence[int]
            ) -> Iterator[int]:
                for index in among:
                    message, size = edited.get(index, (pruned.messages[index], pruned.sizes[index]))
                    found = edits(index, size, skip.get(index, set()))
                    if not found:
                        continue
                    updated = message
                    for call_id, text in found.items():
                        updated = dialect.with_tool_result(updated, call_id, text)
                    smaller = meter.message(updated)
                    if smaller < size:
                        edited[index] = (updated, smaller)
                        done[index] = set(found)
                        yield size - smaller

            step = goal.step(settings.cut_at_least)
            terms = _task_terms(known)
            cuts = self._lossy_edits(known, texts, meter, terms)
            snapped_count(shrink(cuts, cut, prunable), needed, step)
            left = needed - sum(pruned.sizes[i] - size for i, (_, size) in edited.items())
            if left > 0 and settings.digest_share < 1:
                sizes = [edited[i][1] if i in edited else pruned.sizes[i] for i in prunable]
                start = self._digests_from(sizes, left)
                digests = self._lossy_edits(known, texts, meter, terms, digest=True)
                snapped_count(shrink(digests, digested, prunable[start:]), left, step)

        records: list[FidelityRecord] = []
        for index in sorted(changes.keys() | edited.keys()):
            origin, before = conversation.origin[index], conversation.sizes[index]
            after = edited[index][1] if index in edited else changes[index][1]
            cut_here, digested_here = cut.get(index, set()), digested.get(index, set())
            deduplicated: list[FidelityRecord] = []
            shrunk: list[FidelityRecord] = []
            only_lossless = False
            for r in results[index]:
                key = (index, r.call_id)
                if key in pointed and key in texts:
                    deduplicated.append(
                        FidelityRecord(
                            self.name,
                            "deduplicated",
                            origin,
                            before,
                            after,
                            archive_key=archive_key(r.text),
                            detail=f"same as {pointed[key]}",
                            original=r.text,
                        )
                    )
                elif r.call_id in cut_here or r.call_id in digested_here:
                    shrunk.append(
                        FidelityRecord(
                            self.name,
                            "pruned",
                            origin,
                            before,
                            after,
                            archive_key=archive_key(r.text),
                            detail="cut to a digest of its most informative lines and items"
                            if r.call_id in digested_here
                            else "cut to its relevant lines and items",
                            original=r.text,
                        )
                    )
                elif key in texts:
                    only_lossless = True
            records += deduplicated + shrunk
            if only_lossless:
                records.append(FidelityRecord(self.name, "pruned", origin, before, after))
        out = pruned.with_results(edited)
        # Every result changed here — minified, pointed onward, cut or digested — noted with its
        # text and its message's size as the client sent them: a placeholder names that whole
        # whichever of these happened to it first.
        changed = texts.keys() | {
            (index, call_id)
            for done in (cut, digested)
            for index, calls in done.items()
            for call_id in calls
        }
        wholes = {
            (index, r.call_id): r.text
            for index in {index for index, _ in changed}
            for r in results[index]
            if (index, r.call_id) in changed
        }
        remember_cut(
            out, CutFrom(wholes, {index: conversation.sizes[index] for index, _ in wholes})
        )
        return out, records

    def _digests_from(self, sizes: Sequence[int], left: int) -> int:
        """Where digests start among the prunable results (oldest first, of these `sizes`) when
        `left` tokens must still go: the first, if digests of all of them would save that much;
        else past the oldest results that placeholders must replace anyway (the next policy
        clears results oldest first) — digesting those would be work thrown away; and where
        even placeholders for all would not save enough (whole turns will go too), only the
        newest `_DIGEST_NEWEST`. Estimates, from the sizes alone: a digest keeps `digest_share`
        of a result (at least `digest_min_tokens`), a placeholder `_PLACEHOLDER_TOKENS`."""
        settings = self.settings
        cap, share, floor = (
            settings.max_text_tokens,
            settings.digest_share,
            settings.digest_min_tokens,
        )
        by_digest = [max(0, size - max(floor, int(min(size, cap) * share))) for size in sizes]
        by_clearing = [max(0, size - _PLACEHOLDER_TOKENS) for size in sizes]
        short = left - sum(by_digest)
        start = 0
        while short > 0 and start < len(sizes):
            short -= by_clearing[start] - by_digest[start]
            start += 1
        if short > 0:
            start = max(0, len(sizes) - _DIGEST_NEWEST)
        return start - start % _DIGEST_GRID  # moved in steps, so the prefix stays put

    def _lossy_edits(
        self,
        known: Facts,
        texts: dict[Key, str],
        meter: Meter,
        terms_at: Callable[[int], frozenset[str]],
        digest: bool = False,
    ) -> _Edits:
        """A function giving a message's results cut to their relevant part (call → new text) —
        or with `digest`, to their digests — judged by the request each was fetched for and the
        calls that fetched it (`terms_at`, from the facts of the conversation before steps 1 and
        2, which touch neither). `texts`: each result's text as it stands, where not its own."""
        settings = self.settings
        results = known.editable

        def edits(index: int, size: int, skip: set[str]) -> dict[str, str]:
            found: dict[str, str] = {}
            most = text_tokens_for(size, meter)  # the message's texts have at most these
            for result in results[index]:
                if result.call_id in skip:
                    continue
                text = texts.get((index, result.call_id), result.text)
                if (
                    not digest
                    and most <= settings.max_text_tokens
                    and text.lstrip()[:1] not in ("{", "[")
                ):
                    continue  # a short text: nothing to cut
                terms = terms_at(index)
                named = archive_key(result.text)
                if digest:
                    shrunk = self.digest_text(text, meter, terms, named=named)
                else:
                    shrunk = self.lossy_text(text, meter, terms, most, named=named)
                if shrunk != text:
                    found[result.call_id] = shrunk
            return found

        return edits

    def _rewritten(
        self,
        conversation: Conversation,
        results: Sequence[Sequence[ToolResult]],
        texts: dict[Key, str],
        meter: Meter,
    ) -> dict[int, tuple[Any, int]]:
        """Each message with its new result texts, where that makes it smaller (the texts of
        the others are forgotten)."""
        dialect = conversation.dialect
        changes: dict[int, tuple[Any, int]] = {}
        for index, found in enumerate(results):
            message = conversation.messages[index]
            updated = message
            for result in found:
                if (index, result.call_id) in texts:
                    text = texts[index, result.call_id]
                    updated = dialect.with_tool_result(updated, result.call_id, text)
            if updated is message:
                continue
            size = meter.message(updated)
            if size < conversation.sizes[index]:
                changes[index] = (updated, size)
            else:
                for result in found:
                    texts.pop((index, result.call_id), None)
        return changes


def _task_terms(known: Facts) -> Callable[[int], frozenset[str]]:
    """The task terms of the results of message `index`: those of the request they were
    fetched for and of the calls of their unit — worked out once a message, and the same set
    for every result of it and both lossy steps (its hash, part of the caches' keys, is then
    computed once)."""
    unit_of: dict[int, Unit] = {}
    found: dict[int, frozenset[str]] = {}

    def terms(index: int) -> frozenset[str]:
        known_terms = found.get(index)
        if known_terms is None:
            if not unit_of:
                unit_of.update(
                    (i, unit) for unit in known.units if unit.kind == "tools" for i in unit.indices
                )
            unit = unit_of.get(index)
            call_terms = known.call_terms(unit) if unit else frozenset()
            known_terms = found[index] = known.requests[index] | call_terms
        return known_terms

    return terms


def _bracketed(text: str) -> str | None:
    """`text` stripped, where it could be JSON worth parsing (an object or an array)."""
    stripped = text.strip()
    return stripped if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]") else None


def _said(value: Any) -> Any:
    """A JSON value without its fields and items that hold nothing — false, null, zero, empty
    (nested ones too): what is left is what the value says."""
    if isinstance(value, dict):
        return {key: said for key, item in value.items() if (said := _said(item))}
    if isinstance(value, list):
        return [said for item in value if (said := _said(item))]
    return value
