"""truncate's marker names the key of the whole text it cut, which its record keeps; the cut
still stays within the budget — on every wire API."""

from __future__ import annotations

import copy
import dataclasses
import random
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from brim.policies.conversation import Conversation, Goal, archive_key
from brim.policies.evict import GISTS_HEADER, IDS_LABEL
from brim.policies.text import NAMES_LABEL, NAMES_SEPARATOR, listed_names
from brim.policies.tokens import CounterMeter
from brim.policies.truncate import Truncate
from brim.policies.wires import WIRES
from brim.policies.wires.base import NOTICE_PREFIX
from tests.policies.test_digest import read_output
from tests.policies.test_evict import LEADING
from tests.policies.test_information import BUILDERS, COUNTER, Builder, result_of
from tests.policies.test_policies import LOG

SHOWN = re.compile(
    r"\n\[… \d+ tokens cut from the middle by brim; the whole is sha256:([0-9a-f]{16}) …\]\n"
)


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> Builder:
    return BUILDERS[request.param]


@pytest.mark.parametrize("api", sorted(WIRES))
def test_the_marker_names_the_key_of_the_whole_text_its_record_keeps(api: str) -> None:
    wire = BUILDERS[api]
    messages = [
        *LEADING.get(wire.api, []),
        wire.user("why?"),
        *wire.turn("c1", "read_file", {"path": "a.log"}, LOG),
        *wire.turn("c2", "read_file", {"path": "b.log"}, "ok"),
    ]
    before = wire.conversation(messages)
    after, records = Truncate().apply(before, Goal(target=1_000, limit=1_000), wire.meter)
    assert after.total <= 1_000  # the key costs tokens: the budget still holds
    cut = result_of(after, "c1")
    (shown,) = SHOWN.findall(cut)  # one marker, one key
    (record,) = records
    assert record.original == LOG  # the whole text, not only what went
    assert record.archive_key == archive_key(LOG) and shown == record.archive_key[:16]
    assert record.detail == "tool_result:c1"
    assert cut.startswith(LOG[:40]) and cut.endswith(LOG[-40:])


def source_file(lines: int, deadline_at: int) -> str:
    """A module as a Read prints it: one `value_N = compute_N(row)` line each, and one
    constant with a long number (`DEADLINE = 482913`) at `deadline_at`."""
    rows = [f"{n:6}\t    value_{n} = compute_{n}(row)" for n in range(1, lines + 1)]
    rows[deadline_at] = f"{deadline_at + 1:6}\t    DEADLINE = 482913  # the one id it prints"
    return "\n".join(rows)


LISTED = re.compile(rf"…\]\n{re.escape(NAMES_LABEL)}(.*)\n")


@pytest.mark.parametrize("api", sorted(WIRES))
def test_the_marker_lists_the_names_of_what_went(api: str) -> None:
    """A file cut in the middle says which names went with its middle, as a cleared result's
    placeholder does: its one id among them (a planted number in a 22 K-token Read, the
    newest turn, alone over the budget, was lost with the middle), none that head or tail
    still shows, none it did not print — and the request still fits its budget."""
    wire = BUILDERS[api]
    text = source_file(600, deadline_at=300)
    messages = [*LEADING.get(api, []), wire.user("read it")]
    messages += wire.turn("c0", "Read", {"file_path": "/src/values.py"}, text)
    before = wire.conversation(messages)
    limit = before.total // 2
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), wire.meter)
    assert len(records) == 1 and limit * 0.97 - 30 <= after.total <= limit
    cut = result_of(after, "c0")
    (listed,) = LISTED.findall(cut)
    named = listed_names(listed)
    head, _, rest = SHOWN.split(cut)  # the key between them
    tail = rest.split("\n", 1)[1]  # after the names line
    assert "482913" in named and len(named) > 20
    middle = text.removeprefix(head.rstrip("\n")).removesuffix(tail.lstrip("\n"))
    assert all(re.search(rf"\b{re.escape(name)}\b", middle) for name in named)
    kept = set(re.findall(r"\w+", head + tail))
    assert "row" in kept and not kept & set(named)  # row: in every line, so not listed


def test_the_same_text_is_cut_to_the_same_bytes(wire: Builder) -> None:
    messages = [*LEADING.get(wire.api, []), wire.user(LOG)]
    goal = Goal(target=900, limit=900)
    first, _ = Truncate().apply(wire.conversation(messages), goal, wire.meter)
    again, _ = Truncate().apply(wire.conversation(copy.deepcopy(messages)), goal, wire.meter)
    assert SHOWN.search(first.dialect.text(first.messages[-1])) is not None
    assert first.messages == again.messages


@st.composite
def long_texts(draw: Any) -> str:
    """A text of hundreds to thousands of tokens: lines of words, or one line without ends."""
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
    width = draw(st.integers(1, 24))
    lines = [
        " ".join(words[(n + i) % len(words)] for i in range(width)) + f" {n}"
        for n in range(draw(st.integers(20, 400)))
    ]
    return draw(st.sampled_from(["\n", " ", ""])).join(lines)


WORDS = ["alpha", "beta", "東京", "é", "{", "}", "42", "error:", "\t", "0x1f", "…", "[brim"]


@pytest.mark.parametrize("api", sorted(WIRES))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(texts=st.lists(long_texts(), min_size=1, max_size=3), share=st.floats(0.05, 0.95))
def test_the_marker_and_its_key_stay_within_the_budget(
    api: str, texts: list[str], share: float
) -> None:
    """Texts with and without line ends, one or several of them: whatever truncate cuts fits
    the limit whenever what it may not cut (the newest message, `min_keep_tokens` of each
    text) does, and every cut names the key of its text."""
    wire = BUILDERS[api]
    messages: list[dict[str, Any]] = [*LEADING.get(api, [])]
    for n, text in enumerate(texts):
        messages += [wire.user(f"q{n}"), wire.said(text)]
    before = wire.conversation(messages)
    meter = wire.meter
    limit = max(1, int(before.total * share))
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), meter)
    for record in records:
        assert record.original is not None and record.archive_key == archive_key(record.original)
        cut = after.dialect.text(after.messages[record.index])  # truncate removes no message
        assert SHOWN.findall(cut) == [record.archive_key[:16]]
    floor = sum(min(len(meter.tokens(t)), 256) for t in texts)  # what cutting leaves at least
    event(f"{len(records)} cut")
    if before.total - sum(len(meter.tokens(t)) for t in texts) + floor + 60 * len(texts) < limit:
        event("must fit")
        assert after.total <= limit


@pytest.mark.parametrize("api", sorted(WIRES))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ratio=st.sampled_from([0.5, 0.8, 1.0, 1.15, 1.3, 1.5, 2.0, 3.0]),
    over=st.floats(1.1, 8.0),
    seed=st.integers(0, 2**16),
)
def test_one_huge_message_is_cut_to_the_budget_at_any_ratio(
    api: str, ratio: float, over: float, seed: int
) -> None:
    """Counts are the encoding's tokens × the request's ratio, the text's tokens the encoding's
    own: the excess is converted once, so a message `over` times the limit is cut to just
    under it (not by the excess counted in the wrong unit: 1.13 M estimated tokens for a
    190 K budget once went out at 49 K)."""
    wire = BUILDERS[api]
    meter = CounterMeter(COUNTER, "claude", "claude-sonnet-4-5", WIRES[api], ratio)
    rng = random.Random(seed)
    text = " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 999)}" for _ in range(3_000))
    messages = [*LEADING.get(api, []), wire.user(text)]
    before = Conversation.of(WIRES[api].dialect, messages, meter, 3)
    limit = int(before.total / over)
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), meter)
    assert len(records) == 1
    assert limit * 0.97 - 30 <= after.total <= limit


@pytest.mark.parametrize("api", sorted(WIRES))
@pytest.mark.parametrize("over", [1.5, 3.0, 8.0])
def test_a_huge_escaped_result_is_cut_to_the_budget(api: str, over: float) -> None:
    """The newest result of a Read, its tabs, quotes and backslashes taking more tokens in the
    request than in its text, is cut by what its text takes there: to just under the budget,
    not by the excess counted as the text's own tokens (a 28 K-token result was cut to 816
    tokens where 5 K fitted, and the request went out at 71 % of its budget)."""
    wire = BUILDERS[api]
    messages = [*LEADING.get(api, []), wire.user("read it")]
    messages += wire.turn("c0", "Read", {"file_path": "/src/parser.py"}, read_output(3_000))
    before = wire.conversation(messages)
    limit = int(before.total / over)
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), wire.meter)
    assert len(records) == 1
    assert limit * 0.98 - 30 <= after.total <= limit


@pytest.mark.parametrize("api", sorted(WIRES))
def test_the_notice_is_cut_before_it_is_dropped(api: str) -> None:
    """Where what truncate may cut of the client's turns leaves a request a few tokens over,
    evict's notice — brim's own words, the one trace of what evict removed — gives those tokens
    from its middle, its head line and its ids kept; it goes whole only where it cannot give
    them. (On Chat and Responses, where the notice is a system message, it went whole: a Claude
    Code session on rich cut to 5× went out 3 tokens short of fitting its 772-token notice,
    without the 26 facts it listed.)"""
    wire = BUILDERS[api]
    dialect = WIRES[api].dialect
    quoted = [f"> line {n}: status of job {n} is done in {n * 3} s" for n in range(40)]
    ids = IDS_LABEL + NAMES_SEPARATOR.join(str(480_000 + 37 * n) for n in range(40))
    head = f"{NOTICE_PREFIX}12 earlier messages (9000 tokens) to fit the context window]"
    notice_text = "\n".join([head, GISTS_HEADER, *quoted, ids])
    leading = [*LEADING.get(api, []), wire.user("first task")]
    newest = wire.turn("last", "read_file", {"p": "a.txt"}, "short file\n" * 20)
    messages = [*leading, dialect.notice(notice_text), *newest]
    at = len(leading)
    before = dataclasses.replace(
        wire.conversation(messages),
        origin=tuple(-1 if i == at else i for i in range(len(messages))),
    )
    limit = before.total - 40
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), wire.meter)
    assert after.total <= limit
    texts = [dialect.text(m) for m in after.messages]
    (kept,) = [text for text in texts if text.startswith(NOTICE_PREFIX)]
    assert kept.startswith(head + "\n") and kept.endswith(ids)  # the head and the ids stay
    assert "tokens cut from the middle by brim" in kept
    (record,) = records
    assert record.index == -1 and record.original == notice_text
    assert texts[at + 1 :] == [dialect.text(m) for m in newest]  # the newest turn as it was


def badges_page(seed: int) -> str:
    """A README as a Read prints it: 120 numbered lines, some of one badge link, some of twenty
    (a few thousand characters), each link with its own numbers."""
    rng = random.Random(seed)

    def badge(n: int) -> str:
        version, project = rng.randint(1_000, 99_999), rng.randint(10, 99_999)
        return (
            f"[![badge {n}](https://img.shields.io/pypi/v{version}/rich)]"
            f"(https://pypi.org/project/rich{project}/)"
        )

    return "\n".join(
        f"{n}\t" + " ".join(badge(n) for _ in range(rng.choice([1, 1, 2, 8, 20])))
        for n in range(1, 121)
    )


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_text_of_long_lines_is_cut_to_the_budget_before_the_instructions(api: str) -> None:
    """A cut ends at line ends, and the names under its marker fill their room as the middle it
    takes grows: on a text of long lines the first attempts end a little over the budget, and
    two may end at the same line end. The cut goes on — twice as far where an attempt ended
    where the last one did — until the request fits, at any budget: the client's instructions
    (a system or developer message on Chat and Responses) are never cut for the few tokens left
    over, nor does the request go out over its budget. (With four attempts and no doubling,
    one budget in eight of such a sweep cut Chat's system prompt.)"""
    wire = BUILDERS[api]
    instructions = copy.deepcopy(LEADING.get(api, []))
    for message in instructions:
        message["content"] = "You are a careful agent; read before you write. " * 40
    page = badges_page(1)
    messages = [*instructions, wire.user("read the readme")]
    messages += wire.turn("c1", "Read", {"file_path": "/src/README.md"}, page)
    before = wire.conversation(messages)
    for limit in range(before.total // 3, before.total - 50, before.total // 60):
        after, records = Truncate().apply(before, Goal(limit, limit), wire.meter)
        assert limit * 0.9 <= after.total <= limit, limit
        (record,) = records  # the Read's result alone, the last message: all else as sent
        assert record.original == page and list(after.messages[:-1]) == messages[:-1], limit
        assert "tokens cut from the middle by brim" in result_of(after, "c1")
