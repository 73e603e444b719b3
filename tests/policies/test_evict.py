"""evict's notice names one key, under which its record keeps every message it stands for — on
every wire API."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import policies.evict
from policies.compress import DEFAULT_ORDER, build_policies, compress
from policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    archive_key,
    facts,
)
from policies.evict import LAST_RESORT, Evict, EvictSettings, _Dumped
from policies.wires import WIRES
from policies.wires.base import NOTICE_PREFIX
from tests.policies.test_compress import conversations
from tests.policies.test_information import BUILDERS, Builder
from tests.policies.test_policies import LOG

SHOWN = re.compile(r"; restorable as sha256:([0-9a-f]{16})\]\Z")
COUNT = re.compile(r"\[brim removed (\d+) earlier messages")
Items = list[dict[str, Any]]
# The system prompt, where a wire API keeps it among the items (the others, in the body).
LEADING: dict[str, Items] = {
    "openai.chat": [{"role": "system", "content": "sys"}],
    "openai.responses": [{"type": "message", "role": "developer", "content": "sys"}],
}


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> Builder:
    return BUILDERS[request.param]


def session(wire: Builder, last: str = "final question") -> Items:
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for n in range(8):
        tool = "grep" if n % 2 else "read_file"
        messages += wire.turn(
            f"c{n}", tool, {"path": f"src/module_{n}.py"}, f"turn {n}\n{LOG[:3000]}"
        )
        messages.append(wire.said(f"chatter {n} " * 40))
        if n == 3:
            messages.append(wire.user("please also look at the tests"))
    messages.append(wire.user(last))
    return messages


def evicted(wire: Builder, messages: Items) -> tuple[Conversation, list[FidelityRecord]]:
    before = wire.conversation(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(
        before, goal, wire.meter
    )
    assert after.total <= goal.target  # the key costs tokens: the goal still holds
    return after, records


def notice_of(after: Conversation) -> str:
    texts = [after.dialect.text(m) for m in after.messages]
    (notice,) = [text for text in texts if text.startswith(NOTICE_PREFIX)]
    return notice


def test_the_notice_names_one_key_that_restores_every_message_it_stands_for(
    wire: Builder,
) -> None:
    messages = session(wire)
    after, records = evicted(wire, messages)
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


def test_the_same_removed_messages_give_the_same_notice_bytes(wire: Builder) -> None:
    """The notice is a function of the removed messages alone: the same history twice (other
    objects), or with a different last turn that leaves the same set removed, gives the very
    same bytes, key included — the request prefix stays put from turn to turn."""
    first, first_records = evicted(wire, session(wire))
    again, again_records = evicted(wire, copy.deepcopy(session(wire)))
    other, other_records = evicted(
        wire, session(wire, last="and the final question, worded otherwise")
    )
    gone = [r.index for r in first_records if r.action == "evicted"]
    assert gone == [r.index for r in other_records if r.action == "evicted"]  # the same set
    assert SHOWN.search(notice_of(first)) is not None
    assert notice_of(first) == notice_of(again) == notice_of(other)
    keys = [r.archive_key for r in first_records]
    assert keys == [r.archive_key for r in again_records] == [r.archive_key for r in other_records]


@st.composite
def built(draw: Any, wire: Builder) -> Items:
    """A conversation in `wire`'s shape: requests, replies, tool turns of one to three calls
    with results of every size, pasted logs."""
    words = st.lists(st.sampled_from(["alpha", "error", "42", "{", "é", "東京", "\n"]), max_size=40)
    text = words.map(" ".join)
    items = [*LEADING.get(wire.api, []), wire.user(draw(text) or "go")]
    for turn in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["user", "said", "tools", "tools", "giant"]))
        if kind == "user":
            items.append(wire.user(draw(text) or "go"))
        elif kind == "said":
            items.append(wire.said(draw(text) or "ok"))
        elif kind == "giant":
            items.append(wire.user("giant paste line\n" * draw(st.integers(500, 3000))))
        else:
            calls = []
            for n in range(draw(st.integers(1, 3))):
                size = draw(st.sampled_from([0, 50, 400, 3000]))
                result = "\n".join(f"log line {i}: " + "value " * 5 for i in range(size // 10))
                tool = draw(st.sampled_from(["read_file", "grep", "bash"]))
                calls.append((f"call_{turn}_{n}", tool, {"n": turn}, result))
            items += wire.turns(calls)
    items.append(wire.user("And now the final question?"))
    return items


@pytest.mark.parametrize("api", sorted(WIRES))
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), limit=st.integers(150, 12_000))
def test_every_notice_names_the_key_of_what_it_removed(
    api: str, data: st.DataObject, limit: int
) -> None:
    """Over generated conversations and the default policies: each notice's key is its record's,
    whose original holds as many messages as the notice says; the budget still holds."""
    wire = BUILDERS[api]
    # Chat Completions' conversations are the richest (images, orphans, reasoning, developer).
    made = conversations() if wire.api == "openai.chat" else built(wire)
    messages = data.draw(made, label="messages")
    dialect = WIRES[wire.api].dialect
    outcome = compress(
        dialect,
        messages,
        3,
        wire.meter,
        build_policies(DEFAULT_ORDER, {}),
        limit=limit,
        low_water=0.85,
    )
    texts = [dialect.text(m) for m in outcome.messages]
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


@pytest.mark.parametrize("api", sorted(WIRES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_removed_json_is_the_units_own_joined_byte_for_byte(
    api: str, data: st.DataObject
) -> None:
    """evict dumps each unit once and joins the pieces for the notice: the same bytes as one
    dump of all the removed messages, in order, so the same key; and a unit's record keeps
    the dump of its own messages."""
    wire = BUILDERS[api]
    messages = data.draw(conversations() if api == "openai.chat" else built(wire))
    conversation = wire.conversation(messages)
    units = facts(conversation).units
    removed = data.draw(st.lists(st.sampled_from(units), unique=True), label="removed")
    dumped = _Dumped(conversation)
    ordered = sorted(removed, key=lambda unit: unit.start)
    every = [conversation.messages[i] for unit in ordered for i in unit.indices]
    assert dumped.removed(removed) == orjson.dumps(every).decode()
    for unit in removed:
        unit_messages = [conversation.messages[i] for i in unit.indices]
        assert dumped.unit(unit) == orjson.dumps(unit_messages).decode()


@pytest.mark.parametrize("keep_recent_turns", [2, 30])  # 30: the last resorts too
def test_each_removed_unit_is_dumped_once(
    wire: Builder, keep_recent_turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many removed sets are tried (the notice's size is known only once it is
    written; last resorts go one by one), each unit's messages are serialised once."""
    dumped: list[Any] = []

    class Counting:
        """`orjson` as evict sees it, counting what it dumps."""

        def __getattr__(self, name: str) -> Any:
            return getattr(orjson, name)

        @staticmethod
        def dumps(value: Any, *args: Any, **kwargs: Any) -> bytes:
            dumped.append(value)
            return orjson.dumps(value, *args, **kwargs)

    monkeypatch.setattr(policies.evict, "orjson", Counting())
    before = wire.conversation(session(wire))
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    evict = Evict(EvictSettings(keep_recent_turns=keep_recent_turns, evict_at_least=0))
    after, records = evict.apply(before, goal, wire.meter)
    units = [record for record in records if record.action == "evicted"]
    assert units and after.total <= goal.limit
    assert any(record.action == "notice" for record in records)
    last_resorts = [record for record in units if record.batch and record.batch[0] == LAST_RESORT]
    assert bool(last_resorts) == (keep_recent_turns == 30)
    assert len(dumped) == len(units)
