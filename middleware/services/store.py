"""The restore store: the originals of what brim cleared, evicted, cut or summarized, by owner
and key, so that the model can fetch them back (a hidden tool round brim answers on the
provider's behalf).

Keys are the sha256 of the text (`policies.conversation.archive_key`), 64 lowercase hex digits.
`get` takes what the model passes — the full key or a prefix of at least 16 hex digits (what
placeholders show), optionally after `sha256:`, in any case and with spaces around — and answers
None for anything else: model input never raises.

Every entry belongs to the owner of the request it came from (`Exchange.owner`), and only that
owner's requests find it: another owner's key is looked up, missed and answered exactly as an
unknown key is (the same steps, the same None), so nothing tells a client that a key it did not
make exists.

`MemoryStore` keeps the texts in process, bounded by their total UTF-8 bytes (least recently used
out first) and by age. `RedisStore` writes to Redis (`brim:store:<owner>:<first 16 hex>`, SET EX,
the full key then the text's bytes) and to a local `MemoryStore`, so that every brim instance on
the same Redis can hand back what any of them removed; when Redis is down it keeps serving from
the local store (the link's outage policy: one warning per outage, a retry now and then,
`middleware.services.shared.RedisLink`), and when Redis is back it writes what was stored meanwhile.
What it reads from Redis is checked: a record whose text does not hash to its key, or that is not a
record at all, is treated as missing and reported (`on_rejected`, the first one logged, never
its content). Neither store raises into a request.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from cachetools import TTLCache

from brim.adapters.exchange import OWNER_PATTERN
from brim.middleware.services.shared import RedisLink, Unavailable
from brim.policies.conversation import parse_key

log = logging.getLogger("brim.store")
PREFIX_DIGITS = 16  # what placeholders show, and what both stores index by
REDIS_PREFIX = "brim:store:"
MAX_PENDING = 10_000  # keys stored while Redis was down, written to it when it is back
WRONG_TYPE = object()  # what reading a Redis name that holds no string gives: not a record


def normalize_key(key: object) -> str | None:
    """The hex digits `key` names (16 to 64, lowercase), or None if it is not a key."""
    return parse_key(key, PREFIX_DIGITS)


def _encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _owner_ok(owner: object) -> bool:
    return isinstance(owner, str) and OWNER_PATTERN.fullmatch(owner) is not None


class ContentStore(Protocol):
    async def put_many(self, owner: str, items: Iterable[tuple[str, str]]) -> None:
        """Keep each (key, text) for `owner`; key is the text's sha256 (64 hex). Malformed keys
        are skipped."""

    async def get(self, owner: str, key: str) -> str | None:
        """The text `owner` kept under `key` (full key or a prefix of 16+ hex digits, `sha256:`
        allowed); None when absent, expired, another owner's, or `key` is malformed."""

    async def aclose(self) -> None: ...


class MemoryStore:
    """In process, thread-safe, at most `max_bytes` of text (UTF-8), each kept `ttl_s`."""

    def __init__(
        self, max_bytes: int, ttl_s: float, *, timer: Callable[[], float] = time.monotonic
    ) -> None:
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError(f"max_bytes and ttl_s must be positive, not {max_bytes}, {ttl_s}")
        self.max_bytes = max_bytes
        # By owner and the key's first 16 digits: (full key, text, its size in bytes).
        self._entries: TTLCache[tuple[str, str], tuple[str, str, int]] = TTLCache(
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

    def put(self, owner: str, key: str, text: str, size: int | None = None) -> bool:
        """Keep `text` under `key` for `owner`; False if the key or owner is malformed or the
        text alone is larger than the whole store."""
        if not isinstance(key, str) or parse_key(key) != key or not isinstance(text, str):
            log.warning("not storing %r: a store key is 64 lowercase hex digits", str(key)[:80])
            return False
        if not _owner_ok(owner):
            log.warning("not storing %s: malformed owner", key[:16])
            return False
        size = len(_encoded(text)) if size is None else size
        if size > self.max_bytes:
            log.warning("not storing %s: %d bytes is more than the store holds", key[:16], size)
            return False
        with self._lock:
            self._entries[owner, key[:PREFIX_DIGITS]] = (key, text, size)
        return True

    def lookup(self, owner: str, digits: str) -> str | None:
        """The text `owner` kept whose key starts with `digits` (already normalized)."""
        with self._lock:
            entry = self._entries.get((owner, digits[:PREFIX_DIGITS]))
        if entry is None or not entry[0].startswith(digits):
            return None
        return entry[1]

    async def put_many(self, owner: str, items: Iterable[tuple[str, str]]) -> None:
        for key, text in items:
            self.put(owner, key, text)

    async def get(self, owner: str, key: str) -> str | None:
        digits = normalize_key(key)
        return None if digits is None else self.lookup(owner, digits)

    async def aclose(self) -> None:
        with self._lock:
            self._entries.clear()


class RedisStore:
    """Shared by every brim instance on the same Redis, with `fallback` as the local copy. The
    link (and its outage policy, `middleware.services.shared.RedisLink`) belongs to the caller.
    `on_rejected` hears of every record read from Redis that is not served: "mismatch" (its
    text does not hash to its key) or "malformed" (not a record of this store)."""

    def __init__(
        self,
        link: RedisLink,
        ttl_s: float,
        fallback: MemoryStore,
        *,
        on_rejected: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.link = link
        self._ttl = max(1, int(ttl_s))
        self.local = fallback
        self.on_rejected = on_rejected
        self._logged_rejection = False
        from redis.exceptions import ResponseError  # (redis is imported: the link has it)

        self._refused: type[Exception] = ResponseError
        self._pending: OrderedDict[tuple[str, str], None] = OrderedDict()  # (owner, key)
        link.on_recovery(self._replay)

    @property
    def redis_down(self) -> bool:
        return self.link.down

    async def _replay(self) -> None:
        """Redis is back: write what was stored while it was down."""
        pending, self._pending = list(self._pending), OrderedDict()
        items = [
            (owner, key, _encoded(text))
            for owner, key in pending
            if (text := self.local.lookup(owner, key)) is not None
        ]
        if items:
            await self._write(items)

    def _remember(self, entries: Iterable[tuple[str, str]]) -> None:
        for entry in entries:
            self._pending[entry] = None
            self._pending.move_to_end(entry)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    async def _write(self, items: list[tuple[str, str, bytes]]) -> None:
        """Write each (owner, key, its text's UTF-8 bytes) to Redis; remember them while it is
        down."""

        async def write(client: Any) -> object:
            pipe = client.pipeline(transaction=False)
            for owner, key, data in items:
                pipe.set(_redis_name(owner, key), key.encode() + data, ex=self._ttl)
            return await pipe.execute()

        try:
            await self.link.run(write)
        except Unavailable:
            self._remember((owner, key) for owner, key, _ in items)

    async def put_many(self, owner: str, items: Iterable[tuple[str, str]]) -> None:
        kept: list[tuple[str, str, bytes]] = []
        for key, text in items:  # each text encoded once: to size it here, to write it to Redis
            data = _encoded(text) if isinstance(text, str) else b""
            if self.local.put(owner, key, text, len(data)):
                kept.append((owner, key, data))
        if kept:
            await self._write(kept)

    async def get(self, owner: str, key: str) -> str | None:
        digits = normalize_key(key)
        if digits is None or not _owner_ok(owner):
            return None
        text = self.local.lookup(owner, digits)
        if text is not None:
            return text
        name = _redis_name(owner, digits)

        async def read(client: Any) -> object:
            try:
                return await client.get(name)
            except self._refused as error:
                if str(error).startswith("WRONGTYPE"):  # the name holds a hash, a list, …
                    return WRONG_TYPE
                raise

        try:
            value = await self.link.run(read)
        except Unavailable:
            return None
        if value is None:
            return None
        found = _record(value, digits)
        if isinstance(found, str):
            self._rejected(found)
            return None
        full, text, size = found
        self.local.put(owner, full, text, size)
        return text

    def _rejected(self, reason: str) -> None:
        self.on_rejected(reason)
        if not self._logged_rejection:  # once: a hostile or broken Redis would flood the log
            self._logged_rejection = True
            log.warning(
                "the restore store read a %s record from Redis and did not serve it (counted "
                "in brim_shared_records_rejected_total; further ones are not logged)",
                reason,
            )

    async def aclose(self) -> None:
        """Nothing of its own to close: the link is closed by its owner."""


def _record(value: object, digits: str) -> tuple[str, str, int] | str:
    """A value read from Redis as (full key, text, its size in bytes), if it is a record of this
    store for a key that starts with `digits` and its text hashes to its key; else why not:
    "mismatch" (it does not hash to its key) or "malformed" (not a record of this store)."""
    if not isinstance(value, bytes) or len(value) < 64:
        return "malformed"
    full, data = value[:64].decode("ascii", "replace"), value[64:]
    if parse_key(full) != full or not full.startswith(digits):
        return "malformed"
    if hashlib.sha256(data).hexdigest() != full:
        return "mismatch"
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return "malformed"
    return full, text, len(data)


def _redis_name(owner: str, key: str) -> str:
    """Where `owner`'s text under `key` (or a prefix of it) lives in Redis."""
    return f"{REDIS_PREFIX}{owner}:{key[:PREFIX_DIGITS]}"
