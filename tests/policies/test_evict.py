"""evict's notice names one key, under which its record keeps every message it stands for."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies.compress import DEFAULT_ORDER, build_policies, compress
from policies.conversation import Conversation, FidelityRecord, Goal, archive_key
from policies.evict import Evict, EvictSettings
from policies.wires.base import NOTICE_PREFIX
from tests.policies.test_compress import conversations
from tests.policies.test_policies import LOG, METER, D, conv, tool_turn

SHOWN = re.compile(r"; restorable as sha256:([0-9a-f]{16})\]\Z")
COUNT = re.compile(r"\[brim removed (\d+) earlier messages")


def session(last: str = "final question") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first task"},
    ]
    for n in range(8):
        messages += tool_turn(n, f"turn {n}\n{LOG[:3000]}", name="grep" if n % 2 else "read_file")
        messages.append({"role": "assistant", "content": f"chatter {n} " * 40})
        if n == 3:
            messages.append({"role": "user", "content": "please also look at the tests"})
    messages.append({"role": "user", "content": last})
    return messages


def evicted(messages: list[dict[str, Any]]) -> tuple[Conversation, list[FidelityRecord]]:
    before = conv(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(
        before, goal, METER
    )
    assert after.total <= goal.target  # the key costs tokens: the goal still holds
    return after, records


def notice_of(after: Conversation) -> str:
    (notice,) = [D.text(m) for m in after.messages if D.text(m).startswith(NOTICE_PREFIX)]
    return notice


def test_the_notice_names_one_key_that_restores_every_message_it_stands_for() -> None:
    messages = session()
    after, records = evicted(messages)
    notice = notice_of(after)
    shown = SHOWN.search(notice)
    assert shown is not None, notice
    assert notice.count("sha256:") == 1  # one key, not one per removed unit
    (record,) = [r for r in records if r.action == "notice"]
    assert record.archive_key is not None and record.original is not None
    assert record.archive_key == archive_key(record.original)  # the store's rule: sha256 of it
    assert shown[1] == record.archive_key[:16]
    # The original: the removed messages, in order, as JSON (as each unit's own record has its).
    removed = [m for m in messages if not any(m is kept for kept in after.messages)]
    assert len(removed) == int(COUNT.search(notice)[1])  # type: ignore[index]
    assert orjson.loads(record.original) == removed
    units = [r for r in records if r.action == "evicted"]
    assert (
        record.original
        == orjson.dumps([m for r in units for m in orjson.loads(r.original or "[]")]).decode()
    )


def test_the_same_removed_messages_give_the_same_notice_bytes() -> None:
    """The notice is a function of the removed messages alone: the same history twice (other
    objects), or with a different last turn that leaves the same set removed, gives the very
    same bytes, key included — the request prefix stays put from turn to turn."""
    first, first_records = evicted(session())
    again, again_records = evicted(copy.deepcopy(session()))
    other, other_records = evicted(session(last="and the final question, worded otherwise"))
    gone = [r.index for r in first_records if r.action == "evicted"]
    assert gone == [r.index for r in other_records if r.action == "evicted"]  # the same set
    assert SHOWN.search(notice_of(first)) is not None
    assert notice_of(first) == notice_of(again) == notice_of(other)
    keys = [r.archive_key for r in first_records]
    assert keys == [r.archive_key for r in again_records] == [r.archive_key for r in other_records]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=conversations(), limit=st.integers(150, 12_000))
def test_every_notice_names_the_key_of_what_it_removed(
    messages: list[dict[str, Any]], limit: int
) -> None:
    """Over generated conversations and the default policies: each notice's key is its record's,
    whose original holds as many messages as the notice says; the budget still holds."""
    outcome = compress(
        D, messages, 3, METER, build_policies(DEFAULT_ORDER, {}), limit=limit, low_water=0.85
    )
    texts = [str(m.get("content", "")) for m in outcome.messages]
    notices = [text for text in texts if text.startswith(NOTICE_PREFIX)]
    records = {r.archive_key: r for r in outcome.records if r.action == "notice"}
    event("a notice" if notices else "no notice")
    assert len(notices) == len(records) <= 1
    for notice in notices:
        shown = SHOWN.search(notice)
        assert shown is not None, notice
        (record,) = [r for key, r in records.items() if key and key.startswith(shown[1])]
        assert record.original is not None and archive_key(record.original) == record.archive_key
        removed = orjson.loads(record.original)
        assert len(removed) == int(COUNT.search(notice)[1])  # type: ignore[index]
    if outcome.fits:
        assert outcome.tokens_out <= limit
