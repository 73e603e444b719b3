"""How `brim serve` logs: the level and format (`--log-level` / `BRIM_LOG_LEVEL`,
`--log-format` / `BRIM_LOG_FORMAT`, the flag winning), and the JSON formatter.

Text is one line per record, `time LEVEL logger: message`. JSON is one object per line for
every record, brim's and its libraries': `time`, `level`, `logger`, `message`, the record's
`extra=` fields as keys of their own (the request line's `model`, `tokens_in`, … — see
`middleware.stages.observe.log_request`), and `exc_info` / `stack_info` when there are any.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from brim.proxy.config import ConfigError

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LEVEL_ENV = "BRIM_LOG_LEVEL"
FORMAT_ENV = "BRIM_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has; anything else on a record came from `extra=`.
RECORD_ATTRIBUTES = frozenset(
    {*logging.makeLogRecord({}).__dict__, "message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in RECORD_ATTRIBUTES and not key.startswith("_"):
                entry.setdefault(key, value)
        if record.exc_info and not record.exc_text:  # cached, as logging.Formatter does
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


def chosen(flag: str | None, env: str, allowed: tuple[str, ...], default: str) -> str:
    """The flag if given, else the environment variable `env` (any case), else `default`."""
    if flag is not None:
        return flag
    value = os.environ.get(env, "").strip().lower()
    if not value:
        return default
    if value not in allowed:
        raise ConfigError(f"{env}={value!r}: expected one of {', '.join(allowed)}")
    return value


def configure_logging(
    level: str, fmt: str, stream: TextIO | None = None, *, process_ids: bool = False
) -> logging.Handler:
    """Send every log record at `level` or above to `stream` (stderr) in `fmt`, replacing any
    handler the root logger had (`process_ids`: text lines name the process that wrote them,
    as the workers of `brim serve --workers` share one stderr). Returns the handler."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    text = (
        TEXT_FORMAT.replace("%(name)s:", "%(name)s[%(process)d]:") if process_ids else TEXT_FORMAT
    )
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    return handler
