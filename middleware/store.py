"""The restore store: the originals of what brim cleared, evicted, cut or summarized, by key, so
that the model can fetch them back (a hidden tool round brim answers on the provider's behalf).

Keys are the sha256 of the text (`policies.conversation.archive_key`), 64 lowercase hex digits.
`get` takes what the model passes — the full key or a prefix of at least 16 hex digits (what
placeholders show), optionally after `sha256:`, in any case and with spaces around — and answers
None for anything else: model input never raises.

`MemoryStore` keeps the texts in process, bounded by their total UTF-8 bytes (least recently used
out first) and by age. `RedisStore` writes to Redis (`brim:store:<first 16 hex>`, SET EX) and to a
local `MemoryStore`, so that every brim instance on the same Redis can hand back what any of them
removed; when Redis is down it keeps serving from the local store (the link's outage policy:
one warning per outage, a retry now and then, `middleware.shared.RedisLink`), and when Redis is
back it writes what was stored meanwhile. Neither raises into a request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from cachetools import TTLCache

from middleware.shared import RedisLink, Unavailable
from policies.conversation import parse_key

log = logging.getLogger("brim.store")
PREFIX_DIGITS = 16  # what placeholders show, and what both stores index by
REDIS_PREFIX = "brim:store:"
MAX_PENDING = 10_000  # keys stored while Redis was down, written to it when it is back


def normalize_key(key: object) -> str | None:
    """The hex digits `key` names (16 to 64, lowercase), or None if it is not a key."""
    return parse_key(key, PREFIX_DIGITS)


def _encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class ContentStore(Protocol):
    async def put_many(self, items: Iterable[tuple[str, str]]) -> None:
        """Keep each (key, text); key is the text's sha256 (64 hex). Malformed keys are skipped."""

    async def get(self, key: str) -> str | None:
        """The text under `key` (full key or a prefix of 16+ hex digits, `sha256:` allowed);
        None when absent, expired or `key` is malformed."""

    async def aclose(self) -> None: ...


class MemoryStore:
    """In process, thread-safe, at most `max_bytes` of text (UTF-8), each kept `ttl_s`."""

    def __init__(
        self, max_bytes: int, ttl_s: float, *, timer: Callable[[], float] = time.monotonic
    ) -> None:
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError(f"max_bytes and ttl_s must be positive, not {max_bytes}, {ttl_s}")
        self.max_bytes = max_bytes
        # By the key's first 16 digits: (full key, text, its size in bytes).
        self._entries: TTLCache[str, tuple[str, str, int]] = TTLCache(
            maxsize=max_bytes, ttl=ttl_s, timer=timer, getsizeof=lambda entry: entry[2]
        )
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        with self._lock:
            self._entries.expire()
            return int(self._entries.currsize)

    def __len__(self) -> int:
        with self._lock:
            self._entries.expire()
            return len(self._entries)

    def put(self, key: str, text: str, size: int | None = None) -> bool:
        """Keep `text` under `key`; False if the key is malformed or the text alone is larger
        than the whole store."""
        if not isinstance(key, str) or parse_key(key) != key or not isinstance(text, str):
            log.warning("not storing %r: a store key is 64 lowercase hex digits", str(key)[:80])
            return False
        size = len(_encoded(text)) if size is None else size
        if size > self.max_bytes:
            log.warning("not storing %s: %d bytes is more than the store holds", key[:16], size)
            return False
        with self._lock:
            self._entries[key[:PREFIX_DIGITS]] = (key, text, size)
        return True

    def lookup(self, digits: str) -> str | None:
        """The text whose key starts with `digits` (already normalized)."""
        with self._lock:
            entry = self._entries.get(digits[:PREFIX_DIGITS])
        if entry is None or not entry[0].startswith(digits):
            return None
        return entry[1]

    async def put_many(self, items: Iterable[tuple[str, str]]) -> None:
        for key, text in items:
            self.put(key, text)

    async def get(self, key: str) -> str | None:
        digits = normalize_key(key)
        return None if digits is None else self.lookup(digits)

    async def aclose(self) -> None:
        with self._lock:
            self._entries.clear()


class RedisStore:
    """Shared by every brim instance on the same Redis, with `fallback` as the local copy. The
    link (and its outage policy, `middleware.shared.RedisLink`) belongs to the caller."""

    def __init__(self, link: RedisLink, ttl_s: float, fallback: MemoryStore) -> None:
        self.link = link
        self._ttl = max(1, int(ttl_s))
        self.local = fallback
        self._pending: OrderedDict[str, None] = OrderedDict()
        link.on_recovery(self._replay)

    @property
    def redis_down(self) -> bool:
        return self.link.down

    async def _replay(self) -> None:
        """Redis is back: write what was stored while it was down."""
        pending, self._pending = list(self._pending), OrderedDict()
        items = [
            (key, _encoded(text)) for key in pending if (text := self.local.lookup(key)) is not None
        ]
        if items:
            await self._write(items)

    def _remember(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._pending[key] = None
            self._pending.move_to_end(key)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    async def _write(self, items: list[tuple[str, bytes]]) -> None:
        """Write each (key, its text's UTF-8 bytes) to Redis; remember them while it is down."""

        async def write(client: Any) -> object:
            pipe = client.pipeline(transaction=False)
            for key, data in items:
                name = f"{REDIS_PREFIX}{key[:PREFIX_DIGITS]}"
                pipe.set(name, key.encode() + data, ex=self._ttl)
            return await pipe.execute()

        try:
            await self.link.run(write)
        except Unavailable:
            self._remember(key for key, _ in items)

    async def put_many(self, items: Iterable[tuple[str, str]]) -> None:
        kept: list[tuple[str, bytes]] = []
        for key, text in items:  # each text encoded once: to size it here, to write it to Redis
            data = _encoded(text) if isinstance(text, str) else b""
            if self.local.put(key, text, len(data)):
                kept.append((key, data))
        if kept:
            await self._write(kept)

    async def get(self, key: str) -> str | None:
        digits = normalize_key(key)
        if digits is None:
            return None
        text = self.local.lookup(digits)
        if text is not None:
            return text
        name = f"{REDIS_PREFIX}{digits[:PREFIX_DIGITS]}"
        try:
            value = await self.link.run(lambda client: client.get(name))
        except Unavailable:
            return None
        if not isinstance(value, bytes) or len(value) < 64:
            return None
        full, data = value[:64].decode("ascii", "replace"), value[64:]
        if parse_key(full) != full or not full.startswith(digits):
            return None
        try:
            text = data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return None
        self.local.put(full, text, len(data))
        return text

    async def aclose(self) -> None:
        """Nothing of its own to close: the link is closed by its owner."""
