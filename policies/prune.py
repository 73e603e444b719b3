"""`prune_tool_results`: shrink large tool results by their information, not by position.

Three steps, the cheapest first; the results of the tool loop at hand (the newest tool turn,
unless a user request came after it) are never touched:

1. Lossless, on every result: JSON minified, noise fields dropped (URLs, images, base64 blobs,
   nulls by default).
2. Nearly lossless, on every result: an exact copy of a later result (a file read twice with the
   same content, the same command output again) becomes a one-line pointer to the next copy,
   with the sha256 under which the archive keeps the copy (`policies.text.pointer`).
3. A cut into text, only in compress's last-resort pass — where the reversible cuts (clear's
   placeholders, evict's batches) could not bring the request within its limit — and only as
   far as the limit needs: oldest result first, each cut by the tokens still over the limit and
   no further than its digest (about `digest_share` of its tokens, of at most
   `max_text_tokens`; at least `digest_min_tokens`). A text keeps its first and last line, a
   few anomalies (errors, warnings, failures, tracebacks, non-2xx statuses, non-zero exit
   codes; one of each kind), the lines that mention a task term, then the lines that say most
   that the rest of the session does not (`policies.lines`: rare words, identifiers and numbers
   found nowhere else; a repeated line counts once), each run of the others as one marker with
   its count. JSON keeps head, tail and the items with a task term, an anomaly or a field few
   other items fill (its long strings cut to their relevant lines), or where that saves too
   little, its digest: as many of its items, the outliers and the most informative first. The
   task terms are those of the task the result was fetched for: the user's first and last
   request before it and the arguments of the calls that fetched it (`policies.facts.requests`,
   `call_terms`). A cut result names the key of its whole, for `brim_restore`.

Steps 1 and 2 are pure functions of the session up to the result (and later copies of it),
cached, so a result is rewritten the same way every turn and the request prefix stays put.
What each changed result said before is noted on the conversation returned
(`policies.information.remember_cut`), so a placeholder that later replaces it quotes the gist
of the whole result.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import math
import re
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from brim.policies.conversation import (
    Conversation,
    Dialect,
    FidelityRecord,
    Goal,
    Meter,
    ToolResult,
    archive_key,
    text_tokens_taking,
)
from brim.policies.facts import Facts, copies, facts
from brim.policies.information import (
    SHORTENED,
    CutFrom,
    LineStats,
    item_scores,
    rare_keys,
    remember_cut,
)
from brim.policies.lines import (
    MIN_LINES,
    cut_middle,
    digest_lines,
    informative_lines,
    relevant_lines,
)
from brim.policies.nesting import SAFE_DEPTH, nests_deeper_than
from brim.policies.remembered import Remembered
from brim.policies.text import (
    is_anomaly,
    is_placeholder,
    keys_in,
    keys_of,
    mentions,
    pointer,
    strings_of,
)

_BASE64 = re.compile(r"^(data:[\w/+.-]+;base64,)?[A-Za-z0-9+/=\s]{512,}$")
_NOTE_TOKENS = 24  # what a cut's markers and the note naming its whole add, about
CUT_DETAIL = "cut to its most informative lines and items"  # the records' detail
_ATTEMPTS = 3  # cuts of one message, each deeper by what the one before left over the limit
_OVERSHOOT_SLACK = 10  # tokens: and a little more, where head, markers and tail meet


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
    # A cut keeps at least a digest: about this share of a result's tokens (of at most
    # `max_text_tokens` of them; 1: no digests, JSON only cut to its relevant part)…
    digest_share: float = Field(0.2, gt=0, le=1)
    digest_min_tokens: int = Field(150, ge=16)  # …and at least this many


_ITEMS_MARKER = re.compile(r"… (\d+) more items …")


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
        if isinstance(value, str) and len(value) > budget and value.count("\n") >= MIN_LINES:
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
                1 for s in strings_of(parsed) if len(s) > limit and s.count("\n") >= MIN_LINES
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

    def cut_text(
        self,
        text: str,
        meter: Meter,
        terms: frozenset[str] = frozenset(),
        excess: int = 0,
        *,
        named: str | None = None,
        stats: _Stats | None = None,
    ) -> str:
        """`text` (already lossless) cut by its information so that it is about `excess` tokens
        (the encoding's) shorter, and no shorter than its digest — `digest_share` of at most
        `max_text_tokens` of its tokens, at least `digest_min_tokens`; a cut text names the key
        `named` of the whole result (`shortened`). Text keeps its most informative lines
        (`policies.lines.informative_lines`, judged across the session `stats` describes); JSON
        is cut to its relevant items and lines (`lossy_text`), or where that saves too little,
        to its digest (`digest_text`)."""
        settings = self.settings
        size = meter.text_tokens(text)
        floor = max(
            settings.digest_min_tokens,
            int(min(size, settings.max_text_tokens) * settings.digest_share),
        )
        keep = max(floor, size - excess - _NOTE_TOKENS)
        if keep >= size:
            return text
        if self._json(text) is not None:
            relevant = self.lossy_text(text, meter, terms, size, named=named)
            if settings.digest_share >= 1 or size - meter.text_tokens(relevant) >= excess:
                return relevant
            return self.digest_text(text, meter, terms, named=named)
        matched = matched_terms(text, terms)
        if text.count("\n") < 2:
            shrunk = cut_middle(text, keep, meter)[0]
        else:
            lines = stats.lines() if stats is not None else None
            shrunk = informative_lines(text, keep, matched, meter, lines, total=size)
        return _naming(text, shrunk, named)

    def _cut_message(
        self,
        dialect: Dialect,
        index: int,
        message: Any,
        found: Sequence[ToolResult],
        texts: Mapping[Key, str],
        pointed: Mapping[Key, str],
        stats: _Stats,
        meter: Meter,
        terms: frozenset[str],
        excess: int,
    ) -> tuple[Any, set[str]]:
        """`message` with its results cut into (`cut_text`) by about `excess` tokens of text
        between them, each by what the ones before it left; and the calls whose results were
        cut."""
        updated, calls = message, set()
        for result in found:
            key = (index, result.call_id)
            text = texts.get(key, result.text)
            if excess <= 0 or key in pointed or is_placeholder(text):
                continue
            cut_to = self.cut_text(
                text, meter, terms, excess, named=archive_key(result.text), stats=stats
            )
            if cut_to != text:
                updated = dialect.with_tool_result(updated, result.call_id, cut_to)
                calls.add(result.call_id)
                excess -= meter.text_tokens(text) - meter.text_tokens(cut_to)
        return updated, calls

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

        # 3. only in compress's last-resort pass, where the reversible cuts could not bring the
        # request within its limit: cuts into text, oldest result first, each only as far as
        # the limit still needs, no further than its digest.
        edited: dict[int, tuple[Any, int]] = {}
        cut: dict[int, set[str]] = {}  # index → the calls whose results were cut
        needed = pruned.total - goal.limit
        if needed > 0 and goal.cuts_text:
            terms = _task_terms(known)
            stats = _Stats(pruned, texts, results)
            for index in prunable:
                if needed <= 0:
                    break
                message, size = pruned.messages[index], pruned.sizes[index]
                # A token of its results' text may take more than one of the message's (JSON
                # escapes, the model's ratio): the cut is sized by what they take here.
                emptied = message
                for result in results[index]:
                    emptied = dialect.with_tool_result(emptied, result.call_id, "")
                text_tokens = functools.partial(
                    text_tokens_taking,
                    message=size,
                    without_text=meter.message(emptied),
                    text=sum(
                        meter.text_tokens(texts.get((index, r.call_id), r.text))
                        for r in results[index]
                    ),
                    meter=meter,
                )
                # The cut's markers and the tokens where its pieces meet can take a message
                # past what was asked: then again from the whole, by that much (and a little)
                # more, so that a cut into text brings the request within the limit.
                extra = 0
                for _ in range(_ATTEMPTS):
                    updated, calls = self._cut_message(
                        dialect,
                        index,
                        message,
                        results[index],
                        texts,
                        pointed,
                        stats,
                        meter,
                        terms(index),
                        text_tokens(needed) + extra,
                    )
                    if updated is message:
                        break
                    smaller = meter.message(updated)
                    over = needed - (size - smaller)
                    if over <= 0 or smaller >= size:
                        break
                    extra += text_tokens(over) + _OVERSHOOT_SLACK
                if updated is message or smaller >= size:
                    continue
                edited[index] = (updated, smaller)
                cut[index] = calls
                needed -= size - smaller

        records: list[FidelityRecord] = []
        for index in sorted(changes.keys() | edited.keys()):
            origin, before = conversation.origin[index], conversation.sizes[index]
            after = edited[index][1] if index in edited else changes[index][1]
            cut_here = cut.get(index, set())
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
                elif r.call_id in cut_here:
                    shrunk.append(
                        FidelityRecord(
                            self.name,
                            "pruned",
                            origin,
                            before,
                            after,
                            archive_key=archive_key(r.text),
                            detail=CUT_DETAIL,
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
            (index, call_id) for index, calls in cut.items() for call_id in calls
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
    found: dict[int, frozenset[str]] = {}

    def terms(index: int) -> frozenset[str]:
        known_terms = found.get(index)
        if known_terms is None:
            unit = known.unit_of.get(index)
            tools = unit if unit is not None and unit.kind == "tools" else None
            call_terms = known.call_terms(tools) if tools is not None else frozenset()
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


class _Stats:
    """The `LineStats` of a conversation's tool results (their texts as they stand), worked
    out when first asked for: only a cut into text needs them."""

    def __init__(
        self,
        conversation: Conversation,
        texts: Mapping[Key, str],
        results: Sequence[Sequence[ToolResult]],
    ) -> None:
        self._texts, self._results = texts, results
        self._stats: LineStats | None = None

    def lines(self) -> LineStats:
        if self._stats is None:
            self._stats = LineStats.of(
                text
                for index, found in enumerate(self._results)
                for result in found
                if not is_placeholder(text := self._texts.get((index, result.call_id), result.text))
            )
        return self._stats
