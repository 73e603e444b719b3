"""The content archive: the original of everything brim cleared, evicted or cut, by sha256.

Files live under `dir` (created 0700) as `ab/abcdef…` (0600), written atomically. A file whose
content no longer matches its key is corrupt: it is skipped, logged and removed, never fatal.
Files older than `ttl_hours` are removed by `cleanup()`, which the app runs on a timer.
`resolve()` turns what a placeholder shows (`sha256:` and the first 16 hex digits) into the key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from policies.conversation import parse_key

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

    def _path(self, key: str) -> Path:
        if parse_key(key) != key:
            raise ValueError("an archive key is 64 lowercase hex digits")
        return self.directory / key[:2] / key

    def resolve(self, key: str) -> str | None:
        """The full key that `key` names: all 64 hex digits or a unique prefix of at least
        `MIN_PREFIX`, optionally after `sha256:` (as placeholders show it). None if nothing
        archived matches; ValueError if `key` is malformed or matches more than one original."""
        digits = parse_key(key, MIN_PREFIX)
        if digits is None:
            raise ValueError(
                f"an archive key is {MIN_PREFIX} to 64 hex digits, optionally after 'sha256:' "
                f"(got {key[:80]!r})"
            )
        folder = self.directory / digits[:2]
        try:
            names = [entry.name for entry in os.scandir(folder)]
        except (FileNotFoundError, NotADirectoryError):
            return None
        found = sorted(
            name for name in names if name.startswith(digits) and parse_key(name) == name
        )
        if len(found) > 1:
            raise ValueError(
                f"{digits} is ambiguous: {len(found)} archived originals start with it "
                "(give more digits)"
            )
        return found[0] if found else None

    def put(self, key: str, content: str) -> None:
        path = self._path(key)
        if path.exists():
            return
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = path.with_name(f".{key}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content.encode("utf-8", "surrogatepass"))
        os.replace(temporary, path)

    def put_many(self, items: Iterable[tuple[str, str]]) -> None:
        for key, content in items:
            try:
                self.put(key, content)
            except OSError:
                log.exception("could not archive %s", key[:16])

    def get(self, key: str) -> str | None:
        """The original stored under `key`; None if absent, expired or corrupt."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != key:
            log.warning("archive file %s is corrupt; removing it", path.name[:16])
            path.unlink(missing_ok=True)
            return None
        return data.decode("utf-8", "surrogatepass")

    def cleanup(self, now: float | None = None) -> int:
        """Remove files older than the TTL (and leftovers of interrupted writes)."""
        cutoff = (now if now is not None else time.time()) - self.ttl_seconds
        removed = 0
        for path in self.directory.glob("*/*"):
            try:
                if path.stat().st_mtime < cutoff or path.name.endswith(".tmp"):
                    path.unlink()
                    removed += 1
            except OSError:
                log.warning("could not remove %s from the archive", path.name[:16])
        return removed
