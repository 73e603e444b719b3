"""evict's notice names one key, under which its record keeps every message it stands for — on
every wire API."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import brim.policies.evict
from brim.policies.clear import placeholder
from brim.policies.compress import DEFAULT_ORDER, build_policies, compress
from brim.policies.conversation import (
    Conversation,
    FidelityRecord,
    Goal,
    archive_key,
    text_tokens_for,
)
from brim.policies.evict import (
    GISTS_HEADER,
    IDS_LABEL,
    LAST_RESORT,
    NAMES_QUOTED,
    Evict,
    EvictSettings,
    _Dumped,
)
from brim.policies.facts import facts
from brim.policies.information import fitting
from brim.policies.text import NAMES_SEPARATOR, listed_names, pointer
from brim.policies.wires import WIRES
from brim.policies.wires.base import NOTICE_PREFIX
from tests.policies.test_compress import conversations
from tests.policies.test_information import BUILDERS, Builder, result_of
from tests.policies.test_policies import LOG

SHOWN = re.compile(r"; restorable as sha256:([0-9a-f]{16})\](?:\n|\Z)")
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


def evicted(
    wire: Builder, messages: Items, at_least: int | None = 0
) -> tuple[Conversation, list[FidelityRecord]]:
    before = wire.conversation(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=at_least)).apply(
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
    first, first_records = evicted(wire, session(wire), at_least=None)  # the budget's grid
    again, again_records = evicted(wire, copy.deepcopy(session(wire)), at_least=None)
    other, other_records = evicted(
        wire, session(wire, last="and the final question, worded otherwise"), at_least=None
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
    whose original holds the messages the notice says it stands for (an earlier notice of the
    request's among them, the messages that one stood for); the budget still holds. A notice
    the last resorts removed in turn (compress's second pass) is inside the new notice's
    original — or, where the new notice itself does not fit (a limit of 150 tokens), inside the
    record of the units released with it — and its own record keeps what it named."""
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
    assert len(notices) <= 1 and len(records) >= len(notices)
    for key, record in records.items():  # every notice is sent, or removed in turn: inside
        # a later notice's original, or a last resort's record where no notice fits at all
        assert record.original is not None
        assert any(key[:16] in text for text in notices) or any(
            key[:16] in (other.original or "") for other in outcome.records if other is not record
        )
    for notice in notices:
        shown = SHOWN.search(notice)
        assert shown is not None, notice
        (record,) = [r for key, r in records.items() if key and key.startswith(shown[1])]
        assert record.original is not None and archive_key(record.original) == record.archive_key
        removed = orjson.loads(record.original)
        # the client's messages it stands for: an earlier notice of this request's inside it
        # counts as the messages it said it stood for
        inner = [COUNT.search(dialect.text(m)) for m in removed]
        stands_for = sum(int(found[1]) if found else 1 for found in inner)
        assert stands_for == int(COUNT.search(notice)[1])  # type: ignore[index]
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

    monkeypatch.setattr(brim.policies.evict, "orjson", Counting())
    before = wire.conversation(session(wire))
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    evict = Evict(EvictSettings(keep_recent_turns=keep_recent_turns, evict_at_least=0))
    after, records = evict.apply(before, goal, wire.meter)
    units = [record for record in records if record.action == "evicted"]
    assert units and after.total <= goal.limit
    assert any(record.action == "notice" for record in records)
    last_resorts = [record for record in units if record.batch and record.batch[0] == LAST_RESORT]
    assert bool(last_resorts) == (keep_recent_turns == 30)
    # every unit evicted, and none twice (units tried and put back were dumped too)
    assert len(dumped) >= len(units)
    assert len({orjson.dumps(value) for value in dumped}) == len(dumped)


# ---------------------------------------------------------------- the notice's quoted lines


def planted_session(wire: Builder, turns: int = 8) -> Items:
    """Tool results of a templated log each with one line of its own: what it says once."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for n in range(turns):
        tool = "grep" if n % 2 else "read_file"
        log = LOG[:3000].split("\n")
        log.insert(len(log) // 2, f"NOTE module {n} keeps its secrets in vault path kv/mod{n}")
        messages += wire.turn(f"c{n}", tool, {"path": f"src/module_{n}.py"}, "\n".join(log))
        messages.append(wire.said(f"chatter {n} " * 40))
    messages.append(wire.user("final question"))
    return messages


def quoted_lines(notice: str) -> list[str]:
    _, header, lines = notice.partition("\n" + GISTS_HEADER + "\n")
    return lines.split("\n") if header else []


def removed_turns(records: list[FidelityRecord]) -> list[int]:
    """The turn numbers (`src/module_N.py`) of the tool groups evict removed, in order."""
    found = []
    for record in records:
        if record.action == "evicted" and record.detail == "tools":
            found += [int(n) for n in re.findall(r"module_(\d+)\.py", record.original or "")]
    return sorted(set(found))


def test_the_notice_quotes_each_removed_result_s_most_informative_line(wire: Builder) -> None:
    """Under its head, the notice quotes the line each removed tool result says once — in
    conversation order, one per result — and nothing of the results that stayed."""
    after, records = evicted(wire, planted_session(wire))
    notice = notice_of(after)
    gone = removed_turns(records)
    assert len(gone) >= 3
    assert SHOWN.search(notice.split("\n")[0]) is not None  # the head line names the key
    # The one name of the log its line does not hold, the date, is in the kept logs too: the
    # request carries it, so no line lists it.
    assert quoted_lines(notice) == [
        f"> {'grep' if n % 2 else 'read_file'}: NOTE module {n} keeps its secrets in vault path "
        f"kv/mod{n}"
        for n in gone
    ]


def test_an_evicted_result_is_quoted_with_the_names_it_printed(wire: Builder) -> None:
    """After its line, the notice lists the names a removed result printed that the line does
    not — the paths and ids a later turn reads next — in the order printed: with the notice's
    room to spare, every one of them."""
    listing = [f"src/pkg/module_{n}.py" for n in range(30)]
    lines = ["ERROR the build failed in the signer", *listing, "commit 9f3e2a1c7b"] + [
        "ok" for _ in range(200)
    ]
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn("c0", "bash", {"cmd": "make"}, "\n".join(lines))
    after, records = evicted_before_grep_turns(wire, messages, range(1, 4))
    assert any('"c0"' in (r.original or "") for r in records if r.action == "evicted")
    (line,) = [q for q in quoted_lines(notice_of(after)) if q.startswith("> bash:")]
    said, named = line.split(" · ", 1)
    assert said == "> bash: ERROR the build failed in the signer"
    assert listed_names(named.removeprefix("Names in it: ")) == [*listing, "9f3e2a1c7b"]
    assert "signer" not in named  # what the line says already is not listed again


def test_an_evicted_result_is_quoted_with_the_long_numbers_it_printed(wire: Builder) -> None:
    """A long number a removed result printed — the constant a later turn writes — is listed
    with its names; the line numbers of the file read that printed it are not."""
    rows = [f"{n:>6}\tsrc/pkg/module_{n}.py" for n in range(1000, 1030)]
    lines = ["ERROR the deadline was missed in the signer", *rows, "DEADLINE_MS = 48213"]
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn("c0", "read", {"p": "a"}, "\n".join([*lines, *["ok"] * 200]))
    after, records = evicted_before_grep_turns(wire, messages, range(1, 4))
    assert any('"c0"' in (r.original or "") for r in records if r.action == "evicted")
    (line,) = [q for q in quoted_lines(notice_of(after)) if q.startswith("> read:")]
    listed = listed_names(line.split(" · Names in it: ", 1)[1])
    assert "48213" in listed and "DEADLINE_MS" in listed and "src/pkg/module_1029.py" in listed
    assert not any(str(n) in listed for n in range(1000, 1030))


def test_the_notice_lists_the_ids_its_lines_have_no_room_for(wire: Builder) -> None:
    """Past the quoted lines, in `ids_share` of the budget of its own, the notice's last line
    lists the ids every removed result printed that no line lists — those of results too old
    to get a line included — in conversation order, none that the request carries anyway."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for n in range(6):
        printed = [f"NOTE module {n} is slow", f"TIMEOUT_MS = {48210 + n}", *["ok"] * 300]
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, "\n".join(printed))
    messages += wire.turn("last", "grep", {"p": "x"}, "config.py:3: TIMEOUT = 48211")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    one_line = "> read_file: NOTE module 5 is slow · Names in it: TIMEOUT_MS 48215"
    share = (wire.meter.text_tokens(one_line) + 2) / goal.limit  # room for one line, not two
    listing = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=1, gist_share=share))
    after, records = listing.apply(before, goal, wire.meter)
    assert after.total <= goal.target
    gone = sorted(n for n in range(6) if any(f'"c{n}"' in (r.original or "") for r in records))
    assert len(gone) >= 4
    *lines, ids = quoted_lines(notice_of(after))
    assert len(lines) == 1 and str(48210 + gone[-1]) in lines[0]
    assert ids == IDS_LABEL + NAMES_SEPARATOR.join(str(48210 + n) for n in gone[:-1] if n != 1)
    unlisted = Evict(
        EvictSettings(evict_at_least=0, keep_recent_turns=1, gist_share=share, ids_share=0)
    )
    assert quoted_lines(notice_of(unlisted.apply(before, goal, wire.meter)[0])) == lines


def listing_turns(wire: Builder, *listings: list[str]) -> tuple[Conversation, Goal]:
    """A session whose first turns each run `ls`, printing one of `listings` (and filler), then
    one more turn and a last question; the goal leaves room for the last two only."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for n, names in enumerate(listings):
        printed = [f"ERROR listing {n} is incomplete", *names, *["ok"] * 1000]
        messages += wire.turn(f"c{n}", "ls", {"p": n}, "\n".join(printed))
    messages += wire.turn("last", "grep", {"p": "x"}, "nothing found")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    return before, Goal(target=before.total // 3, limit=before.total // 2)


def names_on(line: str) -> list[str]:
    """The names a quoted `ls` line says: its gist (here the listing's first name), then those
    it lists."""
    said, _, listed = line.removeprefix("> ls: ").partition(" · Names in it: ")
    return [said, *listed_names(listed)]


def test_room_left_in_the_notice_lists_more_names_newest_first(wire: Builder) -> None:
    """Once every removed result has its line (each listing up to `NAMES_QUOTED` characters of
    names), the room left in the notice's share lists more of their names: the newest
    result's next ones first, the older result's only after all of those; where no room is
    left, each line stops at `NAMES_QUOTED`."""
    older = [f"src/old/module_{n}.py" for n in range(30)]
    newer = [f"src/new/module_{n}.py" for n in range(30)]
    before, goal = listing_turns(wire, older, newer)
    roomy = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=1, gist_share=0.5))
    after, records = roomy.apply(before, goal, wire.meter)
    removed = "".join(r.original or "" for r in records if r.action == "evicted")
    assert '"c0"' in removed and '"c1"' in removed
    old_line, new_line = quoted_lines(notice_of(after))
    assert names_on(old_line) == older and names_on(new_line) == newer

    # Room for the two lines as capped and a few names more: the newest result's names get it.
    first = [fitting(names[1:], NAMES_QUOTED - len("Names in it: ")) for names in (older, newer)]
    capped = [
        f"> ls: {names[0]} · Names in it: {NAMES_SEPARATOR.join(listed)}"
        for names, listed in zip((older, newer), first, strict=True)
    ]
    room = sum(wire.meter.text_tokens(line) + 1 for line in capped) + 30
    share = room / goal.limit
    tight = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=1, gist_share=share))
    after, _ = tight.apply(before, goal, wire.meter)
    old_line, new_line = quoted_lines(notice_of(after))
    assert old_line == capped[0]  # the room went to the newer result
    said = names_on(new_line)
    assert said == newer[: len(said)] and len(first[1]) + 1 < len(said) < len(newer)


def test_the_latest_removed_results_are_quoted_first_within_the_share(wire: Builder) -> None:
    """With room for two lines only, the two newest removed results are quoted, in order."""
    messages = planted_session(wire)
    before = wire.conversation(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    line = "> read_file: NOTE module 0 keeps its secrets in vault path kv/mod0"
    room = 2 * (wire.meter.text_tokens(line) + 1) + 1  # two lines, not three
    evict = Evict(EvictSettings(evict_at_least=0, gist_share=room / goal.limit))
    after, records = evict.apply(before, goal, wire.meter)
    gone = removed_turns(records)
    assert len(gone) >= 3
    quoted = quoted_lines(notice_of(after))
    assert [int(re.findall(r"module (\d+)", q)[0]) for q in quoted] == gone[-2:]


def test_no_quoted_lines_with_both_shares_zero(wire: Builder) -> None:
    """`gist_share` 0 leaves at most the ids line; with `ids_share` 0 too, the notice is
    bare."""
    before = wire.conversation(planted_session(wire))
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    ids_only = Evict(EvictSettings(evict_at_least=0, gist_share=0))
    quoted = quoted_lines(notice_of(ids_only.apply(before, goal, wire.meter)[0]))
    assert all(line.startswith(IDS_LABEL) for line in quoted)
    bare = Evict(EvictSettings(evict_at_least=0, gist_share=0, ids_share=0))
    notice = notice_of(bare.apply(before, goal, wire.meter)[0])
    assert GISTS_HEADER not in notice and SHOWN.search(notice) is not None


def test_over_the_limit_the_notice_quotes_the_newest_lines_that_fit(wire: Builder) -> None:
    """Where every unprotected unit is gone and the notice's quoted lines would take the request
    over its limit, only as many go as the limit demands: the notice quotes the newest removed
    results' lines that fit the room the bare notice leaves, no protected turn is released, and
    the request is within its limit."""
    before = wire.conversation(planted_session(wire))
    bare = Evict(EvictSettings(evict_at_least=0, gist_share=0, ids_share=0))
    everything, _ = bare.apply(before, Goal(target=1, limit=before.total), wire.meter)
    line = "> read_file: NOTE module 0 keeps its secrets in vault path kv/mod0"
    room = 3 * (wire.meter.text_tokens(line) + 1) + wire.meter.text_tokens(GISTS_HEADER) + 8
    goal = Goal(target=everything.total, limit=everything.total + room)
    quoting = Evict(EvictSettings(evict_at_least=0, gist_share=0.5))
    after, records = quoting.apply(before, goal, wire.meter)
    assert after.total <= goal.limit
    assert not any(r.batch and r.batch[0] == LAST_RESORT for r in records)
    gone = removed_turns(records)
    quoted = quoted_lines(notice_of(after))
    assert 1 <= len(quoted) < len(gone)
    assert [int(re.findall(r"module (\d+)", q)[0]) for q in quoted] == gone[-len(quoted) :]
    kept = [m for m in after.messages if not after.dialect.text(m).startswith(NOTICE_PREFIX)]
    assert kept == [m for m in everything.messages if m in kept]  # the same units kept
    assert len(kept) == len(everything.messages) - 1


def test_after_a_protected_turn_is_released_the_notice_quotes_what_fits(wire: Builder) -> None:
    """Where only releasing protected turns brings the request within its limit, the room that
    leaves under the limit holds the notice's quoted lines: the released results are quoted."""
    before = wire.conversation(planted_session(wire, turns=4))
    goal = Goal(target=before.total * 3 // 5, limit=before.total * 3 // 5)
    evict = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=30))
    after, records = evict.apply(before, goal, wire.meter)
    assert after.total <= goal.limit
    assert any(r.batch and r.batch[0] == LAST_RESORT for r in records)
    gone = removed_turns(records)
    quoted = quoted_lines(notice_of(after))
    assert gone and any(f"NOTE module {gone[-1]} " in line for line in quoted)


def over_the_limit(wire: Builder) -> tuple[Items, int]:
    """Thirty old results, each with a line of its own and twelve ids, then a recent turn that
    takes most of the limit returned: with every old result evicted, the notice's lines and ids
    line in their whole room would take the request over that limit, in three quarters of the
    lines' room they fit."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for n in range(30):
        jobs = [f"run {k}: JOB-{48000 + 100 * n + k}" for k in range(12)]
        printed = [f"NOTE module {n} is slow", *jobs, *["ok"] * 150]
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, "\n".join(printed))
    messages += wire.turn("last", "grep", {"p": "x"}, LOG[:12000])
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    bare = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2, gist_share=0, ids_share=0))
    everything, _ = bare.apply(before, Goal(target=1, limit=before.total), wire.meter)
    shares = EvictSettings().gist_share + EvictSettings().ids_share
    # the bare request and the whole notice (a quarter of the limit) are over it; with the
    # lines in three quarters of their room (a fifth of the limit in all), under it
    return messages, int((everything.total + 10) / (1 - shares + EvictSettings().gist_share / 4))


def test_over_the_limit_a_first_cut_keeps_its_ids_line_while_its_lines_shrink(
    wire: Builder,
) -> None:
    """Over the limit, a first cut (no room asked for later turns) keeps the ids line's whole
    room while the quoted lines go down by quarters; a re-cut of a session known to grow
    (`Goal.room`) halves both, and leaves the slack under the limit to its next turns."""
    messages, limit = over_the_limit(wire)
    before = wire.conversation(messages)
    evict = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2))
    first, records = evict.apply(before, Goal(target=1, limit=limit), wire.meter)
    recut, _ = evict.apply(before, Goal(target=1, limit=limit, room=limit // 10), wire.meter)
    assert not any(r.batch and r.batch[0] == LAST_RESORT for r in records)
    assert first.total <= limit and recut.total <= limit
    assert len(first.messages) == len(recut.messages)  # the same units removed
    *first_lines, first_ids = quoted_lines(notice_of(first))
    *recut_lines, recut_ids = quoted_lines(notice_of(recut))
    assert first_ids.startswith(IDS_LABEL) and recut_ids.startswith(IDS_LABEL)
    id_room = text_tokens_for(int(limit * EvictSettings().ids_share), wire.meter)
    assert wire.meter.text_tokens(first_ids) > id_room * 3 // 4  # its whole room
    assert wire.meter.text_tokens(recut_ids) <= id_room // 2  # half of it
    assert len(recut_lines) < len(first_lines)
    assert limit - recut.total > limit - first.total


def test_compress_gives_evict_the_room_a_growing_session_asks_for(wire: Builder) -> None:
    """`compress(room=…)` reaches evict: over the limit, a growing session's notice quotes
    less than a first cut's, and the request leaves more of the limit to the next turns."""
    messages, limit = over_the_limit(wire)
    dialect = WIRES[wire.api].dialect
    evict = [Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2))]
    first, recut = (
        compress(dialect, messages, 3, wire.meter, evict, limit=limit, low_water=0.85, room=room)
        for room in (0, limit // 10)
    )
    assert first.fits and recut.fits
    quoted = [
        quoted_lines(next(t for t in map(dialect.text, o.messages) if t.startswith(NOTICE_PREFIX)))
        for o in (first, recut)
    ]
    assert len(quoted[1]) < len(quoted[0])
    assert recut.tokens_out < first.tokens_out


def test_over_the_limit_with_no_room_for_the_whole_ids_line_both_shrink(wire: Builder) -> None:
    """Where even the ids line in its whole room does not fit beside the bare notice, a first
    cut's lines and ids line go down the ladder together: the notice still lists ids."""
    messages, limit = over_the_limit(wire)
    before = wire.conversation(messages)
    bare = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2, gist_share=0, ids_share=0))
    everything, _ = bare.apply(before, Goal(target=1, limit=limit), wire.meter)
    tight = everything.total + int(limit * EvictSettings().ids_share) // 3
    evict = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2))
    after, records = evict.apply(before, Goal(target=1, limit=tight), wire.meter)
    assert after.total <= tight
    assert not any(r.batch and r.batch[0] == LAST_RESORT for r in records)
    *_, ids = quoted_lines(notice_of(after))
    assert ids.startswith(IDS_LABEL) and "JOB-" in ids


def test_a_notice_the_last_resorts_release_goes_into_the_new_one_whole(wire: Builder) -> None:
    """Where compress's first pass evicts every older turn and is still over the limit, its last
    resorts release the recent turns and the first pass's notice with them: the one notice sent
    counts every client message that went, and quotes the lines of the first pass's results
    too, not only of the turns released."""
    messages = planted_session(wire)
    before = wire.conversation(messages)
    evict = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=4))
    first_pass, _ = evict.apply(
        before, Goal(target=1, limit=before.total, reversible_only=True), wire.meter
    )
    limit = first_pass.total - 300  # over, with every older turn gone
    dialect = WIRES[wire.api].dialect
    outcome = compress(dialect, messages, 3, wire.meter, [evict], limit=limit, low_water=0.85)
    assert outcome.fits
    released = [r for r in outcome.records if r.batch and r.batch[0] == LAST_RESORT]
    assert any(r.detail == "tools" for r in released)
    (notice,) = [t for t in map(dialect.text, outcome.messages) if t.startswith(NOTICE_PREFIX)]
    gone = [m for m in messages if m not in outcome.messages]
    assert int(COUNT.search(notice)[1]) == len(gone)  # type: ignore[index]
    quoted = " ".join(quoted_lines(notice))
    modules = {int(n) for n in re.findall(r"NOTE module (\d+) ", quoted)}
    assert modules & {0, 1, 2}, notice  # the first pass's oldest results are quoted too
    assert len(modules) > 2


def evicted_before_grep_turns(
    wire: Builder, messages: list[Any], turns: range
) -> tuple[Conversation, list[FidelityRecord]]:
    """`messages`, then large grep turns numbered `turns` and a last question, cut by evict to
    three quarters of their size, only the last turn kept as recent."""
    for n in turns:
        messages += wire.turn(f"c{n}", "grep", {"p": n}, f"turn {n}\n{LOG[:3000]}")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    goal = Goal(target=1, limit=before.total * 3 // 4)  # every unit that may go
    return Evict(EvictSettings(evict_at_least=0, keep_recent_turns=1)).apply(
        before, goal, wire.meter
    )


def test_a_cleared_result_is_quoted_by_the_line_its_placeholder_quotes(wire: Builder) -> None:
    """A result clear replaced earlier says in the notice what its placeholder said (its quoted
    line and the names it listed); a result
    pointed onward (no line of its own) says nothing; a line said twice is quoted once."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn(
        "c0", "read_file", {"p": "a"}, placeholder("read_file", 900, "ab" * 32, ["the one line"])
    )
    messages += wire.turn("c1", "grep", {"p": "b"}, "[brim: same content as the grep result c3]")
    messages += wire.turn(
        "c2", "read_file", {"p": "c"}, placeholder("read_file", 900, "cd" * 32, ["the one line"])
    )
    named = placeholder("git", 700, "ef" * 32, ["fix the signer"], ["a1b2c3d", "src/signer.py"])
    messages += wire.turn("c2b", "git", {"p": "log"}, named)
    after, records = evicted_before_grep_turns(wire, messages, range(3, 6))
    evicted_calls = "".join(r.original or "" for r in records if r.action == "evicted")
    assert all(f'"c{n}"' in evicted_calls for n in range(3))
    quoted = quoted_lines(notice_of(after))
    assert quoted.count("> read_file: the one line") == 1
    assert not any(q.startswith("> grep: [brim") for q in quoted)
    # …and with the names its placeholder listed, on the same line
    assert "> git: fix the signer · Names in it: a1b2c3d src/signer.py" in quoted


def test_a_cleared_result_is_quoted_with_the_names_its_placeholder_lists(wire: Builder) -> None:
    """A result cleared before lists in the notice the names its placeholder listed, in that
    order: the first up to `NAMES_QUOTED` characters, and with room to spare in the notice the
    rest (`test_room_left_in_the_notice_lists_more_names_newest_first`: without it, those
    first alone); a name longer than the cap on its own only from that room."""
    many = [f"src/pkg/module_{n}.py" for n in range(40)]
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn(
        "c0", "ls", {"p": "."}, placeholder("ls", 900, "ab" * 32, ["a listing"], many)
    )
    after, _ = evicted_before_grep_turns(wire, messages, range(1, 4))
    (line,) = [q for q in quoted_lines(notice_of(after)) if q.startswith("> ls:")]
    assert line == "> ls: a listing · Names in it: " + NAMES_SEPARATOR.join(many)

    long = "src/" + "deeply_nested_package/" * 5 + "module.py"
    assert len(long) > NAMES_QUOTED
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn(
        "c0", "ls", {"p": "."}, placeholder("ls", 900, "ab" * 32, ["a listing"], [long])
    )
    after, _ = evicted_before_grep_turns(wire, messages, range(1, 4))
    assert f"> ls: a listing · Names in it: {long}" in quoted_lines(notice_of(after))


def test_a_name_a_newer_line_listed_is_not_listed_again(wire: Builder) -> None:
    """Two removed results that print the same paths: the newer one's line lists them, the
    older one's lists the names only it printed — its room goes to what is new."""
    shared = [f"src/pkg/shared_{n}.py" for n in range(6)]
    own = [f"tests/test_only_{n}.py" for n in range(3)]
    older = ["ERROR one", *shared, *own] + ["ok"] * 100
    newer = ["ERROR two", *shared] + ["ok"] * 100
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn("c0", "bash", {"cmd": "a"}, "\n".join(older))
    messages += wire.turn("c1", "bash", {"cmd": "b"}, "\n".join(newer))
    after, records = evicted_before_grep_turns(wire, messages, range(2, 5))
    evicted_calls = "".join(r.original or "" for r in records if r.action == "evicted")
    assert '"c0"' in evicted_calls and '"c1"' in evicted_calls
    older_line, newer_line = [q for q in quoted_lines(notice_of(after)) if q.startswith("> bash")]
    said, _, listed = newer_line.partition(" · Names in it: ")
    assert {*listed_names(listed), said.removeprefix("> bash: ")} >= set(shared)
    assert listed_names(older_line.partition(" · Names in it: ")[2]) == own


def test_a_name_the_request_still_carries_is_not_listed(wire: Builder) -> None:
    """A removed result's line lists only names the kept messages do not carry: a path the
    newest result prints again is in front of the model already."""
    listing = [f"src/pkg/module_{n}.py" for n in range(4)]
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn(
        "c0", "bash", {"cmd": "ls"}, "\n".join(["ERROR the build failed", *listing, *["ok"] * 200])
    )
    for n in range(1, 4):
        messages += wire.turn(f"c{n}", "grep", {"p": n}, f"turn {n}\n{LOG[:3000]}")
    messages += wire.turn("c4", "grep", {"p": "alpha"}, f"{listing[1]}:12: def alpha():")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    goal = Goal(target=1, limit=before.total * 3 // 4)  # every unit that may go
    evict = Evict(EvictSettings(evict_at_least=0, keep_recent_turns=2))
    after, records = evict.apply(before, goal, wire.meter)
    assert any('"c0"' in (r.original or "") for r in records if r.action == "evicted")
    assert result_of(after, "c4") == f"{listing[1]}:12: def alpha():"
    (line,) = [q for q in quoted_lines(notice_of(after)) if q.startswith("> bash:")]
    said, _, listed = line.partition(" · Names in it: ")
    expected = [name for name in listing if name != listing[1] and name not in said]
    assert len(expected) >= 2 and listed_names(listed) == expected
    assert listing[1] not in line


def test_the_quoted_lines_go_before_any_protected_turn(wire: Builder) -> None:
    """Where the request fits its limit only once every unprotected unit is gone and the notice
    is bare, the notice drops its quoted lines rather than release a protected turn."""
    before = wire.conversation(planted_session(wire))
    bare = Evict(EvictSettings(evict_at_least=0, gist_share=0, ids_share=0))
    everything, _ = bare.apply(before, Goal(target=1, limit=before.total), wire.meter)
    goal = Goal(target=everything.total, limit=everything.total)
    quoting = Evict(EvictSettings(evict_at_least=0, gist_share=0.5))
    after, records = quoting.apply(before, goal, wire.meter)
    assert after.total <= goal.limit
    assert not any(r.batch and r.batch[0] == LAST_RESORT for r in records)
    assert after.messages == everything.messages  # the bare notice, the same units kept
    # With room for them, the same cut quotes lines: they were dropped for the limit.
    roomy, _ = quoting.apply(before, Goal(target=1, limit=before.total), wire.meter)
    assert GISTS_HEADER in notice_of(roomy)


# ---------------------------------------------------------------- how far the cut goes


def test_the_units_removed_before_a_long_one_go_back_where_it_made_room(wire: Builder) -> None:
    """Where the batch ends on a long tool result that saves far more than was still needed,
    the units removed before it go back where the request has room for them under the target:
    only the long one goes."""

    def session(turns: list[int]) -> Items:
        messages = [*LEADING.get(wire.api, []), wire.user("first task")]
        for n in turns:
            lines = LOG.split("\n")[40 * n : 40 * n + (400 if n == 4 else 25)]
            body = "\n".join(f"module {n}: {line}" for line in lines)
            messages += wire.turn(f"c{n}", "read_file", {"p": f"src/module_{n}.py"}, body)
        return [*messages, wire.user("final question")]

    before = wire.conversation(session(list(range(8))))
    short = before.total - wire.conversation(session(list(range(1, 8)))).total
    target = before.total - 4 * short - 200  # more than the four short turns before the long one
    goal = Goal(target=target, limit=target + target // 5)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(
        before, goal, wire.meter
    )
    assert removed_turns(records) == [4]
    assert after.total <= goal.target


def test_an_older_copy_goes_back_only_with_the_result_it_points_to(wire: Builder) -> None:
    """Units go back where a long one made room, but never an older copy pointed onward to a
    result that stays out: a pointer never names a result that is gone."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    messages += wire.turn("c0", "grep", {"p": "x"}, pointer("grep", "c3", "ab" * 32))
    for n in (1, 2):
        lines = LOG.split("\n")[40 * n : 40 * n + 25]
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, "\n".join(lines))
    messages += wire.turn("c3", "grep", {"p": "x"}, "\n".join(LOG.split("\n")[100:400]))
    for n in (4, 5):
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, f"module {n}")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    goal = Goal(target=before.total * 2 // 3, limit=before.total * 3 // 4)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(
        before, goal, wire.meter
    )
    gone = "".join(r.original or "" for r in records if r.action == "evicted")
    assert '"c3"' in gone and '"c0"' in gone
    assert '"c1"' not in gone and '"c2"' not in gone  # those went back
    assert after.total <= goal.target


def test_past_the_newest_results_the_ids_line_lists_the_cheapest_ids_first(wire: Builder) -> None:
    """The ids line gives a quarter of its room (`NEWEST_IDS_SHARE`) to the newest removed
    results' ids, in the order printed, and the rest to the cheapest ids of all the others: an
    older result's bare numbers (three tokens each) before newer results' long versioned paths
    (a dozen), so a long session's older results keep their ids rather than the newest few
    filling the line. (Newest first alone, facts kept at 5–10× were 26.9 % in bench.fidelity's
    default run; 74.2 % with the cheapest first, 2026-12-07.)"""
    numbers = {n: [str(51000 + 100 * n + k) for k in range(25)] for n in range(4)}
    paths = {
        n: [f"dist/releases/build_{7000 + 10 * n + k}/pkg-{n}.{k}.tar.gz" for k in range(8)]
        for n in range(4)
    }
    results = {  # older: each prints 25 bare numbers; newer: 8 long paths with a number in them
        **{
            f"old{n}": [f"row {k}: total {x}" for k, x in enumerate(xs)]
            for n, xs in numbers.items()
        },
        **{f"new{n}": [f"wrote {path}" for path in printed] for n, printed in paths.items()},
    }
    _, ids, records = ids_line_of(wire, results, 200, ids_share=0.15)
    gone = "".join(record.original or "" for record in records if record.action == "evicted")
    newest = max(n for n in paths if f'"new{n}"' in gone)  # the newest removed result
    listed = listed_names(ids.removeprefix(IDS_LABEL))
    own = [name for name in listed if name in paths[newest]]  # the newest's first, in order
    assert len(own) >= 3 and own == paths[newest][1 : len(own) + 1]  # (the first: its gist's)
    # then bare numbers, the newer result's first among equals
    cheapest = [name for n in sorted(numbers, reverse=True) for name in numbers[n][1:]]
    older = [name for name in listed if name in cheapest]
    assert len(older) >= 50 and set(older) == set(cheapest[: len(older)])
    assert not {path for n in paths if n != newest for path in paths[n]} & set(listed)


def ids_line_of(
    wire: Builder, results: Mapping[str, list[str]], padding: int, ids_share: float = 0.05
) -> tuple[Goal, str, list[FidelityRecord]]:
    """The ids line of evict's notice (in `ids_share` of the budget, no quoted lines) where
    `results` (each call's rows, then `padding` lines of "ok"), in order, are removed to a
    quarter of the request; the goal, and evict's records."""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    for call, rows in results.items():
        messages += wire.turn(call, "bash", {"p": call}, "\n".join([*rows, *["ok"] * padding]))
    messages += wire.turn("last", "grep", {"p": "x"}, "nothing found")
    messages.append(wire.user("final question"))
    before = wire.conversation(messages)
    goal = Goal(target=before.total // 4, limit=before.total // 3)
    settings = EvictSettings(
        evict_at_least=0, keep_recent_turns=1, gist_share=0, ids_share=ids_share
    )
    after, records = Evict(settings).apply(before, goal, wire.meter)
    assert after.total <= goal.target
    *_, ids = quoted_lines(notice_of(after))
    return goal, ids, records


def test_ids_that_share_a_path_are_listed_under_it_once(wire: Builder) -> None:
    """Ids that share everything up to their last `/` (a project's pull-request links, one
    directory's files) are written as the shell writes them, `…/pull/{2385,2390}`: the shared
    part once, so the line holds more of them than written whole (a link costs a dozen tokens,
    its number three). Ranked as before: by their whole size."""
    links = {
        n: [f"https://github.com/acme/widgets/pull/{230000 + 100 * n + k}" for k in range(30)]
        for n in range(5)
    }
    rows = {
        f"c{n}": [f"* fixed the parser in {link}" for link in each] for n, each in links.items()
    }
    _, ids, _ = ids_line_of(wire, rows, 200)
    written = ids.removeprefix(IDS_LABEL).split(NAMES_SEPARATOR)
    head = "github.com/acme/widgets/pull/"  # as an id: without its scheme
    (group,) = [name for name in written if name.startswith(head + "{")]
    numbers = group.removeprefix(head + "{").removesuffix("}").split(",")
    printed = {link.rsplit("/", 1)[1] for each in links.values() for link in each}
    assert len(numbers) == len(set(numbers)) and set(numbers) <= printed
    assert not any(name.startswith(head) and name != group for name in written)
    whole = sum(wire.meter.text_tokens(NAMES_SEPARATOR + head + number) for number in numbers)
    assert wire.meter.text_tokens(ids) < whole * 0.6  # whole, the same ids would take far more
    assert set(listed_names(ids.removeprefix(IDS_LABEL))) == {head + n for n in numbers}


def test_ids_under_paths_of_their_own_fill_the_line_as_written_whole(wire: Builder) -> None:
    """Writing ids under a shared path only ever adds ids: the braces are charged to a path's
    second id, never its first, so where no two ids share a path (a build's artifacts, each in
    a directory of its own) the line lists as many as fit written whole, its room used up to
    less than one id. (Charged to every path's first id, fewer fit where paths are distinct:
    held-out facts at 5–10× 72.4 → 67.9 %, bench.fidelity, 2026-12-07.)"""
    paths = {
        n: [f"dist/build_{7000 + 40 * n + k}/pkg-{n}.{k}.tar.gz" for k in range(40)]
        for n in range(5)
    }
    rows = {f"c{n}": [f"wrote {path}" for path in each] for n, each in paths.items()}
    goal, ids, _ = ids_line_of(wire, rows, 400)
    written = listed_names(ids.removeprefix(IDS_LABEL))
    every = {path for printed in paths.values() for path in printed}
    assert set(written) <= every and len(written) < len(every)  # no braces; not room for all
    room = int(goal.limit * 0.05)  # `ids_share`
    largest = max(wire.meter.text_tokens(NAMES_SEPARATOR + path) for path in every)
    assert room - largest < wire.meter.text_tokens(ids) <= room


def test_beside_a_newest_turn_over_the_budget_the_notice_keeps_its_ids(wire: Builder) -> None:
    """Where the newest turn alone takes more than the budget (a whole long file read last),
    evict removes every older turn and truncate cuts the newest: the notice still lists the
    ids the older results printed, in its own share, and truncate cuts the newest turn rather
    than brim's notice — the one trace of those results. (The notice was bare, and a Claude Code
    session cut to 5× kept none of the 12 facts its older results held.)"""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    printed = {n: [f"TIMEOUT_{k}_MS = {48000 + 100 * n + k}" for k in range(30)] for n in range(6)}
    for n, lines in printed.items():
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, "\n".join([*lines, *["ok"] * 200]))
    messages += wire.turn("last", "read_file", {"p": "big"}, LOG * 2)
    dialect = WIRES[wire.api].dialect
    limit = wire.conversation(messages[-2:]).total * 2 // 3  # the newest turn alone is over it
    policies = build_policies(["evict", "truncate"], {})
    out = compress(dialect, messages, 3, wire.meter, policies, limit=limit, low_water=0.85)
    assert out.fits and out.tokens_out <= limit
    after = wire.conversation(list(out.messages))
    notice = notice_of(after)
    *_, ids = quoted_lines(notice)
    listed = listed_names(ids.removeprefix(IDS_LABEL))
    assert wire.meter.text_tokens(ids) > 300  # more than truncate leaves of a message it cuts
    newest = {line.split(" = ")[1] for line in printed[5]}  # the newest removed result's first
    assert len(newest & set(listed)) >= 29
    assert "tokens cut from the middle by brim" in result_of(after, "last")
    assert "tokens cut from the middle by brim" not in notice


def test_beside_recent_turns_over_the_budget_the_notice_keeps_its_ids(wire: Builder) -> None:
    """Where the recent turns evict keeps are over the budget together (though the newest fits),
    compress's reversible pass ends over it and its last resorts digest those results: the
    notice the reversible pass wrote keeps its ids line, and the digests make room for it.
    (It was bare: a Codex session on flask cut to 5× kept none of the 7 facts of its older
    results; with the ids line, 4.)"""
    messages = [*LEADING.get(wire.api, []), wire.user("first task")]
    printed = {n: [f"TIMEOUT_{k}_MS = {48000 + 100 * n + k}" for k in range(5)] for n in range(6)}
    for n, lines in printed.items():
        messages += wire.turn(f"c{n}", "read_file", {"p": n}, "\n".join([*lines, *["ok"] * 200]))
    messages += wire.turn("r1", "read_file", {"p": "log1"}, LOG)
    messages += wire.turn("r2", "read_file", {"p": "log2"}, LOG.replace("INFO", "DEBUG"))
    dialect = WIRES[wire.api].dialect
    newest = wire.conversation(messages[-2:]).total
    limit = newest * 3 // 2  # the newest fits; the last two turns together do not
    settings = {"evict": EvictSettings(keep_recent_turns=4)}
    policies = build_policies(["prune_tool_results", "evict", "truncate"], settings)
    out = compress(dialect, messages, 3, wire.meter, policies, limit=limit, low_water=0.85)
    assert out.fits and out.tokens_out <= limit
    after = wire.conversation(list(out.messages))
    *_, ids = quoted_lines(notice_of(after))
    listed = listed_names(ids.removeprefix(IDS_LABEL))
    # c0 to c3 went (c4 and c5 are among the recent turns kept); each one's first line is its
    # gist, whose ids the ids line leaves out
    assert all(str(48000 + 100 * n + k) in listed for n in range(4) for k in range(1, 5))
