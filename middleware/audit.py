"""The audit log: one JSON line per overflow event or compression, rotated by size.

Never message content, never keys: only ids, counts, names and archive keys.
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path
from typing import Any

import orjson


class AuditLog:
    def __init__(self, path: str | Path, *, max_bytes: int, backups: int) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = logging.handlers.RotatingFileHandler(
            self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger = logging.Logger(f"brim.audit.{id(self)}")  # private: never propagates
        self._logger.addHandler(self._handler)
        self.path.touch(mode=0o600, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        self._logger.info(orjson.dumps(record).decode())

    def close(self) -> None:
        self._handler.close()
