"""The audit log as an operator finds it on disk: JSON lines, rotated, private to brim's user."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brim.middleware.services.audit import AuditLog
from tests.builders import tool_session
from tests.conftest import BrimFactory


def big_session() -> list[dict[str, Any]]:
    return tool_session(
        ["\n".join(f"output {n} line {i}: value value value" for i in range(80)) for n in range(8)]
    )


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """The umask most shells start with, under which a plain open() makes a file 0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("permissive_umask")
def test_the_audit_log_and_its_rotations_are_private(brim: BrimFactory, tmp_path: Path) -> None:
    log = tmp_path / "audit" / "brim.jsonl"
    base = brim(
        models={"small": {"context_window": 4_000, "max_output": 500}},
        guard={"policies": ["clear_tool_results"]},
        audit={"path": str(log), "max_mb": 0.0001, "backups": 3},  # ~100 bytes: every line rotates
    )
    assert log.exists() and mode(log) == 0o600  # from the start, before any line
    for _ in range(3):
        reply = httpx.post(
            f"{base}/v1/chat/completions", json={"model": "small", "messages": big_session()}
        )
        assert reply.status_code == 200 and "clear" in reply.headers["x-brim-actions"]

    # The last line is written just after its reply went out (Observe publishes on the event
    # loop's next turn), so this process may look a moment before it is there — and the file
    # it goes to is rotated in first: three rotations may be on disk before the third line.
    def written() -> tuple[list[Path], list[str]]:
        rotated = sorted(log.parent.glob("brim.jsonl.*"))
        try:
            return rotated, [ln for path in [log, *rotated] for ln in path.read_text().splitlines()]
        except FileNotFoundError:  # rotated while read
            return rotated, []

    deadline = time.monotonic() + 5
    rotated, lines = written()
    while (len(rotated) < 3 or len(lines) < 3) and time.monotonic() < deadline:
        time.sleep(0.01)
        rotated, lines = written()
    assert [path.name for path in rotated] == ["brim.jsonl.1", "brim.jsonl.2", "brim.jsonl.3"]
    assert [json.loads(line)["outcome"] for line in lines] == ["compressed"] * 3
    assert {path.name: mode(path) for path in [log, *rotated]} == {
        "brim.jsonl": 0o600,
        "brim.jsonl.1": 0o600,
        "brim.jsonl.2": 0o600,
        "brim.jsonl.3": 0o600,
    }


@pytest.mark.usefixtures("permissive_umask")
def test_an_audit_log_left_readable_by_others_is_made_private(
    brim: BrimFactory, tmp_path: Path
) -> None:
    log = tmp_path / "brim.jsonl"
    log.write_text('{"outcome": "compressed"}\n')
    log.chmod(0o644)
    brim(audit={"path": str(log)})
    assert mode(log) == 0o600
    assert log.read_text() == '{"outcome": "compressed"}\n'  # appended to, never truncated


def test_several_processes_writing_one_audit_log_rotate_it_together(tmp_path: Path) -> None:
    """The workers of `brim serve --workers` each hold the log open: after one rotates it, the
    others write on to the new file — the lines stay in order, and each backup is full."""
    log = tmp_path / "brim.jsonl"
    workers = [AuditLog(log, max_bytes=400, backups=50) for _ in range(2)]
    for index in range(60):
        workers[index % 2].write({"n": index, "outcome": "compressed", "pad": "x" * 20})
    for worker in workers:
        worker.close()
    backups = sorted(log.parent.glob("brim.jsonl.*"), key=lambda path: -int(path.suffix[1:]))
    files = [*backups, log]  # oldest first
    lines = [line for path in files for line in path.read_text().splitlines()]
    assert [json.loads(line)["n"] for line in lines] == list(range(60))
    longest = max(len(line) + 1 for line in lines)
    sizes = {path.name: path.stat().st_size for path in files}
    assert all(400 - longest < sizes[path.name] <= 400 for path in backups), sizes
