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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.compress import Outcome
from policies.conversation import Dialect, FidelityRecord, Meter


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
    grid: int
    weight: int  # bytes of brim's own items, for the memory's bound


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
    items: list[int | Made] = []
    weight = 0
    for message in outcome.messages:
        index = position.get(id(message))
        if index is None:
            items.append(Made(message))
            weight += len(orjson.dumps(message))
        else:
            items.append(index)
    sizes = outcome.sizes
    records = tuple(dataclasses.replace(record, original=None) for record in outcome.records)
    return Carried(
        len(client), tuple(items), sizes, records, outcome.target, outcome.grid, weight + 64
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
    `tokens_in`: the client's request as counted already, if it was (else counted here)."""
    if len(client) < carried.covers:
        return None
    messages = [client[i] if isinstance(i, int) else i.item for i in carried.items]
    added = client[carried.covers :]
    messages += added
    sizes = [*carried.sizes, *(meter.message(item) for item in added)]
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
        grid=carried.grid,
        carried=True,
    )
