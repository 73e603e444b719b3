"""The content archive: the original of everything brim cleared, evicted or cut, by owner and
sha256.

Files live under `dir` (created 0700) as `<owner>/ab/abcdef…` (0600), written atomically: each
original belongs to the owner of the request it came from (`Exchange.owner`), and one owner's
files are never read for another. The operator (`GET /admin/archive/{key}`, `brim archive get`)
reads across every owner. A file whose content no longer matches its key is corrupt: it is
skipped, logged and removed, never fatal. Files older than `ttl_hours` are removed by
`cleanup()`, which the app runs on a timer (files of the layout before owners, `ab/abcdef…`
directly under `dir`, are no longer read and are removed with age too). `resolve()` turns what a
placeholder shows (`sha256:` and the first 16 hex digits) into the key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from brim.adapters.exchange import OWNER_PATTERN
from brim.policies.conversation import parse_key

log = logging.getLogger("brim.archive")
MIN_PREFIX = 8


class ContentArchive:
    def __init__(self, directory: str | Path, ttl_hours: float) -> None:
        if ttl_hours <= 0:
            raise ValueError(f"ttl_hours must be positive, not {ttl_hours}")
        self.directory = Path(directory).expanduser()
        self.ttl_seconds = ttl_hours * 3600
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)

    def _path(self, owner: str, key: str) -> Path:
        if parse_key(key) != key:
            raise ValueError("an archive key is 64 lowercase hex digits")
        if OWNER_PATTERN.fullmatch(owner) is None:
            raise ValueError("an archive owner is a short lowercase name")
        return self.directory / owner / key[:2] / key

    def _owners(self, owner: str | None) -> Iterator[str]:
        """`owner`, or (None: the operator) every owner that has a folder."""
        if owner is not None:
            yield owner
            return
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return
        for entry in sorted(entries, key=lambda e: e.name):
            if OWNER_PATTERN.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                yield entry.name

    def resolve(self, key: str, owner: str | None = None) -> str | None:
        """The full key that `key` names among `owner`'s originals (None: anyone's, for the
        operator): all 64 hex digits or a unique prefix of at least `MIN_PREFIX`, optionally
        after `sha256:` (as placeholders show it). None if nothing archived matches; ValueError
        if `key` is malformed or matches more than one original."""
        digits = parse_key(key, MIN_PREFIX)
        if digits is None:
            raise ValueError(
                f"an archive key is {MIN_PREFIX} to 64 hex digits, optionally after 'sha256:' "
                f"(got {key[:80]!r})"
            )
        found: set[str] = set()
        for name in self._owners(owner):
            folder = self.directory / name / digits[:2]
            try:
                names = [entry.name for entry in os.scandir(folder)]
            except (FileNotFoundError, NotADirectoryError):
                continue
            found |= {n for n in names if n.startswith(digits) and parse_key(n) == n}
        if len(found) > 1:
            raise ValueError(
                f"{digits} is ambiguous: {len(found)} archived originals start with it "
                "(give more digits)"
            )
        return found.pop() if found else None

    def put(self, owner: str, key: str, content: str) -> None:
        path = self._path(owner, key)
        if path.exists():
            return
        for folder in (path.parent.parent, path.parent):  # the owner's, then the digits'
            folder.mkdir(mode=0o700, exist_ok=True)
        temporary = path.with_name(f".{key}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content.encode("utf-8", "surrogatepass"))
        os.replace(temporary, path)

    def put_many(self, owner: str, items: Iterable[tuple[str, str]]) -> None:
        for key, content in items:
            try:
                self.put(owner, key, content)
            except (OSError, ValueError):
                log.exception("could not archive %s", key[:16])

    def get(self, key: str, owner: str | None = None) -> str | None:
        """The original stored under `key` for `owner` (None: anyone's, for the operator);
        None if absent, expired or corrupt."""
        for name in self._owners(owner):
            path = self._path(name, key)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            if hashlib.sha256(data).hexdigest() != key:
                log.warning("archive file %s is corrupt; removing it", path.name[:16])
                path.unlink(missing_ok=True)
                continue
            return data.decode("utf-8", "surrogatepass")
        return None

    def cleanup(self, now: float | None = None) -> int:
        """Remove files older than the TTL (and leftovers of interrupted writes)."""
        cutoff = (now if now is not None else time.time()) - self.ttl_seconds
        removed = 0
        for path in self.directory.rglob("*"):
            try:
                if path.is_file() and (path.stat().st_mtime < cutoff or path.name.endswith(".tmp")):
                    path.unlink()
                    removed += 1
            except OSError:
                log.warning("could not remove %s from the archive", path.name[:16])
        return removed
