"""The audit log: one JSON line per overflow event or compression, rotated by size.

Never message content, never keys: only ids, counts, names and archive keys. The log, and each
new file a rotation starts, is 0600 (its owner's only), whatever the umask.
"""

from __future__ import annotations

import contextlib
import io
import logging
import logging.handlers
import os
from pathlib import Path
from typing import Any

import orjson


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """Opens (and after each rotation re-creates) its file 0600, whatever the umask.

    Several processes may write the one file (the workers of `brim serve --workers`): a record
    goes to the file now at the path, reopened if another process has rotated it away. (Two
    processes rotating at the very same moment rotate twice: no line is lost, but one backup
    goes early.)"""

    def _open(self) -> io.TextIOWrapper:
        descriptor = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with contextlib.suppress(OSError):  # a file that predates this: made private too
            os.fchmod(descriptor, 0o600)
        return open(descriptor, "a", encoding=self.encoding, errors=self.errors)

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is not None:
            opened = os.fstat(self.stream.fileno())
            try:
                current = os.stat(self.baseFilename)
                moved = (current.st_ino, current.st_dev) != (opened.st_ino, opened.st_dev)
            except FileNotFoundError:
                moved = True
            if moved:  # rotated by another process: on to the new file
                self.stream.close()
                self.stream = self._open()
        # The base class measures the file by seeking to its end: every writer's lines count.
        return bool(super().shouldRollover(record))


class AuditLog:
    def __init__(self, path: str | Path, *, max_bytes: int, backups: int) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = PrivateRotatingFileHandler(
            self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger = logging.Logger(f"brim.audit.{id(self)}")  # private: never propagates
        self._logger.addHandler(self._handler)

    def write(self, record: dict[str, Any]) -> None:
        self._logger.info(orjson.dumps(record).decode())

    def close(self) -> None:
        self._handler.close()
