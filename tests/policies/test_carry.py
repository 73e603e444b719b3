"""Carrying a compressed session forward: digests, what is carried, when it still fits."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.carry import Made, carried_from, carry, growth, prefix_digests
from brim.policies.compress import (
    DEFAULT_ORDER,
    MIN_TARGET_SHARE,
    build_policies,
    compress,
    room_target,
)
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.chat import CHAT, ChatDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import tool_session, tool_turn
from tests.fakes import pairing_errors

use_bundled_tiktoken_files()
METER = CounterMeter(TokenCounter(), "o200k_base", "gpt-4o", CHAT)
DIALECT = ChatDialect()
POLICIES = build_policies(DEFAULT_ORDER, {})


def log(n: int) -> str:
    return "\n".join(f"step {n}.{i}: compiled a module without warnings" for i in range(120))


LOGS = [log(n) for n in range(12)]

items = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text()}),
    max_size=8,
)


@given(items, items, st.data())
def test_digests_agree_exactly_as_far_as_the_items_do(
    a: list[Any], other: list[Any], data: st.DataObject
) -> None:
    # Two independent lists rarely share a prefix: b is a's first k items, then others.
    shared = data.draw(st.integers(0, len(a)), label="shared")
    b = a[:shared] + other
    da, db = prefix_digests(a), prefix_digests(b)
    assert len(da) == len(a) and len(db) == len(b)
    for k in range(1, min(len(a), len(b)) + 1):
        same = [orjson.dumps(x) for x in a[:k]] == [orjson.dumps(x) for x in b[:k]]
        assert (da[k - 1] == db[k - 1]) == same  # bytes: the order of keys counts too


def test_an_item_split_differently_has_another_digest() -> None:
    # The same bytes cut into items differently: not the same conversation.
    one = [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]
    assert prefix_digests(one)[-1] != prefix_digests(two)[-1]


def compressed(messages: list[Any], limit: int) -> Any:
    return compress(
        DIALECT, messages, METER.fixed({}), METER, POLICIES, limit=limit, low_water=0.85
    )


def test_the_next_turn_is_the_compressed_one_plus_the_new_items() -> None:
    client = tool_session(LOGS[:8])
    outcome = compressed(client, 4_000)
    assert outcome.records and outcome.fits
    carried = carried_from(outcome, client)
    assert carried is not None and carried.covers == len(client)
    assert all(record.original is None for record in carried.records)
    # Untouched items are indices into the next request, not copies.
    assert any(isinstance(item, int) for item in carried.items)
    assert any(isinstance(item, Made) for item in carried.items)

    added = [*tool_turn("c_next", "ok"), {"role": "user", "content": "and?"}]
    grown = [*client, *added]
    following = carry(carried, DIALECT, grown, METER.fixed({}), METER, limit=4_000)
    assert following is not None and following.carried
    assert [orjson.dumps(m) for m in following.messages] == [
        orjson.dumps(m) for m in (*outcome.messages, *added)
    ]
    assert following.tokens_out == outcome.tokens_out + sum(METER.message(m) for m in added)
    for made in (outcome, following):
        assert made.sizes == tuple(METER.message(m) for m in made.messages)
        assert made.tokens_out == METER.fixed({}) + sum(made.sizes)
    assert following.tokens_in > following.tokens_out
    assert following.records == carried.records
    assert pairing_errors(list(following.messages)) == []
    assert growth(carried, grown, METER) == sum(METER.message(m) for m in added)
    # Remembered in turn, the carried turn shares its records with the one it was built on.
    onward = carried_from(following, grown)
    assert onward is not None and onward.covers == len(grown)
    assert onward.records is carried.records


def test_nothing_is_carried_past_the_limit_or_into_a_broken_pairing() -> None:
    client = tool_session(LOGS[:8])
    outcome = compressed(client, 4_000)
    carried = carried_from(outcome, client)
    assert carried is not None
    big = [*tool_turn("c_big", log(99) * 3), {"role": "user", "content": "and?"}]
    assert carry(carried, DIALECT, [*client, *big], METER.fixed({}), METER, limit=4_000) is None
    orphan = [{"role": "tool", "tool_call_id": "nobody", "content": "stray"}]
    assert carry(carried, DIALECT, [*client, *orphan], METER.fixed({}), METER, limit=4_000) is None
    assert carry(carried, DIALECT, client[:3], METER.fixed({}), METER, limit=4_000) is None


def test_an_uncut_or_repaired_request_is_not_carried() -> None:
    client = tool_session(["short"])
    assert carried_from(compressed(client, 100_000), client) is None
    broken = [*client, {"role": "tool", "tool_call_id": "nobody", "content": "stray"}]
    repaired = compressed(broken, 100_000)
    assert repaired.repairs
    assert carried_from(repaired, broken) is None


def test_room_lowers_the_target_to_min_target_share_at_most_and_keeps_the_grid() -> None:
    assert MIN_TARGET_SHARE == 0.7
    assert room_target(10_000, 0.85, 0) == 8_500
    assert room_target(10_000, 0.85, 500) == 8_500  # the low-water mark already leaves it
    assert room_target(10_000, 0.85, 2_500) == 7_500
    assert room_target(10_000, 0.85, 60_000) == 7_000  # no lower than MIN_TARGET_SHARE
    assert room_target(10_000, 0.4, 60_000) == 4_000  # never above the low-water mark
    client = tool_session(LOGS)
    plain = compressed(client, 6_000)
    roomy = compress(
        DIALECT, client, METER.fixed({}), METER, POLICIES, limit=6_000, low_water=0.85, room=1_500
    )
    assert roomy.target == 4_500 < plain.target
    assert roomy.tokens_out <= 4_500 < plain.tokens_out
    deepest = compress(
        DIALECT, client, METER.fixed({}), METER, POLICIES, limit=6_000, low_water=0.85, room=9_000
    )
    assert deepest.target == 4_200
    # The grid is the low-water mark's (5 000 − 4 250), not the lower target's: evict's batches
    # — what the summaries are made per — are the same for the units cut either way.
    evict = build_policies(["evict"], {})
    shorter = tool_session([text[: len(text) // 2] for text in LOGS])
    batches = []
    for room in (0, 9_000):
        made = compress(
            DIALECT, shorter, METER.fixed({}), METER, evict, limit=5_000, low_water=0.85, room=room
        )
        evicted = [record for record in made.records if record.action == "evicted"]
        assert len({record.batch and record.batch[0] for record in evicted}) == 1  # one class
        running = 0
        for record in evicted:  # the class's running sum, in steps of the grid
            assert record.batch is not None and record.batch[1] == running // 750
            running += record.tokens_before
        batches.append({record.index: record.batch for record in evicted})
    assert batches[0] and len(batches[1]) > len(batches[0])
    assert batches[0].items() <= batches[1].items()


def test_a_turn_carried_at_an_older_ratio_is_counted_at_the_new_one() -> None:
    """The model's ratio was learned further since the carried turn (1.15 → 1.5): the carried
    items count at the new ratio, so a next turn that fits only at the old one is not sent."""
    client = tool_session(LOGS[:8])
    old = CounterMeter(TokenCounter(), "claude", "claude-x", CHAT, 1.15)
    new = CounterMeter(TokenCounter(), "claude", "claude-x", CHAT, 1.5)
    outcome = compress(DIALECT, client, old.fixed({}), old, POLICIES, limit=4_000, low_water=0.85)
    carried = carried_from(outcome, client)
    assert carried is not None and carried.ratio == 1.15
    added = [{"role": "user", "content": "and?"}]
    grown = [*client, *added]
    following = carry(carried, DIALECT, grown, new.fixed({}), new, limit=10_000)
    assert following is not None and following.ratio == 1.5
    assert following.sizes == tuple(new.message(m) for m in following.messages)
    assert following.tokens_out == new.fixed({}) + sum(following.sizes)
    at_old = old.fixed({}) + sum(carried.sizes) + sum(old.message(m) for m in added)
    assert at_old < following.tokens_out  # counted at 1.15 it looked smaller: not sent so
    limit = (at_old + following.tokens_out) // 2
    assert carry(carried, DIALECT, grown, new.fixed({}), new, limit=limit) is None
