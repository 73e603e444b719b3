"""The Anthropic Messages dialect: units, validity, repair — and compression of generated
Messages conversations (parallel tool uses, thinking, images, cache_control)."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from brim.policies.compress import DEFAULT_ORDER, Outcome, build_policies, compress
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.base import NO_RESULT, BodyError
from brim.policies.wires.messages import MESSAGES, AnthropicDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import same_turn
from tests.fake_anthropic import anthropic_errors

use_bundled_tiktoken_files()
D = AnthropicDialect()
COUNTER = TokenCounter()
METER = CounterMeter(COUNTER, "claude", "claude-sonnet-4-5", MESSAGES)
POLICIES = build_policies(DEFAULT_ORDER, {})


def use(call_id: str, name: str = "read_file") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {"path": "a.py"}}


def result(call_id: str, content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


def thinking(text: str) -> dict[str, Any]:
    return {
        "type": "thinking",
        "thinking": text,
        "signature": hashlib.sha256(text.encode()).hexdigest()[:32],
    }


def png(width: int, height: int) -> dict[str, Any]:
    header = (
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
        + struct.pack(">II", width, height)
        + b"\x08\x02\x00\x00\x00"
    )
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(header).decode(),
        },
    }


def test_a_tool_unit_spans_the_assistant_turn_and_the_next_user_message() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [thinking("plan"), use("a"), use("b")]},
        {
            "role": "user",
            "content": [result("a"), result("b"), {"type": "text", "text": "and hurry"}],
        },
        {"role": "assistant", "content": "done"},
    ]
    assert [(u.kind, u.start, u.end) for u in D.units(messages)] == [
        ("user", 0, 1),
        ("tools", 1, 3),
        ("assistant", 3, 4),
    ]
    assert D.violations(messages) == []
    assert D.tools_by_call(messages) == {"a": "read_file", "b": "read_file"}
    assert D.largest_text(messages[1]) is None  # a thinking turn is never edited


def test_violations_follow_anthropics_rules() -> None:
    assert D.violations([{"role": "assistant", "content": "hi"}]) == [
        "messages[0]: the first message must be a user message"
    ]
    unanswered = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("a")]},
        {"role": "user", "content": "next"},
    ]
    assert D.violations(unanswered) == [
        "messages[1]: tool_use ['a'] not answered in the next message"
    ]
    orphan = [{"role": "user", "content": [result("x")]}]
    assert D.violations(orphan) == [
        "messages[0]: tool_result 'x' answers no tool_use of the previous message"
    ]
    late = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("a")]},
        {"role": "user", "content": [{"type": "text", "text": "t"}, result("a")]},
    ]
    assert D.violations(late) == ["messages[2]: tool_result blocks must come first"]


def test_repair_is_minimal() -> None:
    broken = [
        {"role": "assistant", "content": [use("a"), use("b")]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, result("a"), result("ghost")],
        },
        {"role": "assistant", "content": [use("c")]},
    ]
    fixed, done = D.repaired(broken)
    assert D.violations(fixed) == []
    assert fixed[0] == {"role": "user", "content": "[earlier messages were removed]"}
    assert fixed[2]["content"] == [
        result("a"),
        result("b", NO_RESULT),
        {"type": "text", "text": "look"},
    ]
    assert fixed[4] == {"role": "user", "content": [result("c", NO_RESULT)]}
    assert fixed[1] is broken[0] and fixed[3] is broken[2]
    assert len(done) == 4


def test_images_count_by_anthropics_rule() -> None:
    base = COUNTER.message(
        {"role": "user", "content": [{"type": "text", "text": "x"}]}, "o200k_base", "", MESSAGES
    )
    with_image = COUNTER.message(
        {"role": "user", "content": [{"type": "text", "text": "x"}, png(1000, 750)]},
        "o200k_base",
        "",
        MESSAGES,
    )
    assert with_image - base == 1000  # 1000 × 750 / 750
    huge = COUNTER.message(
        {"role": "user", "content": [png(8000, 8000)]}, "o200k_base", "", MESSAGES
    )
    assert (
        huge - COUNTER.message({"role": "user", "content": []}, "o200k_base", "", MESSAGES) == 1600
    )


def test_system_prompt_and_tools_are_fixed_cost() -> None:
    body = {
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code. " * 500,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    count = COUNTER.request(MESSAGES, body, "claude")
    assert count.tools > 3_000  # the long system prompt and the tool prompt are fixed cost
    assert METER.fixed(body) == count.tools + count.priming


words = st.lists(
    st.sampled_from(["alpha", "beta", "error", "line", "42", "é", "東京", "\n"]), max_size=50
).map(" ".join)


def instruction(draw: Any) -> dict[str, Any]:
    """A mid-conversation system message: text, or text blocks."""
    text = draw(words) or "Keep going."
    if draw(st.booleans()):
        return {"role": "system", "content": text}
    return {"role": "system", "content": [{"type": "text", "text": text}]}


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(words) or "start"}]
    for turn in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 4)) == 0:  # after a user turn, before an assistant turn
            messages.append(instruction(draw))
        kind = draw(st.sampled_from(["text", "tools", "tools", "image", "giant"]))
        if kind == "tools":
            ids = [f"toolu_{turn}_{n}" for n in range(draw(st.integers(1, 3)))]
            content: list[Any] = [thinking(draw(words) or "hm")] if draw(st.booleans()) else []
            content += [use(i, draw(st.sampled_from(["read_file", "bash"]))) for i in ids]
            messages.append({"role": "assistant", "content": content})
            results: list[Any] = []
            for i in ids:
                size = draw(st.sampled_from([0, 40, 400, 2000]))
                body = "\n".join(f"line {n}: output " * 3 for n in range(size // 10))
                block = result(
                    i, body if draw(st.booleans()) else [{"type": "text", "text": body or "."}]
                )
                if draw(st.booleans()):
                    block["cache_control"] = {"type": "ephemeral"}
                results.append(block)
            if draw(st.integers(0, 5)) == 0:
                results.append({"type": "text", "text": draw(words) or "also this"})
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "assistant", "content": draw(words) or "ok"})
            if kind == "image":
                messages.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            png(draw(st.integers(10, 3000)), draw(st.integers(10, 3000))),
                        ],
                    }
                )
            elif kind == "giant":
                messages.append(
                    {"role": "user", "content": "pasted log line\n" * draw(st.integers(300, 2000))}
                )
            else:
                messages.append({"role": "user", "content": draw(words) or "next"})
    if draw(st.integers(0, 4)) == 0:  # last, as Claude Code sends them after tool results
        messages.append(instruction(draw))
    return messages


def systems(messages: Any) -> list[Any]:
    return [m for m in messages if m.get("role") == "system"]


def instructions(messages: Any) -> list[Any]:
    """The text blocks of the system messages, in order."""
    found: list[Any] = []
    for message in systems(messages):
        content = message["content"]
        found += [{"type": "text", "text": content}] if isinstance(content, str) else content
    return found


def whole_or_cut(new: Any, original: Any, key: str = "") -> bool:
    """Whether `new` is `original`, or `original` with texts cut by brim: the same structure
    and roles, every other value equal, and each text that differs (a "text" or string
    "content") marked by brim, starting with the original's head and ending with its tail (its
    first and last lines, up to 20 characters: cut_middle keeps at least a third of 256 tokens
    at the head and the rest at the tail, relevant_lines the first and last lines). A cut
    tool_result whose content held several text blocks has their joined text in the first of
    them, the others gone, its other blocks kept."""
    texts = [
        b
        for b in (original if key == "content" and isinstance(original, list) else [])
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    if len(texts) > 1 and isinstance(new, list) and len(new) == len(original) - len(texts) + 1:
        joined = {**texts[0], "text": "\n".join(b["text"] for b in texts)}
        merged = [joined if b is texts[0] else b for b in original if b not in texts[1:]]
        return new != merged and whole_or_cut(new, merged, key)
    if isinstance(original, dict):
        return (
            isinstance(new, dict)
            and new.keys() == original.keys()
            and all(whole_or_cut(new[k], original[k], k) for k in original)
        )
    if isinstance(original, list):
        return (
            isinstance(new, list)
            and len(new) == len(original)
            and all(whole_or_cut(n, o, key) for n, o in zip(new, original, strict=True))
        )
    if new == original:
        return True
    return (
        key in ("text", "content")
        and isinstance(original, str)
        and isinstance(new, str)
        and "by brim" in new
        and "by brim" not in original
        and new.startswith(original.split("\n")[0][:20])
        and new.endswith(original.split("\n")[-1][-20:])
    )


def run(messages: list[dict[str, Any]], limit: int) -> Outcome:
    return compress(D, messages, 50, METER, POLICIES, limit=limit, low_water=0.85)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=conversations(), limit=st.integers(200, 15_000))
def test_compressed_messages_are_valid_within_budget_and_keep_thinking_intact(
    messages: list[dict[str, Any]], limit: int
) -> None:
    outcome = run(messages, limit)
    event("refused" if not outcome.fits else ("compressed" if outcome.records else "untouched"))
    out = list(outcome.messages)
    assert D.violations(out) == []
    assert anthropic_errors(out) == []  # Anthropic's rules, as written apart from the dialect
    # System messages are instructions: every one is kept whole, in its order (two that
    # evictions left side by side go as one, their blocks in order).
    assert instructions(out) == instructions(messages)
    assert (
        COUNTER.request(MESSAGES, {"messages": out}, "claude").total + 50 == outcome.tokens_out + 3
    )
    for message in out:  # thinking turns are the client's own, byte for byte
        if D.thinks(message):
            assert any(orjson.dumps(message) == orjson.dumps(original) for original in messages)
    if not outcome.fits:
        return
    assert outcome.tokens_out <= limit
    # The newest turn is still the newest, whole or with its text cut (never dropped, never
    # replaced by another message's cut).
    last = max(i for i, m in enumerate(messages) if m["role"] != "system")
    newest = max(i for i, m in enumerate(out) if m["role"] != "system")
    assert whole_or_cut(out[newest], messages[last]), (out[newest], messages[last])
    assert run(messages, limit).messages == outcome.messages


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=conversations())
def test_messages_that_fit_are_left_alone(messages: list[dict[str, Any]]) -> None:
    outcome = run(messages, 10_000_000)
    assert not outcome.changed
    assert all(a is b for a, b in zip(outcome.messages, messages, strict=True))


def test_cutting_a_tool_results_text_keeps_its_images_and_block_fields() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    cached = {"type": "text", "text": "first part", "cache_control": {"type": "ephemeral"}}
    second = {"type": "text", "text": "second part"}
    block = {"type": "tool_result", "tool_use_id": "t1", "content": [cached, image, second]}
    message = {"role": "user", "content": [block]}
    assert D.largest_text(message) == "first part\nsecond part"
    cut = D.with_largest_text(message, "first […] part")
    assert cut["content"][0]["content"] == [{**cached, "text": "first […] part"}, image]
    assert message["content"][0]["content"] == [cached, image, second]  # the input unchanged
    plain = {**block, "content": "all of it"}
    assert D.with_largest_text({"role": "user", "content": [plain]}, "all")["content"] == [
        {**plain, "content": "all"}
    ]


def test_a_tool_use_repeating_an_id_is_dropped_but_thinking_turns_are_never_edited() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("a"), use("a", "grep")]},
        {"role": "user", "content": [result("a")]},
    ]
    assert "messages[1]: tool_use ids ['a'] repeat" in D.violations(messages)
    repaired, done = D.repaired(messages)
    assert repaired[1]["content"] == [use("a")] and "dropped repeated tool_use ['a']" in done
    assert D.violations(repaired) == []
    thinking_turn = {"role": "assistant", "content": [thinking("hm"), use("a"), use("a")]}
    kept, _ = D.repaired([messages[0], thinking_turn, messages[2]])
    assert kept[1] is thinking_turn


def test_a_conversation_of_orphan_results_repairs_to_nothing() -> None:
    repaired, done = D.repaired([{"role": "user", "content": [result("x")]}])
    assert repaired == [] and done == ["dropped tool_result 'x' that answers no tool_use"]


# Mid-conversation system messages (Claude Code sends them to a model it takes for its newest,
# with the beta mid-conversation-system-2026-04-07): what it sent, in its order.
def _said(n: int, i: int) -> str:
    """Words no other line of the session has (letters only: brim masks digits), so that a
    digest of a read keeps its share of the lines rather than only the first and the last."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(letters[int(digit)] for digit in f"{n * 1000 + i:04d}") + "ing"


def claude_code_session(reads: int, size: int) -> list[dict[str, Any]]:
    """A prompt, a system message after it, `reads` file reads of `size` lines, and a system
    message after the tool results of the last but one read, before the last."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Read the notes, then answer."}]},
        {"role": "system", "content": "Available agent types for the Agent tool: claude."},
    ]
    for n in range(1, reads + 1):
        if n == reads:
            messages.append(
                {"role": "system", "content": "The task tools haven't been used recently."}
            )
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": f"Reading {n}."}, use(f"r{n}")],
            }
        )
        body = "\n".join(f"notes {n} line {i}: {_said(n, i)}" for i in range(size))
        messages.append({"role": "user", "content": [result(f"r{n}", body)]})
    return messages


def test_system_messages_in_the_conversation_are_units_of_their_own() -> None:
    messages = claude_code_session(3, 5)
    messages.append({"role": "system", "content": [{"type": "text", "text": "Be brief."}]})
    assert [u.kind for u in D.units(messages)] == [
        "user",
        "system",
        "tools",
        "tools",
        "system",
        "tools",
        "system",
    ]
    assert D.violations(messages) == [] and anthropic_errors(messages) == []
    assert all(D.largest_text(m) is None for m in systems(messages))  # never cut
    facts = MESSAGES.check({"model": "claude-next", "max_tokens": 5, "messages": messages})
    assert facts.model == "claude-next"
    for role in ("tool", "developer"):
        with pytest.raises(BodyError) as refused:
            MESSAGES.check(
                {"model": "m", "max_tokens": 5, "messages": [{"role": role, "content": "x"}]}
            )
        assert refused.value.param == "messages.0.role"


def test_system_messages_go_only_where_anthropic_takes_them() -> None:
    go = {"role": "user", "content": "go"}
    rule = {"role": "system", "content": "rule"}
    between = [
        go,
        {"role": "assistant", "content": [use("a")]},
        rule,
        {"role": "user", "content": [result("a")]},
    ]
    assert D.violations(between) == [
        "messages[1]: tool_use ['a'] not answered in the next message",
        "messages[2]: a system message must follow a user message, not assistant",
        "messages[2]: a system message must come right before an assistant message or last",
        "messages[3]: tool_result 'a' answers no tool_use of the previous message",
    ]
    assert D.violations([go, rule, {"role": "user", "content": "more"}]) == [
        "messages[1]: a system message must come right before an assistant message or last"
    ]
    assert D.violations([go, rule, dict(rule), {"role": "assistant", "content": "ok"}]) == [
        "messages[1]: a system message must come right before an assistant message or last",
        "messages[2]: a system message must follow a user message, not system",
    ]
    assert D.violations([rule, {"role": "assistant", "content": "ok"}]) == [
        "messages[0]: the first message must be a user message"
    ]
    paused = {
        "role": "assistant",
        "content": [{"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}],
    }
    assert D.violations([go, paused, rule]) == []  # after a server tool's use it may come


def test_repair_puts_system_messages_where_anthropic_takes_them_and_keeps_results() -> None:
    go = {"role": "user", "content": "go"}
    calls = {"role": "assistant", "content": [use("a")]}
    answers = {"role": "user", "content": [result("a", "the file")]}
    rule = {"role": "system", "content": "rule"}
    done_ = {"role": "assistant", "content": "done"}
    fixed, notes = D.repaired([go, calls, rule, answers, done_])
    assert fixed == [go, calls, answers, rule, done_]  # after the results, none of them lost
    assert all(a is b for a, b in zip(fixed, [go, calls, answers, rule, done_], strict=True))
    assert notes == ["moved a system message after the user message that followed it"]
    more = {
        "role": "system",
        "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}],
    }
    merged, notes = D.repaired([go, rule, more, done_])
    assert merged == [
        go,
        {"role": "system", "content": [{"type": "text", "text": "rule"}, more["content"][0]]},
        done_,
    ]
    assert notes == ["merged 2 adjacent system messages"]
    first, notes = D.repaired([rule, done_])
    assert first == [{"role": "user", "content": "[earlier messages were removed]"}, rule, done_]
    for fixed in ([go, calls, answers, rule, done_], merged, first):
        assert D.violations(fixed) == [] and anthropic_errors(fixed) == []
    session = claude_code_session(4, 3)
    kept, notes = D.repaired(session)
    assert notes == [] and all(a is b for a, b in zip(kept, session, strict=True))


def session_with_a_new_prompt() -> list[dict[str, Any]]:
    return [
        *claude_code_session(7, 120),
        {"role": "user", "content": "Now the last question."},
        {"role": "system", "content": [{"type": "text", "text": "Answer in one line."}]},
        {"role": "assistant", "content": [use("r8")]},
        {"role": "user", "content": [result("r8", "the last notes")]},
    ]


def test_a_session_with_system_messages_compressed_hard_keeps_them_whole_and_in_place() -> None:
    messages = session_with_a_new_prompt()
    # Hard enough that digests and placeholders of the reads do not suffice: turns go whole.
    limit = (METER.fixed({}) + sum(METER.message(m) for m in messages)) // 10
    outcome = compress(D, messages, 50, METER, POLICIES, limit=limit, low_water=0.85)
    out = list(outcome.messages)
    assert outcome.fits and outcome.tokens_out <= limit
    assert sum(r.action == "evicted" for r in outcome.records) >= 4  # hard: whole reads went
    assert outcome.repairs == ()  # nothing had to be put right after the policies
    assert D.violations(out) == [] and anthropic_errors(out) == []
    # Every system message went out as the client sent it, the very object, in order, between
    # the same two messages as in the client's conversation (evict keeps the turns around it).
    sent = systems(messages)
    assert len(sent) == 3 and [m for m in out if m.get("role") == "system"] == sent
    for s in sent:
        at = next(i for i, m in enumerate(out) if m is s)
        was = next(i for i, m in enumerate(messages) if m is s)
        before, after = out[at - 1], out[at + 1]
        assert same_turn(before, messages[was - 1]) or "[brim removed" in str(before["content"])
        assert same_turn(after, messages[was + 1])
    assert any(str(m.get("content")).startswith("[brim removed") for m in out)
    assert out[-2:] == messages[-2:]  # the ongoing read, whole


def test_when_the_turns_around_system_messages_must_go_too_they_stay_whole_and_valid() -> None:
    messages = session_with_a_new_prompt()
    limit = (METER.fixed({}) + sum(METER.message(m) for m in messages)) // 14
    outcome = compress(D, messages, 50, METER, POLICIES, limit=limit, low_water=0.85)
    out = list(outcome.messages)
    assert outcome.fits and D.violations(out) == [] and anthropic_errors(out) == []
    # Evict's last resort took the turns between the first two system messages: they went out
    # as one (Anthropic takes no two in a row), their text whole and in order.
    assert outcome.repairs == ("merged 2 adjacent system messages",)
    assert instructions(out) == instructions(messages)
    assert out[-4:] == messages[-4:]
