"""`prune_tool_results`: shrink large tool results and keep their gist.

JSON results are minified, noise fields dropped (URLs, images, base64 blobs, nulls by default)
and long arrays shortened to head and tail around a `"… N more items …"` marker; text results
over `max_text_tokens` lose their middle, keeping whole lines at head and tail. Every result but
those of the newest tool turn is pruned — each on its own, so a result is pruned the same way in
every later turn of the session and the request prefix stays put.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import re
import threading
from typing import Any

import orjson
from cachetools import LRUCache
from pydantic import BaseModel, ConfigDict, Field

from policies.conversation import Conversation, FidelityRecord, Goal, Meter
from policies.nesting import SAFE_DEPTH, nests_deeper_than

_BASE64 = re.compile(r"^(data:[\w/+.-]+;base64,)?[A-Za-z0-9+/=\s]{512,}$")


class PruneSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    min_tokens: int = Field(200, ge=0)  # results smaller than this are left alone
    max_text_tokens: int = Field(2_000, ge=64)
    max_array_items: int = Field(20, ge=3)
    array_head: int = Field(8, ge=1)
    array_tail: int = Field(4, ge=0)
    drop_fields: tuple[str, ...] = ("*_url", "url", "image", "image_data", "thumbnail", "avatar*")
    drop_nulls: bool = True


def cut_middle(
    text: str, keep_tokens: int, meter: Meter, head_share: float = 1 / 3
) -> tuple[str, int]:
    """`text` with its middle replaced by a marker so about `keep_tokens` remain, cut at line
    ends where there are any. Returns the new text and how many tokens were removed."""
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


class PruneToolResults:
    name = "prune_tool_results"

    def __init__(self, settings: PruneSettings | None = None) -> None:
        self.settings = settings or PruneSettings()
        # A result is pruned the same way every turn; remember it instead of re-tokenizing.
        self._pruned: LRUCache[tuple[str, bytes], str] = LRUCache(maxsize=20_000)
        self._lock = threading.Lock()

    def _noise(self, key: str) -> bool:
        return any(
            fnmatch.fnmatchcase(key.lower(), pattern) for pattern in self.settings.drop_fields
        )

    def _shrink(self, value: Any) -> Any:
        settings = self.settings
        if isinstance(value, dict):
            return {
                key: self._shrink(item)
                for key, item in value.items()
                if not self._noise(str(key)) and not (settings.drop_nulls and item is None)
            }
        if isinstance(value, list):
            if len(value) > settings.max_array_items:
                hidden = len(value) - settings.array_head - settings.array_tail
                tail = value[len(value) - settings.array_tail :] if settings.array_tail else []
                value = [*value[: settings.array_head], f"… {hidden} more items …", *tail]
            return [self._shrink(item) for item in value]
        if isinstance(value, str) and len(value) >= 512 and _BASE64.match(value):
            return f"[{len(value)} characters of base64 data removed by brim]"
        return value

    def pruned_text(self, text: str, meter: Meter, at_most: int | None = None) -> str:
        """`text` pruned. `at_most` bounds its tokens when the caller knows it (its message's
        size): a text that cannot be over `max_text_tokens` is not tokenized to find out."""
        key = (
            getattr(meter, "tokenizer", ""),
            hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(),
        )
        with self._lock:
            cached = self._pruned.get(key)
        if cached is None:
            cached = self._prune(text, meter, at_most)
            with self._lock:
                self._pruned[key] = cached
        return cached

    def _prune(self, text: str, meter: Meter, at_most: int | None) -> str:
        stripped = text.strip()
        if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(stripped)
                # Deeper JSON than brim can write back stays text (and may lose its middle).
                if not nests_deeper_than(parsed, SAFE_DEPTH):
                    text = orjson.dumps(self._shrink(parsed)).decode()
        if at_most is not None and at_most <= self.settings.max_text_tokens:
            return text
        return cut_middle(text, self.settings.max_text_tokens, meter)[0]

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]:
        dialect = conversation.dialect
        units = conversation.units()
        newest_tools = next((u for u in reversed(units) if u.kind == "tools"), None)
        spared = set(newest_tools.indices) if newest_tools else set()
        names = dialect.tools_by_call(conversation.messages)
        changes: dict[int, tuple[Any, int]] = {}
        records: list[FidelityRecord] = []
        for index, message in enumerate(conversation.messages):
            if index in spared or conversation.sizes[index] < self.settings.min_tokens:
                continue
            updated = message
            for result in dialect.tool_results(message, names):
                pruned = self.pruned_text(result.text, meter, conversation.sizes[index])
                if pruned != result.text:
                    updated = dialect.with_tool_result(updated, result.call_id, pruned)
            if updated is message:
                continue
            size = meter.message(updated)
            if size >= conversation.sizes[index]:
                continue
            changes[index] = (updated, size)
            records.append(
                FidelityRecord(
                    self.name,
                    "pruned",
                    conversation.origin[index],
                    conversation.sizes[index],
                    size,
                )
            )
        return conversation.replace(changes), records
