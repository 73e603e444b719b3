"""`prune_tool_results`: shrink large tool results by their information, not by position.

Three steps, the cheapest first; the newest tool turn's results are never touched:

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
   the items with a task term or an anomaly. The task terms are those of the task the result
   was fetched for: the user's first and last request before it and the arguments of the calls
   that fetched it (`policies.conversation.requests`, `call_terms`).

Each step is a pure function of the session up to the result (and later copies of it), cached,
so a result is pruned the same way every turn and the request prefix stays put; the batches
move the lossy frontier only now and then as a session grows.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import orjson
from cachetools import LRUCache
from pydantic import BaseModel, ConfigDict, Field

from policies.conversation import (
    Conversation,
    Facts,
    FidelityRecord,
    Goal,
    Meter,
    ToolResult,
    archive_key,
    copies,
    facts,
    is_anomaly,
    keys_of,
    mentions,
    pointer,
    snapped_count,
    strings_of,
)
from policies.nesting import SAFE_DEPTH, nests_deeper_than

_BASE64 = re.compile(r"^(data:[\w/+.-]+;base64,)?[A-Za-z0-9+/=\s]{512,}$")
_MARKER_TOKENS = 20  # what one "[… N lines … omitted by brim …]" line costs, about
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


def cut_middle(
    text: str,
    keep_tokens: int,
    meter: Meter,
    head_share: float = 1 / 3,
    *,
    tokens: Sequence[int] | None = None,
) -> tuple[str, int]:
    """`text` with its middle replaced by a marker so about `keep_tokens` remain, cut at line
    ends where there are any (`tokens`: the text's own, when the caller has them already).
    Returns the new text and how many tokens were removed."""
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
    marker = f"\n[… {removed} tokens cut from the middle by brim …]\n"
    return head.rstrip("\n") + marker + tail.lstrip("\n"), removed


def _line_marker(omitted: int, telling: int) -> str:
    if not telling:
        return f"[… {omitted} lines without task terms or errors omitted by brim …]"
    return f"[… {omitted} lines omitted by brim, {telling} of them with task terms or errors …]"


def relevant_lines(text: str, terms: frozenset[str], keep_tokens: int, meter: Meter) -> str:
    """`text` cut to about `keep_tokens` by lines: head and tail, then every line that reports an
    anomaly, then every line that mentions a task term (in that order, while they fit), then
    more head and tail; each run of dropped lines becomes one marker with its count. Each line
    is tokenized once, and the text as a whole not at all."""
    lines = text.split("\n")
    if len(lines) < _MIN_LINES:
        return cut_middle(text, keep_tokens, meter)[0]
    cost = [len(meter.tokens(line)) + 1 for line in lines]
    if sum(cost) - 1 <= keep_tokens:
        return text
    count = len(lines)
    rank = [2 if is_anomaly(line) else 1 if mentions(line, terms) else 0 for line in lines]
    kept = [False] * count
    used = _MARKER_TOKENS  # nothing kept yet: one run of dropped lines

    def add(index: int, within: int) -> bool:
        nonlocal used
        before = index > 0 and not kept[index - 1]
        after = index < count - 1 and not kept[index + 1]
        runs = (before and after) - (not before and not after)  # a run split, or one closed
        added = cost[index] + _MARKER_TOKENS * runs
        if used + added > within:
            return False
        kept[index] = True
        used += added
        return True

    add(0, keep_tokens + cost[0])  # the first and last lines always
    add(count - 1, max(keep_tokens, used + cost[-1]))
    head = 1
    while head < count and not kept[head] and add(head, keep_tokens // 8):
        head += 1
    tail = count - 2
    while tail >= 0 and not kept[tail] and add(tail, keep_tokens // 8 + keep_tokens // 6):
        tail -= 1
    for wanted in (2, 1):
        for index in range(count):
            if rank[index] == wanted and not kept[index]:
                add(index, keep_tokens)
    spare = used + (keep_tokens - used) // 3
    while head < count and not kept[head] and add(head, spare):
        head += 1
    while tail >= 0 and not kept[tail] and add(tail, keep_tokens):
        tail -= 1

    out: list[str] = []
    index = 0
    while index < count:
        if kept[index]:
            out.append(lines[index])
            index += 1
            continue
        end = index
        while end < count and not kept[end]:
            end += 1
        out.append(_line_marker(end - index, sum(1 for r in rank[index:end] if r)))
        index = end
    shrunk = "\n".join(out)
    if used > keep_tokens * 1.25:  # a few giant lines (the first, the last): cut by tokens too
        shrunk = cut_middle(shrunk, keep_tokens, meter)[0]
    return shrunk


Key = tuple[int, str]  # (message index, call key)


class PruneToolResults:
    name = "prune_tool_results"

    def __init__(self, settings: PruneSettings | None = None) -> None:
        self.settings = settings or PruneSettings()
        # A result is pruned the same way every turn; remember it instead of re-tokenizing.
        self._pruned: LRUCache[tuple[str, int, int, Hashable], str] = LRUCache(maxsize=20_000)
        self._lock = threading.Lock()

    def _noise(self, key: str) -> bool:
        return any(
            fnmatch.fnmatchcase(key.lower(), pattern) for pattern in self.settings.drop_fields
        )

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
        telling = 0
        for index in range(settings.array_head, count - settings.array_tail):
            if telling >= settings.max_array_items:
                break
            item = items[index]
            # Fields without a value say nothing: `{"failed": false}` is no failure.
            said = item if isinstance(item, str) else orjson.dumps(_said(item)).decode()
            if is_anomaly(said) or mentions(" ".join(strings_of(item)), terms):
                keep.add(index)
                telling += 1
        out: list[Any] = []
        gap = 0
        for index, item in enumerate(items):
            if index in keep:
                if gap:
                    out.append(f"… {gap} more items …")
                    gap = 0
                out.append(item)
            else:
                gap += 1
        if gap:
            out.append(f"… {gap} more items …")
        return out

    def _json(self, text: str) -> Any | None:
        stripped = text.strip()
        if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
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
    ) -> str:
        """`text` (already lossless) cut to its relevant part. `at_most` bounds its tokens when
        the caller knows it (its message's size): a text that cannot be over `max_text_tokens`
        is not tokenized to find out."""
        matched = terms & keys_of(text) if terms else terms  # all a relevance cut depends on
        short = at_most is not None and at_most <= self.settings.max_text_tokens
        mode = ("lossy", short, matched)
        return self._cached(meter, text, mode, lambda: self._lossy(text, matched, meter, short))

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

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        settings = self.settings
        dialect = conversation.dialect
        known = facts(conversation)
        newest_tools = next((u for u in reversed(known.units) if u.kind == "tools"), None)
        spared = set(newest_tools.indices) if newest_tools else set()
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
        pruned = conversation.replace(changes)

        # 3. cuts, oldest first, only while over the target, in batches
        edited: dict[int, tuple[Any, int]] = {}
        cut: dict[int, set[str]] = {}  # index → the calls whose results were cut
        needed = pruned.total - goal.target
        if needed > 0:
            skip: dict[int, set[str]] = {}
            for index, call_id in pointed:
                if (index, call_id) in texts:
                    skip.setdefault(index, set()).add(call_id)
            edits = self._lossy_edits(known, texts, meter)

            def savings() -> Iterator[int]:
                for index in prunable:
                    message, size = pruned.messages[index], pruned.sizes[index]
                    found = edits(index, size, skip.get(index, set()))
                    if not found:
                        continue
                    updated = message
                    for call_id, text in found.items():
                        updated = dialect.with_tool_result(updated, call_id, text)
                    smaller = meter.message(updated)
                    if smaller < size:
                        edited[index] = (updated, smaller)
                        cut[index] = set(found)
                        yield size - smaller

            snapped_count(savings(), needed, goal.step(settings.cut_at_least))

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
                            detail="cut to its relevant lines and items",
                            original=r.text,
                        )
                    )
                elif key in texts:
                    only_lossless = True
            records += deduplicated + shrunk
            if only_lossless:
                records.append(FidelityRecord(self.name, "pruned", origin, before, after))
        return pruned.replace(edited), records

    def _lossy_edits(
        self, known: Facts, texts: dict[Key, str], meter: Meter
    ) -> Callable[[int, int, set[str]], dict[str, str]]:
        """A function giving a message's results cut to their relevant part (call → new text),
        judged by the request each was fetched for and the calls that fetched it (the facts
        of the conversation before steps 1 and 2, which touch neither)."""
        settings = self.settings
        results = known.editable
        request = known.requests
        unit_of = {i: unit for unit in known.units if unit.kind == "tools" for i in unit.indices}

        def edits(index: int, size: int, skip: set[str]) -> dict[str, str]:
            found: dict[str, str] = {}
            for result in results[index]:
                if result.call_id in skip:
                    continue
                text = texts.get((index, result.call_id), result.text)
                if size <= settings.max_text_tokens and text.lstrip()[:1] not in ("{", "["):
                    continue  # a short text: nothing to cut
                unit = unit_of.get(index)
                terms = request[index] | (known.call_terms(unit) if unit else frozenset())
                shrunk = self.lossy_text(text, meter, terms, size)
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


def _said(value: Any) -> Any:
    """A JSON value without its fields and items that hold nothing — false, null, zero, empty
    (nested ones too): what is left is what the value says."""
    if isinstance(value, dict):
        return {key: said for key, item in value.items() if (said := _said(item))}
    if isinstance(value, list):
        return [said for item in value if (said := _said(item))]
    return value
