"""Each policy on hand-built conversations."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from brim.policies.clear import ClearSettings, ClearToolResults
from brim.policies.conversation import Conversation, Goal, snapped_count
from brim.policies.evict import Evict, EvictSettings
from brim.policies.prune import PruneSettings, PruneToolResults
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.truncate import Truncate
from brim.policies.wires.chat import CHAT, ChatDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import tool_turn as build_tool_turn
from tests.builders import without_named_whole

use_bundled_tiktoken_files()
METER = CounterMeter(TokenCounter(), "o200k_base", "", CHAT)
D = ChatDialect()


def conv(messages: list[dict[str, Any]]) -> Conversation:
    return Conversation.of(D, messages, METER, 3)


def tool_turn(n: int, content: str, name: str = "read_file") -> list[dict[str, Any]]:
    """A call with arguments of its own (the same call twice would supersede the first)."""
    call, result = build_tool_turn(f"c{n}", content, name)
    function = call["tool_calls"][0]["function"]
    function["arguments"] = orjson.dumps({"path": f"src/module_{n}.py"}).decode()
    return [call, result]


LOG = "\n".join(
    f"2026-11-22 12:00:{n:02d} INFO worker {n} processed batch {n * 7} ok" for n in range(400)
)
LISTING = orjson.dumps(
    {
        "files": [
            {"name": f"f{n}.py", "html_url": f"https://x/{n}", "size": n, "owner": None}
            for n in range(50)
        ]
    }
).decode()


def test_snapped_count_moves_in_batches() -> None:
    savings = [100] * 30
    assert snapped_count(savings, 0, 500) == 0
    assert snapped_count(savings, 150, 500) == 5  # rounded up to the first 500-token line
    assert snapped_count(savings, 450, 500) == 5
    assert snapped_count(savings, 501, 500) == 10
    assert snapped_count(savings, 10_000, 500) == 30
    assert snapped_count(savings, 150, 0) == 2  # no batching: just enough


def test_snapped_count_takes_whole_multiples_where_the_items_run_out() -> None:
    # 27 items of 100 cannot save 10 000: all would be taken, one more every turn the session
    # grows; with `whole`, a multiple of 8 — the rest left to the next policy.
    assert snapped_count([100] * 27, 10_000, 500, whole=8) == 24
    # …but where all of them reach what is needed, off the grid, all are taken: 24 would leave
    # 250 tokens to the next policy, which would remove a batch of its own for them
    assert snapped_count([100] * 27, 2_650, 500, whole=8) == 27
    assert snapped_count([100] * 27, 2_701, 500, whole=8) == 24  # not reached: as before
    assert snapped_count([100] * 27, 400, 500, whole=8) == 5  # on the grid: as without
    assert snapped_count([100] * 6, 10_000, 500, whole=8) == 6  # fewer than 8: all
    assert [snapped_count([100] * n, 10_000, 500, whole=8) for n in range(24, 33)] == [24] * 8 + [
        32
    ]


def test_snapped_count_reads_savings_only_as_far_as_it_takes() -> None:
    read: list[int] = []

    def savings() -> Iterator[int]:
        for n in range(30):
            read.append(n)
            yield 100

    assert snapped_count(savings(), 450, 500) == 5 and len(read) == 5
    assert snapped_count(iter([100] * 30), 10_000, 500) == 30  # all of it, when not enough
    assert snapped_count(iter([]), 10, 500) == 0


def test_a_goal_steps_by_its_slack_unless_told() -> None:
    goal = Goal(target=850, limit=1_000)
    assert goal.step(None) == 150 and goal.step(0) == 0 and goal.step(40) == 40
    assert Goal(target=1_000, limit=1_000).step(None) == 1


def test_prune_shrinks_json_and_logs_but_spares_the_newest_turn() -> None:
    messages = [
        {"role": "user", "content": "go"},
        *tool_turn(1, LISTING),
        *tool_turn(2, LOG),
        *tool_turn(3, LOG.replace(" ok", " done")),  # not a copy: that would become a pointer
    ]
    before = conv(messages)
    cut_only = PruneSettings(max_text_tokens=300, digest_share=1)  # no digests
    after, records = PruneToolResults(cut_only).apply(before, Goal(0, 0), METER)
    listing = orjson.loads(
        without_named_whole(after.messages[2]["content"], messages[2]["content"])
    )
    assert len(listing["files"]) == 8 + 1 + 4 and listing["files"][8] == "… 38 more items …"
    assert "html_url" not in listing["files"][0] and "owner" not in listing["files"][0]
    assert "lines omitted by brim" in after.messages[4]["content"]
    log = without_named_whole(after.messages[4]["content"], messages[4]["content"])
    assert log.startswith("2026-11-22 12:00:00 INFO") and log.endswith("processed batch 2793 ok")
    assert after.messages[6] is messages[6]  # the newest tool turn is never pruned
    assert [r.index for r in records] == [2, 4]
    assert all(r.tokens_after < r.tokens_before for r in records)
    assert (
        after.total
        == METER.message(after.messages[0]) + sum(METER.message(m) for m in after.messages[1:]) + 3
    )
    assert messages[2]["content"] == LISTING  # the input is never mutated


def test_clear_keeps_the_most_recent_results_and_names_what_it_cleared() -> None:
    messages = [{"role": "user", "content": "go"}]
    for n in range(6):
        messages += tool_turn(n, LOG, name="bash")
    before = conv(messages)
    after, records = ClearToolResults(ClearSettings(keep=2, clear_at_least=0)).apply(
        before, Goal(target=before.total - 1, limit=before.total), METER
    )
    assert len(records) == 1  # just enough: the oldest result
    text = after.messages[2]["content"]
    assert text.startswith("[brim cleared this bash result (") and "sha256:" in text
    assert records[0].archive_key and records[0].archive_key[:16] in text
    everything, records = ClearToolResults(ClearSettings(keep=2)).apply(before, Goal(0, 0), METER)
    assert len(records) == 4
    assert everything.messages[-1] is messages[-1] and everything.messages[-3] is messages[-3]
    assert D.violations(everything.messages) == []


def test_clear_remembers_each_placeholder_by_what_it_depends_on() -> None:
    messages = [{"role": "user", "content": "go"}]
    for n in range(4):
        messages += tool_turn(n, LOG, name="bash" if n % 2 else "grep")  # the same text twice
    before = conv(messages)
    policy = ClearToolResults(ClearSettings(keep=0))
    made: list[str] = []
    placeholder = policy._placeholder

    def counted(tool: str, *rest: Any) -> Any:
        made.append(tool)
        return placeholder(tool, *rest)

    policy._placeholder = counted  # type: ignore[method-assign]
    first, _ = policy.apply(before, Goal(0, 0), METER)
    assert sorted(made) == ["bash", "grep"]  # one per tool: the texts and sizes are the same
    texts = [first.messages[i]["content"] for i in (2, 4, 6, 8)]
    assert [
        t.startswith(f"[brim cleared this {tool} result")
        for t, tool in zip(texts, ["grep", "bash", "grep", "bash"], strict=True)
    ] == [True] * 4
    again, _ = policy.apply(conv(messages), Goal(0, 0), METER)
    assert len(made) == 2 and again.messages == first.messages  # remembered, and the same
    fresh, _ = ClearToolResults(ClearSettings(keep=0)).apply(conv(messages), Goal(0, 0), METER)
    assert fresh.messages == first.messages


def test_a_meter_counts_a_message_as_its_counter_does() -> None:
    message = {"role": "tool", "tool_call_id": "c1", "content": LOG}
    counter = TokenCounter()
    meter = CounterMeter(counter, "claude", "claude-x", CHAT)
    assert meter.message(message) == counter.message(message, "claude", "claude-x", CHAT)
    assert meter.message(message) > METER.message(message)  # the calibration factor: its own
    assert counter.cache_hits == 2 and counter.cache_misses == 1  # one cache: counted once


def test_evict_removes_old_units_whole_and_leaves_one_notice() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first task"},
    ]
    for n in range(8):
        content = f"turn {n}\n{LOG[:3000]}"  # no two alike: a copy would go first
        messages += tool_turn(n, content, name="grep" if n % 2 else "read_file")
        messages.append({"role": "assistant", "content": f"chatter {n} " * 40})
        if n == 3:
            messages.append({"role": "user", "content": "please also look at the tests"})
    messages.append({"role": "user", "content": "final question"})
    before = conv(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    after, records = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(
        before, goal, METER
    )
    assert after.total <= goal.target
    assert after.messages[:2] == tuple(messages[:2])
    assert after.messages[-1] is messages[-1]
    notice = after.messages[2]
    assert notice["role"] == "system" and notice["content"].startswith("[brim removed ")
    assert D.violations(after.messages) == []
    evicted = [r for r in records if r.action == "evicted"]
    kinds = [r.detail for r in evicted]
    # chatter goes before evidence: where half of it is all the cut needs, only chatter goes
    chatter = sum(
        size
        for m, size in zip(messages, before.sizes, strict=True)
        if str(m.get("content") or "").startswith("chatter")
    )
    some = Goal(target=before.total - chatter // 2, limit=before.total - chatter // 4)
    _, few = Evict(EvictSettings(keep_recent_turns=2, evict_at_least=0)).apply(before, some, METER)
    assert {r.detail for r in few if r.action == "evicted"} == {"assistant"}
    assert ("tool calls: " in notice["content"]) == ("tools" in kinds)
    assert ('"please also look at the tests"' in notice["content"]) == ("user" in kinds)


def test_evict_degrades_but_never_drops_the_system_prompt_or_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "sys " * 50},
        {"role": "user", "content": "first " * 400},
        *tool_turn(1, LOG[:4000]),
        {"role": "user", "content": "last"},
    ]
    before = conv(messages)
    minimum = METER.message(messages[0]) + METER.message(messages[-1]) + 3
    after, _ = Evict().apply(before, Goal(target=minimum, limit=minimum), METER)
    assert after.messages == (messages[0], messages[-1])  # the notice did not fit, so it went too
    assert after.total == minimum


def test_evict_keeps_system_messages_between_the_turns_in_place() -> None:
    rule = {"role": "system", "content": "From now on, answer in French."}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first task"},
    ]
    for n in range(8):
        messages += tool_turn(n, f"turn {n}\n{LOG[:3000]}")
        if n == 4:
            messages.append(rule)
    messages.append({"role": "user", "content": "final question"})
    before = conv(messages)
    goal = Goal(target=before.total // 3, limit=before.total // 2)
    after, records = Evict(EvictSettings(keep_recent_turns=1, evict_at_least=0)).apply(
        before, goal, METER
    )
    assert after.total <= goal.target and any(r.action == "evicted" for r in records)
    at = after.messages.index(rule)  # never evicted, and still between the same two turns
    was = messages.index(rule)
    assert after.messages[at - 1] is messages[was - 1]
    assert after.messages[at + 1] is messages[was + 1]
    assert D.violations(after.messages) == []


def test_evict_puts_its_notice_before_a_system_message_not_after_it() -> None:
    rule = {"role": "system", "content": "From now on, answer in French."}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "the task"},
        rule,
        {"role": "assistant", "content": "chatter " * 300},  # the turn after it: a last resort
    ]
    before = conv(messages)
    minimum = before.total - before.sizes[2] + 60  # room for the notice, not for the chatter
    after, _ = Evict(EvictSettings(keep_recent_turns=0)).apply(
        before, Goal(target=minimum, limit=minimum), METER
    )
    assert [m["role"] for m in after.messages] == ["user", "system", "system"]
    assert after.messages[1]["content"].startswith("[brim removed ")  # the notice, then the rule
    assert after.messages[0] is messages[0] and after.messages[2] is rule


def test_evict_keeps_a_last_user_message_that_is_an_image_alone() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/screen.png"}}
    messages = [
        {"role": "user", "content": "first " * 400},
        *tool_turn(1, LOG[:4000]),
        {"role": "user", "content": [image]},
    ]
    before = conv(messages)
    after, _ = Evict(EvictSettings(keep_recent_turns=0)).apply(before, Goal(1, 1), METER)
    assert after.messages[-1] is messages[-1]


def test_truncate_cuts_the_largest_message_keeping_head_and_tail() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": LOG}]
    before = conv(messages)
    after, records = Truncate().apply(before, Goal(target=1_000, limit=1_000), METER)
    text = after.messages[1]["content"]
    assert after.total <= 1_000
    assert text.startswith("2026-11-22 12:00:00") and text.rstrip().endswith("batch 2793 ok")
    assert "tokens cut from the middle by brim" in text
    assert records[0].tokens_before > records[0].tokens_after
    assert after.messages[0] is messages[0]


def test_truncate_cuts_the_newest_turn_last_even_with_a_system_message_after_it() -> None:
    messages = [
        {"role": "user", "content": "go"},
        *tool_turn(1, LOG.replace(" ok", " older")),
        {"role": "user", "content": "and now?"},
        *tool_turn(2, LOG + "\nand one line more"),  # the largest, and the newest
        {"role": "system", "content": "Remember the deadline."},
    ]
    before = conv(messages)
    limit = before.total - 1_000
    after, records = Truncate().apply(before, Goal(target=limit, limit=limit), METER)
    assert [r.index for r in records] == [2]  # the older results, not the newest
    assert after.messages[5] is messages[5] and after.messages[6] is messages[6]


def test_truncate_cuts_only_as_far_as_the_budget_not_the_low_water_mark() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": LOG}]
    before = conv(messages)
    goal = Goal(target=1_000, limit=2_000)
    after, records = Truncate().apply(before, goal, METER)
    assert len(records) == 1
    assert goal.target < after.total <= goal.limit  # text destroyed only as far as needed
    assert after.total >= goal.limit - 50  # …and not much further


@given(
    st.lists(st.text(alphabet="abxy_.*?[]!", min_size=1, max_size=6), max_size=4),
    st.lists(st.text(alphabet="abxyAB_.*[]", min_size=1, max_size=8), max_size=8, unique=True),
)
@settings(max_examples=300, deadline=None)
def test_prune_drops_the_fields_its_patterns_match_as_fnmatch_matches_them(
    patterns: list[str], keys: list[str]
) -> None:
    prune = PruneToolResults(PruneSettings(drop_fields=tuple(patterns)))
    kept = orjson.loads(prune.lossless_text(orjson.dumps(dict.fromkeys(keys, 1)).decode(), METER))
    noise = [k for k in keys if any(fnmatch.fnmatchcase(k.lower(), p) for p in patterns)]
    assert list(kept) == [k for k in keys if k not in noise]


def test_prune_leaves_json_too_deep_to_write_back_as_text() -> None:
    deep = '{"a":' * 400 + "[" + ",".join(f'"item {n}"' for n in range(3000)) + "]" + "}" * 400
    messages = [{"role": "user", "content": "go"}, *tool_turn(1, deep), *tool_turn(2, "fresh")]
    after, records = PruneToolResults(PruneSettings(max_text_tokens=300)).apply(
        conv(messages), Goal(0, 0), METER
    )
    pruned = without_named_whole(after.messages[2]["content"], deep)
    assert [r.index for r in records] == [2]
    assert "tokens cut from the middle by brim" in pruned  # cut as text, not re-encoded
    assert pruned.startswith('{"a":{"a":') and pruned.endswith("}}}")
