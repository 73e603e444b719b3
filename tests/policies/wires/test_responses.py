"""The Responses dialect: units, validity, repair, and compression of generated `input` items
(reasoning with encrypted content, parallel and custom tool calls, lost or orphaned outputs)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brim.policies.compress import DEFAULT_ORDER, build_policies, compress
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.responses import RESPONSES, ResponsesDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.fakes import responses_errors

use_bundled_tiktoken_files()
D = ResponsesDialect()
COUNTER = TokenCounter()
METER = CounterMeter(COUNTER, "o200k_base", "gpt-5", RESPONSES)
POLICIES = build_policies(DEFAULT_ORDER, {})


def call(call_id: str, kind: str = "function_call") -> dict[str, Any]:
    item = {"type": kind, "call_id": call_id, "name": "shell"}
    item["input" if kind == "custom_tool_call" else "arguments"] = '{"cmd": "ls"}'
    return item


def output(call_id: str, text: str = "ok", kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": text}


def test_units_keep_reasoning_with_what_follows_it() -> None:
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA", "summary": []},
        call("a"),
        call("b"),
        output("a"),
        output("b"),
        {"type": "reasoning", "id": "rs_2", "encrypted_content": "gBBB", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "done"}],
        },
    ]
    assert [(u.kind, u.start, u.end) for u in D.units(items)] == [
        ("system", 0, 1),
        ("user", 1, 2),
        ("tools", 2, 7),
        ("assistant", 7, 9),
    ]
    assert D.violations(items) == []


def test_violations_and_repair() -> None:
    broken = [
        {"role": "user", "content": "go"},
        output("ghost"),
        call("a"),
        call("b", "custom_tool_call"),
        output("a"),
        {"role": "user", "content": "next"},
    ]
    assert D.violations(broken) == [
        "input[1]: output for 'ghost' has no earlier call",
        "input[3]: no tool output found for call 'b'",
    ]
    fixed, done = D.repaired(broken)
    assert D.violations(fixed) == [] and responses_errors(fixed) == []
    assert fixed[4] == {
        "type": "custom_tool_call_output",
        "call_id": "b",
        "output": "[no result was recorded for this tool call]",
    }
    assert len(done) == 2 and fixed[0] is broken[0]


words = st.lists(st.sampled_from(["alpha", "error", "line", "42", "東京", "\n"]), max_size=40).map(
    " ".join
)


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": draw(words) or "task"}
    ]
    for turn in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{turn}",
                    "encrypted_content": "gAAAA" + "x" * draw(st.integers(0, 400)),
                    "summary": [],
                }
            )
        kind = draw(
            st.sampled_from(["function_call", "function_call", "custom_tool_call", "message"])
        )
        if kind == "message":
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": draw(words) or "ok"}],
                }
            )
            items.append({"type": "message", "role": "user", "content": draw(words) or "more"})
            continue
        ids = [f"c{turn}_{n}" for n in range(draw(st.integers(1, 3)))]
        items += [call(i, kind) for i in ids]
        out_kind = (
            "custom_tool_call_output" if kind == "custom_tool_call" else "function_call_output"
        )
        for i in ids:
            if draw(st.integers(0, 9)):
                items.append(
                    output(
                        i,
                        "\n".join(f"line {n}" for n in range(draw(st.sampled_from([1, 50, 500])))),
                        out_kind,
                    )
                )
        if draw(st.integers(0, 9)) == 0:
            items.append(output(f"lost_{turn}"))
    items.append({"type": "message", "role": "user", "content": "final question"})
    return items


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(items=conversations(), limit=st.integers(150, 10_000))
def test_compressed_input_is_valid_within_budget_and_keeps_reasoning_intact(
    items: list[dict[str, Any]], limit: int
) -> None:
    outcome = compress(D, items, 20, METER, POLICIES, limit=limit, low_water=0.85)
    out = list(outcome.messages)
    assert D.violations(out) == [] and responses_errors(out) == []
    assert (
        COUNTER.request(RESPONSES, {"input": out}, "o200k_base").total + 20
        == outcome.tokens_out + 3
    )
    for item in out:  # encrypted reasoning is the client's own, untouched
        if item.get("type") == "reasoning":
            assert any(orjson.dumps(item) == orjson.dumps(original) for original in items)
    if outcome.fits:
        assert outcome.tokens_out <= limit
        assert items[-1] in out or any(
            "cut from the middle by brim" in str(i.get("content")) for i in out
        )
    assert (
        compress(D, items, 20, METER, POLICIES, limit=limit, low_water=0.85).messages
        == outcome.messages
    )
