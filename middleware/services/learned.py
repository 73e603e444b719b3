"""Learned limits shared by several processes, and forgotten by all of them when an operator
asks (`brim limits forget`).

`SharedLimits` keeps a `LimitsRegistry`'s learned facts in step with a `FactStore`: the Redis
hashes of `[cache] url` (`middleware.services.shared.RedisFacts`), or, for the workers of one
`brim serve --workers N` without Redis, files in a private directory of the group
(`WorkerFiles`). A fact learned here is written at once (off the request path); every refresh
each process reads the store back, adopts what is newer than its own and writes what the store
lacks. What it reads was written by another process, or by anyone who can write to the Redis: a
record that is malformed, or whose fact the registry rejects (`LimitsRegistry.rejects`: a window
outside the registry's bounds, a model id brim would not learn under, an expiry too far off), is
skipped, dropped from the store and counted (`rejected`), never raised.

Forgetting leaves a tombstone (model id → when it was forgotten; `ALL_MODELS` for every model)
in the store for as long as a fact lives: each process drops the facts it holds that were learned
by then, skips them in the store, and removes them there. A fact learned after the tombstone
(new evidence) stands. A tombstone made while the store is out of reach is kept here and written
by the next sync that reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from cachetools import LRUCache

from brim.policies.limits import LEARNED_KINDS, LEARNED_MAX, Learned, LearnedKind, LimitsRegistry

log = logging.getLogger("brim.shared")

MODEL_ID_MAX = 256  # longer model ids are not shared (they are not real models)
ALL_MODELS = "*"  # a tombstone's model id when every model was forgotten
Field = bytes | str  # a record's key as the store hands it back


@dataclass
class Records:
    """What a store holds, as it holds it: by kind, model id → "value until"; and the
    tombstones, model id (or `ALL_MODELS`) → when it was forgotten (wall-clock seconds)."""

    facts: dict[LearnedKind, Mapping[Field, Field]] = field(default_factory=dict)
    forgotten: Mapping[Field, Field] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What forgetting did: the facts this process dropped, and whether the store was reached
    (`reached`; else the next sync that reaches it writes the tombstone)."""

    dropped: list[Learned]
    reached: bool


class FactStore(Protocol):
    """Where the learned facts of several processes meet."""

    shared_with: str  # what shares it, for status lines: "instances", "workers"

    async def read(self) -> Records:
        """Everything the store holds."""

    async def write(
        self,
        facts: Iterable[Learned],
        stale: Iterable[tuple[LearnedKind, Field]],
        forgotten: Mapping[str, float],
        *,
        ttl_s: float,
    ) -> None:
        """Add `facts` and the tombstones `forgotten`; remove the records `stale` (as read);
        whatever is written lives at most `ttl_s`."""

    async def forget(self, model: str | None, at: float, *, ttl_s: float) -> None:
        """Remove every record of `model` (None: of every model) and leave a tombstone."""


def encode(fact: Learned) -> str:
    return f"{fact.value} {fact.until!r}"


def _text(value: Field) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def parse_fact(kind: LearnedKind, key: Field, value: Field) -> Learned | None:
    """A record as a fact, or None if it is not one brim writes."""
    try:
        model = _text(key)
        number, until = _text(value).split()
        fact = Learned(kind, model, int(number), float(until))
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    ok = fact.value > 0 and 0 < len(model) <= MODEL_ID_MAX and fact.until == fact.until
    return fact if ok else None


_WARNED: LRUCache[object, bool] = LRUCache(maxsize=1_024)  # what was warned of already


def warn_once(logger: logging.Logger, key: object, message: str, *args: object) -> None:
    """Log a warning the first time for `key` (a record read again and again is named once;
    bounded), at debug after."""
    if key in _WARNED:
        logger.debug(message, *args)
    else:
        _WARNED[key] = True
        logger.warning(message, *args)


def parse_tombstone(key: Field, value: Field) -> tuple[str, float] | None:
    try:
        model, at = _text(key), float(_text(value))
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    return (model, at) if 0 < len(model) <= MODEL_ID_MAX and at == at and at > 0 else None


class SharedLimits:
    """A `LimitsRegistry`'s learned facts, shared through `store` (module doc). `rejected(record,
    reason)` hears of each record read and left out: record "learned" or "forgotten", reason
    "malformed" (not a record brim writes) or "implausible" (the registry rejects the fact)."""

    def __init__(
        self,
        store: FactStore,
        registry: LimitsRegistry,
        *,
        spawn: Callable[[Callable[[], Any]], None],
        rejected: Callable[[str, str], None] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self._spawn = spawn  # runs a write off the request path (or drops it)
        self._rejected = rejected
        # Tombstones made or read here: model id → when forgotten (bounded like the facts).
        self._forgotten: dict[str, float] = {}
        self._applied: dict[str, float] = {}  # the tombstones this registry has applied
        registry.listeners.append(self._learned)

    @property
    def ttl_s(self) -> float:
        return self.registry.learned_ttl_s

    def _learned(self, fact: Learned) -> None:
        if len(fact.model) <= MODEL_ID_MAX:
            self._spawn(lambda: self.store.write([fact], [], {}, ttl_s=self.ttl_s))

    async def forget(self, model: str | None) -> Forgotten:
        """Forget what was learned of `model` (any spelling of its id; None: every model) here
        at once, and in the store: every process drops it within its refresh. If the store
        cannot be reached, the tombstone is kept here and written by the first sync that
        reaches it."""
        at = time.time()
        key = ALL_MODELS if model is None else self.registry.normalize(model).candidates[0]
        self._tombstone(key, at)
        self._applied[key] = at
        dropped = self.registry.forget(model)
        try:
            await self.store.forget(None if model is None else key, at, ttl_s=self.ttl_s)
        except Exception as error:  # Redis down: `Unavailable`; a file system error
            log.warning(
                "forgot %s here; the other %s are told once their store answers (%s)",
                "every learned limit" if model is None else f"what was learned of {key!r}",
                self.store.shared_with,
                type(error).__name__,
            )
            return Forgotten(dropped, False)
        return Forgotten(dropped, True)

    def _tombstone(self, key: str, at: float) -> None:
        if self._forgotten.get(key, 0.0) < at:
            self._forgotten[key] = at
        if len(self._forgotten) > LEARNED_MAX:
            for oldest in sorted(self._forgotten, key=self._forgotten.__getitem__)[
                : len(self._forgotten) - LEARNED_MAX
            ]:
                del self._forgotten[oldest]

    def _buried(self, fact: Learned) -> bool:
        """Whether a tombstone covers `fact` (it was learned by the time it was forgotten)."""
        at = max(self._forgotten.get(fact.model, 0.0), self._forgotten.get(ALL_MODELS, 0.0))
        return fact.learned_at(self.ttl_s) <= at

    def _skip(self, record: str, reason: str, key: Field, why: str) -> None:
        seen = (record, hash(key))
        warn_once(log, seen, "skipped a shared %s record %.80r: %s", record, key, why)
        if self._rejected is not None:
            self._rejected(record, reason)

    async def sync(self) -> None:
        """Apply the store's tombstones; adopt what it holds that is newer; write what it lacks;
        drop what expired, is buried or is not a fact."""
        records = await self.store.read()
        now = time.time()
        horizon = now - self.ttl_s
        stored_tombstones: dict[str, float] = {}
        for key, value in records.forgotten.items():
            tombstone = parse_tombstone(key, value)
            if tombstone is None:
                self._skip("forgotten", "malformed", key, "not a model id and a time")
                continue
            stored_tombstones[tombstone[0]] = tombstone[1]
            if tombstone[1] > horizon:
                self._tombstone(*tombstone)
        self._forgotten = {k: at for k, at in self._forgotten.items() if at > horizon}
        for key, at in self._forgotten.items():
            if self._applied.get(key) != at:  # each tombstone once: adopting checks the rest
                self._applied[key] = at
                self.registry.forget(None if key == ALL_MODELS else key, learned_by=at)
        self._applied = {k: at for k, at in self._applied.items() if k in self._forgotten}

        held: dict[tuple[str, str], float] = {}
        stale: list[tuple[LearnedKind, Field]] = []
        for kind in LEARNED_KINDS:
            facts = []
            for key, value in records.facts.get(kind, {}).items():
                fact = parse_fact(kind, key, value)
                why = "not a fact brim writes" if fact is None else self.registry.rejects(fact)
                if fact is None or why is not None:
                    reason = "malformed" if fact is None else "implausible"
                    self._skip("learned", reason, key, why or "")
                    stale.append((kind, key))
                elif fact.until <= now or self._buried(fact):
                    stale.append((kind, key))
                else:
                    facts.append((fact, key))
            facts.sort(key=lambda pair: pair[0].until, reverse=True)
            stale += [(kind, key) for _, key in facts[LEARNED_MAX:]]
            for fact, _ in facts[:LEARNED_MAX]:
                held[(kind, fact.model)] = fact.until
                if self.registry.adopt(fact):
                    log.info(
                        "adopted from another brim: model %r has %s %d",
                        fact.model,
                        "a window of" if kind == "window" else "output_counts =",
                        fact.value,
                    )
        missing = [
            fact
            for fact in self.registry.learned_facts()
            if held.get((fact.kind, fact.model), 0.0) < fact.until
            and len(fact.model) <= MODEL_ID_MAX
        ]
        unwritten = {
            key: at for key, at in self._forgotten.items() if stored_tombstones.get(key, 0.0) < at
        }
        if missing or stale or unwritten:
            await self.store.write(missing, stale, unwritten, ttl_s=self.ttl_s)


# --- the workers of one brim serve --workers N, without Redis ------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """Where the workers of one `brim serve --workers N` share what they learn without Redis
    (`directory`, private to the run), and this worker's name there (`token`)."""

    directory: Path
    token: str


WORKER_REFRESH_S = 1.0  # how often a worker reads the others' facts
OWN_PREFIX = "learned-"
FORGOTTEN_FILE = "forgotten.json"
LOCK_FILE = "forgotten.lock"


class WorkerFiles:
    """Facts in files: each worker writes its own (`learned-<token>.json`, all it has written,
    replaced whole), reads everyone's; the tombstones are one file all write to, under a lock.
    The files hold what Redis would: model ids, numbers, times."""

    shared_with = "workers"

    def __init__(self, group: WorkerGroup) -> None:
        self.directory = group.directory
        self.own = group.directory / f"{OWN_PREFIX}{group.token}.json"
        self._facts: dict[LearnedKind, dict[str, str]] = {kind: {} for kind in LEARNED_KINDS}

    async def read(self) -> Records:
        return await asyncio.to_thread(self._read)

    def _read(self) -> Records:
        records = Records(facts={kind: {} for kind in LEARNED_KINDS})
        for path in sorted(self.directory.glob(f"{OWN_PREFIX}*.json")):
            content = _load(path)
            for kind in LEARNED_KINDS:
                table = content.get(kind)
                if not isinstance(table, dict):
                    continue
                merged = records.facts[kind]
                assert isinstance(merged, dict)
                for model, value in table.items():
                    if not isinstance(value, str):
                        merged[str(model)] = repr(value)  # read and skipped as malformed
                        continue
                    held = merged.get(model)
                    if held is None or _until(value) > _until(str(held)):
                        merged[model] = value
        tombstones = _load(self.directory / FORGOTTEN_FILE)
        records.forgotten = {str(k): str(v) for k, v in tombstones.items()}
        return records

    async def write(
        self,
        facts: Iterable[Learned],
        stale: Iterable[tuple[LearnedKind, Field]],
        forgotten: Mapping[str, float],
        *,
        ttl_s: float,
    ) -> None:
        facts, stale = list(facts), list(stale)
        own = [(kind, _text(key)) for kind, key in stale if _text(key) in self._facts[kind]]
        if facts or own:
            for fact in facts:
                self._facts[fact.kind][fact.model] = encode(fact)
            for kind, model in own:
                del self._facts[kind][model]
            await asyncio.to_thread(_replace, self.own, self._facts)
        if forgotten:
            await asyncio.to_thread(self._bury, dict(forgotten), ttl_s)

    async def forget(self, model: str | None, at: float, *, ttl_s: float) -> None:
        for table in self._facts.values():
            if model is None:
                table.clear()
            else:
                table.pop(model, None)
        await asyncio.to_thread(_replace, self.own, self._facts)
        await asyncio.to_thread(self._bury, {model or ALL_MODELS: at}, ttl_s)

    def _bury(self, tombstones: dict[str, float], ttl_s: float) -> None:
        """Add tombstones to the shared file (under its lock: every worker writes to it)."""
        with (self.directory / LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held = {
                key: at
                for key, value in _load(self.directory / FORGOTTEN_FILE).items()
                if (parsed := parse_tombstone(key, str(value))) is not None
                and (at := parsed[1]) > time.time() - ttl_s
            }
            for key, at in tombstones.items():
                held[key] = max(at, held.get(key, 0.0))
            _replace(self.directory / FORGOTTEN_FILE, {k: repr(at) for k, at in held.items()})


def _until(value: str) -> float:
    try:
        return float(value.split()[1])
    except (IndexError, ValueError):
        return 0.0


def _load(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; empty if there is none, or it is not one (logged)."""
    try:
        content = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as error:
        log.warning("could not read %s: %s", path, error)
        return {}
    return content if isinstance(content, dict) else {}


def _replace(path: Path, content: Mapping[Any, Any]) -> None:
    """Write `content` to `path` whole: readers see the old file or the new one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(orjson.dumps(content))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
