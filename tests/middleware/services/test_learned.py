"""Learned limits kept in step through a store: here the files a `--workers` group shares (the
Redis store is driven in tests/middleware/services/test_shared.py and tests/security)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson

from brim.middleware.services.learned import SharedLimits, WorkerFiles, WorkerGroup
from brim.policies.limits import LimitsRegistry, ModelFacts

MODELS = {"house": ModelFacts(context_window=64_000)}


def worker(directory: Path, token: str, rejected: list[tuple[str, str]]) -> SharedLimits:
    """A worker's registry, sharing through `directory`; its writes are awaited by `sync`."""
    pending = []
    shared = SharedLimits(
        WorkerFiles(WorkerGroup(directory, token)),
        LimitsRegistry(MODELS),
        spawn=lambda work: pending.append(work),
        rejected=lambda record, reason: rejected.append((record, reason)),
    )
    original = shared.sync

    async def sync() -> None:
        while pending:
            await pending.pop(0)()
        await original()

    shared.sync = sync  # type: ignore[method-assign]
    return shared


async def test_workers_adopt_each_others_facts_and_forget_them_together(tmp_path: Path) -> None:
    rejected: list[tuple[str, str]] = []
    one, two = worker(tmp_path, "1", rejected), worker(tmp_path, "2", rejected)
    assert one.registry.learn("house", 16_000)
    await one.sync()
    await two.sync()
    assert two.registry.learned == {"house": 16_000}

    done = await two.forget("HOUSE")  # any spelling of the id
    assert done.reached and [fact.model for fact in done.dropped] == ["house"]
    await one.sync()
    assert one.registry.learned == {}
    await one.sync()
    await two.sync()  # nobody writes it back
    assert one.registry.learned == two.registry.learned == {}

    # A fact learned after the tombstone is new evidence: it stands, and is shared.
    await asyncio.sleep(0.01)
    assert one.registry.learn("house", 20_000)
    await one.sync()
    await two.sync()
    assert two.registry.learned == {"house": 20_000}
    assert rejected == []


async def test_what_another_writer_left_in_the_files_is_skipped_and_counted(
    tmp_path: Path,
) -> None:
    rejected: list[tuple[str, str]] = []
    day = time.time() + 24 * 3600 - 60
    (tmp_path / "learned-x.json").write_bytes(
        orjson.dumps(
            {
                "window": {
                    "house": f"1 {day!r}",  # below the floor
                    "other": "garbage",
                    "third": 12,
                    "fine-model": f"50000 {day!r}",
                },
                "output_counts": {"house": f"3 {day!r}"},
            }
        )
    )
    (tmp_path / "learned-y.json").write_bytes(b"{not json")
    (tmp_path / "forgotten.json").write_bytes(orjson.dumps({"house": "when?"}))
    shared = worker(tmp_path, "1", rejected)
    await shared.sync()
    assert shared.registry.learned == {"fine-model": 50_000}
    assert sorted(rejected) == [
        ("forgotten", "malformed"),
        ("learned", "implausible"),  # window 1
        ("learned", "implausible"),  # output_counts 3
        ("learned", "malformed"),  # "garbage"
        ("learned", "malformed"),  # 12
    ]
