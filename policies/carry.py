"""Carrying a session's compression forward, so the provider's prompt cache keeps its prefix.

Turn N+1 of a conversation is turn N's items plus what the client added. Once turn N was
compressed, turn N+1 goes out as *turn N's compressed request* plus the new items, byte for
byte, for as long as that fits the limit; only then is the conversation compressed again, from
the client's own items — and deep enough to leave room for the next few turns at the rate the
session has been growing (`room`), so that the next re-cut is some turns away.

A `Carried` is what one compressed request was made of: for each item sent, the index of the
client's item it is (untouched), or brim's own item (a pruned or cleared result, a notice, a
summary). It is stored under the digest of the client items it covers (`prefix_digests`):
only a request that starts with exactly those items finds it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from brim.policies.compress import Outcome
from brim.policies.conversation import Dialect, FidelityRecord, Meter


@dataclass(frozen=True, slots=True)
class Made:
    """An item brim wrote (in place of a client's item, or of several)."""

    item: Any


@dataclass(frozen=True, slots=True)
class Carried:
    covers: int  # how many of the client's items it stands for
    items: tuple[int | Made, ...]
    sizes: tuple[int, ...]
    records: tuple[FidelityRecord, ...]  # what is in effect, without the originals
    target: int
    weight: int  # bytes it takes in memory, for the memory's bound (`weight_of`)
    ratio: float = 1.0  # what `sizes` were scaled by (`Meter.ratio`)


# What a `Carried` takes besides brim's own items, in bytes as CPython (64-bit) allocates them
# (each object rounded up to 16): a pointer in `items` and one in `sizes` per item, and an int
# object for each index and token count past the cached small ints; a `Made` per item of
# brim's own; per record, the record, its key, its batch and ints (its policy, action and
# detail are mostly shared constants); per entry, the `Carried`, its three tuples' headers,
# its key in the memory (a tuple and a digest) and the memory's bookkeeping for it.
# `tests/middleware/services/test_sessions.py` measures the whole against tracemalloc.
POINTERS = 2 * 8
INT = 32
SMALL_INT = 256  # ints up to this one are shared
MADE = 48
RECORD = 384
ENTRY = 1024


def footprint(values: Iterable[Any]) -> int:
    """Bytes `values` take in memory: each and everything their dicts and lists hold, each
    object once, rounded up as the allocator does; not a dict's keys (the same few names,
    shared by every message)."""
    seen: set[int] = set()
    total = 0
    stack = list(values)
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += (sys.getsizeof(item) + 15) & ~15
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, (list, tuple)):
            stack += item
    return total


def weight_of(
    items: Sequence[int | Made], sizes: Sequence[int], records: Sequence[FidelityRecord]
) -> int:
    """What a `Carried` of these takes in memory: brim's own items object by object
    (`footprint`), the rest by the allowances above."""
    made = [item.item for item in items if isinstance(item, Made)]
    ints = sum(1 for item in items if isinstance(item, int) and item > SMALL_INT)
    ints += sum(1 for size in sizes if size > SMALL_INT)
    return (
        ENTRY
        + POINTERS * len(items)
        + INT * ints
        + MADE * len(made)
        + footprint(made)
        + RECORD * len(records)
    )


def prefix_digests(items: Sequence[Any]) -> list[bytes]:
    """`digests[k - 1]` is the digest of `items[:k]`: one pass over the items."""
    running = hashlib.blake2b(digest_size=16)
    digests: list[bytes] = []
    for item in items:
        data = orjson.dumps(item)
        running.update(len(data).to_bytes(8, "little"))
        running.update(data)
        digests.append(running.digest())
    return digests


def carried_from(outcome: Outcome, client: Sequence[Any]) -> Carried | None:
    """What `outcome` made of the client's items, to build the next turn on; None when there
    is nothing to carry (nothing was cut, or pairs were repaired: the next turn starts over)."""
    if not outcome.records or outcome.repairs or not outcome.fits:
        return None
    position = {id(item): index for index, item in enumerate(client)}
    items = tuple(
        Made(message) if (index := position.get(id(message))) is None else index
        for message in outcome.messages
    )
    records = outcome.records
    if any(record.original is not None for record in records):  # a carried turn's are without
        records = tuple(dataclasses.replace(record, original=None) for record in records)
    return Carried(
        len(client),
        items,
        outcome.sizes,
        records,
        outcome.target,
        weight_of(items, outcome.sizes, records),
        outcome.ratio,
    )


def growth(carried: Carried, client: Sequence[Any], meter: Meter) -> int:
    """Tokens the client added since the carried turn."""
    return sum(meter.message(item) for item in client[carried.covers :])


def carry(
    carried: Carried,
    dialect: Dialect,
    client: Sequence[Any],
    fixed: int,
    meter: Meter,
    *,
    limit: int,
    tokens_in: int | None = None,
) -> Outcome | None:
    """The carried request plus the client's new items, if it fits `limit` and is valid.
    `tokens_in`: the client's request as counted already, if it was (else counted here).
    Carried at another ratio than the meter's (the model's was learned further since), its
    items are counted again (from the counter's cache)."""
    if len(client) < carried.covers:
        return None
    messages = [client[i] if isinstance(i, int) else i.item for i in carried.items]
    kept = carried.sizes if carried.ratio == meter.ratio else [*map(meter.message, messages)]
    added = client[carried.covers :]
    messages += added
    sizes = [*kept, *(meter.message(item) for item in added)]
    total = fixed + sum(sizes)
    if total > limit or dialect.violations(messages):
        return None
    return Outcome(
        messages=tuple(messages),
        sizes=tuple(sizes),
        changed=True,
        tokens_in=(tokens_in if tokens_in is not None else fixed + sum(map(meter.message, client))),
        tokens_out=total,
        limit=limit,
        target=carried.target,
        records=carried.records,
        repairs=(),
        tried=(),
        carried=True,
        ratio=meter.ratio,
    )
