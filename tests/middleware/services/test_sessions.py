"""The session memory: bounded by what its entries really take, least recently used first, and
the entries a session has grown past before any other."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from typing import Any

import orjson
import pytest

from brim.middleware.services.sessions import SessionMemory
from brim.policies.carry import Carried, carried_from, prefix_digests
from brim.policies.compress import Outcome, compress
from brim.policies.conversation import FidelityRecord
from tests.builders import tool_session
from tests.policies.test_carry import DIALECT, METER, POLICIES

API, TOKENIZER = "openai.chat", "o200k_base"
OWNER = "cred-" + "0" * 32


def fresh(text: str | None) -> str | None:
    """A copy of `text` that is an object of its own (as a new request's would be)."""
    return None if text is None else (text + " ")[:-1]


def anew(outcome: Outcome, client: list[Any]) -> Outcome:
    """`outcome` as another request of the same shape would make it: its own objects (brim's
    items, records, sizes), so that each remembered entry holds memory of its own."""
    ours = {id(item) for item in client}
    records = tuple(
        dataclasses.replace(
            record,
            archive_key=fresh(record.archive_key),
            detail=fresh(record.detail) or "",
            original=fresh(record.original),
            batch=None if record.batch is None else tuple(orjson.loads(orjson.dumps(record.batch))),
        )
        for record in outcome.records
    )
    return dataclasses.replace(
        outcome,
        messages=tuple(
            message if id(message) in ours else orjson.loads(orjson.dumps(message))
            for message in outcome.messages
        ),
        records=records,
        sizes=tuple(orjson.loads(orjson.dumps(outcome.sizes))),
    )


@pytest.mark.parametrize(
    ("outputs", "limit"),
    [
        # Mostly evicted: few items of brim's own, many indices and records.
        ([f"step {n} done" for n in range(200)], 2_000),
        # Mostly cleared and pruned: many items of brim's own.
        (
            [
                f"out {n}\n" + "\n".join(f"line {n}.{i}" for i in range(n % 7 * 10))
                for n in range(150)
            ],
            5_000,
        ),
    ],
    ids=["evicted", "rewritten"],
)
def test_what_the_memory_holds_stays_within_its_bound(outputs: list[str], limit: int) -> None:
    """Many compressed turns of long sessions remembered: what stays in memory (measured, not
    estimated) is within a small factor of the bound — the weights count the items, sizes and
    records a turn holds, not only the text of brim's own items."""
    client = tool_session(outputs)
    outcome = compress(
        DIALECT, client, METER.fixed({}), METER, POLICIES, limit=limit, low_water=0.85
    )
    assert outcome.records and outcome.fits
    bound = 1 << 18
    memory = SessionMemory(bound)
    turns = 16
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(turns):
            carried = carried_from(anew(outcome, client), client)
            assert carried is not None
            memory.remember(OWNER, API, TOKENIZER, n.to_bytes(16, "little"), carried)
        del carried
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= 1.25 * bound, f"{held / bound:.2f} × the bound, {len(memory)} entries"
    assert held >= bound / 2  # the bound, not something else, is what limits it
    assert 1 < len(memory) < turns
    assert memory.weight <= bound


def carried(covers: int, weight: int) -> Carried:
    record = FidelityRecord("evict", "evicted", 0, 10, 0)
    return Carried(covers, (0,), (10,), (record,), 100, weight)


def test_least_recently_used_entries_go_first() -> None:
    memory = SessionMemory(3_000)
    sessions = [prefix_digests([{"role": "user", "content": f"task {n}"}]) for n in range(4)]
    for n in range(3):
        memory.remember(OWNER, API, TOKENIZER, sessions[n][-1], carried(1, 1_000))
    assert memory.latest(OWNER, API, TOKENIZER, sessions[0]) is not None  # the same request again
    memory.remember(OWNER, API, TOKENIZER, sessions[3][-1], carried(1, 1_000))
    assert memory.latest(OWNER, API, TOKENIZER, sessions[1]) is None  # the least recently used
    assert all(memory.latest(OWNER, API, TOKENIZER, sessions[n]) for n in (0, 2, 3))
    assert len(memory) == 3 and memory.weight == 3_000
    # The same key again replaces its entry; one heavier than the whole bound is not kept.
    memory.remember(OWNER, API, TOKENIZER, sessions[3][-1], carried(1, 500))
    assert len(memory) == 3 and memory.weight == 2_500
    memory.remember(OWNER, API, TOKENIZER, b"too big", carried(1, 3_001))
    assert len(memory) == 3 and memory.weight == 2_500


def test_an_entry_a_session_has_grown_past_goes_before_any_other() -> None:
    """Turn 1 of a session is remembered, then another session's turn; the first session's
    turn 2 finds turn 1 and is remembered in turn. Turn 1 is still there for a request that
    branches off it (its last message edited) — until room is needed: then it goes first,
    before the other session's only entry, though that was used less recently."""
    memory = SessionMemory(3_000)
    first = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "done"}]
    turn1 = prefix_digests(first)
    other = prefix_digests([{"role": "user", "content": "another task"}])
    memory.remember(OWNER, API, TOKENIZER, turn1[-1], carried(2, 1_000))
    memory.remember(OWNER, API, TOKENIZER, other[-1], carried(1, 1_000))
    turn2 = prefix_digests([*first, {"role": "user", "content": "and now?"}])
    base = memory.latest(OWNER, API, TOKENIZER, turn2)
    assert base is not None and base.covers == 2
    memory.remember(OWNER, API, TOKENIZER, turn2[-1], carried(3, 1_000))
    edited = prefix_digests([*first, {"role": "user", "content": "and then?"}])
    assert memory.latest(OWNER, API, TOKENIZER, edited) is base  # still there while there is room
    memory.remember(OWNER, API, TOKENIZER, b"a third session", carried(1, 1_000))
    assert memory.latest(OWNER, API, TOKENIZER, edited) is None
    assert memory.latest(OWNER, API, TOKENIZER, other) is not None
    assert memory.latest(OWNER, API, TOKENIZER, turn2) is not None
