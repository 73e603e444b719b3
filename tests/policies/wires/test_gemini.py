"""The Gemini dialect: pairing by the next turn, repair, and compression of generated contents
(parallel function calls, thought parts with signatures, inline images)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brim.policies.compress import DEFAULT_ORDER, build_policies, compress
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.gemini import GEMINI, GeminiDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.fakes import gemini_errors

use_bundled_tiktoken_files()
D = GeminiDialect()
COUNTER = TokenCounter()
METER = CounterMeter(COUNTER, "o200k_base", "gemini-2.5-flash", GEMINI)
POLICIES = build_policies(DEFAULT_ORDER, {})


def calls(*names: str) -> dict[str, Any]:
    return {
        "role": "model",
        "parts": [
            {"text": "thinking", "thought": True, "thoughtSignature": "c2ln"},
            *({"functionCall": {"name": n, "args": {}}} for n in names),
        ],
    }


def responses(*names: str, text: str = "ok") -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [{"functionResponse": {"name": n, "response": {"output": text}}} for n in names],
    }


def test_units_and_violations() -> None:
    contents = [
        {"role": "user", "parts": [{"text": "go"}]},
        calls("a", "b"),
        responses("a", "b"),
        {"role": "model", "parts": [{"text": "done"}]},
    ]
    assert [(u.kind, u.start, u.end) for u in D.units(contents)] == [
        ("user", 0, 1),
        ("tools", 1, 3),
        ("assistant", 3, 4),
    ]
    assert D.violations(contents) == []
    assert D.largest_text(contents[1]) is None  # a turn with thought signatures is never edited
    broken = [
        {"role": "user", "parts": [{"text": "go"}]},
        calls("a"),
        {"role": "user", "parts": [{"text": "next"}]},
        responses("ghost"),
    ]
    assert len(D.violations(broken)) == 2
    fixed, done = D.repaired(broken)
    assert D.violations(fixed) == [] and gemini_errors(fixed) == [] and done


words = st.lists(st.sampled_from(["alpha", "error", "line", "42", "東京", "\n"]), max_size=40).map(
    " ".join
)


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": draw(words) or "task"}]}]
    for turn in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            names = [f"tool{turn}_{n}" for n in range(draw(st.integers(1, 3)))]
            contents.append(calls(*names))
            size = draw(st.sampled_from([1, 60, 600]))
            contents.append(responses(*names, text="\n".join(f"line {n}" for n in range(size))))
        else:
            contents.append({"role": "model", "parts": [{"text": draw(words) or "ok"}]})
            parts: list[dict[str, Any]] = [{"text": draw(words) or "more"}]
            if draw(st.booleans()):
                parts.append({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}})
            contents.append({"role": "user", "parts": parts})
    return contents


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(contents=conversations(), limit=st.integers(150, 8_000))
def test_compressed_contents_are_valid_within_budget_and_keep_thoughts_intact(
    contents: list[dict[str, Any]], limit: int
) -> None:
    outcome = compress(D, contents, 10, METER, POLICIES, limit=limit, low_water=0.85)
    out = list(outcome.messages)
    assert D.violations(out) == [] and gemini_errors(out) == []
    assert (
        COUNTER.request(GEMINI, {"contents": out}, "o200k_base").total + 10
        == outcome.tokens_out + 3
    )
    for turn in out:
        if any("thoughtSignature" in p for p in turn.get("parts", [])):
            assert any(orjson.dumps(turn) == orjson.dumps(original) for original in contents)
    if outcome.fits:
        assert outcome.tokens_out <= limit
    assert (
        compress(D, contents, 10, METER, POLICIES, limit=limit, low_water=0.85).messages
        == outcome.messages
    )


def test_the_largest_text_of_a_turn_can_be_a_function_response() -> None:
    """Truncate cuts a turn's largest text: in Gemini a tool's output sits in a
    functionResponse, which is read and written as `tool_results` and `with_tool_result` do."""
    log = "\n".join(f"line {n}" for n in range(500))
    item = {
        "role": "user",
        "parts": [
            {"text": "and here is the log"},
            {"functionResponse": {"name": "read", "response": {"output": log}}},
        ],
    }
    assert D.largest_text(item) == log
    cut = D.with_largest_text(item, "line 0\n[…]\nline 499")
    assert cut["parts"][0] == item["parts"][0]
    assert cut["parts"][1] == {
        "functionResponse": {"name": "read", "response": {"output": "line 0\n[…]\nline 499"}}
    }
    assert item["parts"][1]["functionResponse"]["response"]["output"] == log  # not mutated
    shorter = {**item, "parts": [{"text": log + "!"}, item["parts"][1]]}
    assert D.with_largest_text(shorter, "x")["parts"] == [{"text": "x"}, item["parts"][1]]
