"""compress() over generated conversations: valid, within budget, protective, deterministic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from brim.policies.compress import DEFAULT_ORDER, Outcome, build_policies, compress
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.chat import CHAT, ChatDialect
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import tool_turn
from tests.fakes import pairing_errors

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
METER = CounterMeter(COUNTER, "o200k_base", "gpt-4o", CHAT)
DIALECT = ChatDialect()
POLICIES = build_policies(DEFAULT_ORDER, {})
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAgAAAAIACAIAAAB7GkOtAAAA"

words = st.lists(
    st.sampled_from(["alpha", "beta", "gamma", "error", "line", "42", "{", "}", "é", "東京", "\n"]),
    max_size=60,
)
text = words.map(" ".join)


@st.composite
def generated_tool_turn(draw: Any, turn: int) -> list[dict[str, Any]]:
    calls = draw(st.integers(1, 3))
    ids = [f"call_{turn}_{n}" for n in range(calls)]
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.one_of(st.none(), text)),
        "tool_calls": [
            {
                "id": i,
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(["read_file", "grep", "bash"])),
                    "arguments": orjson.dumps({"n": turn}).decode(),
                },
            }
            for i in ids
        ],
    }
    if draw(st.booleans()):
        assistant["reasoning_content"] = draw(text)
    results = []
    for call_id in ids:
        size = draw(st.sampled_from([0, 50, 400, 3000]))
        if draw(st.booleans()):
            body = orjson.dumps(
                {"items": [{"n": n, "url": f"https://x/{n}", "v": None} for n in range(size // 20)]}
            ).decode()
        else:
            body = "\n".join(f"log line {n}: " + "value " * 5 for n in range(size // 10))
        results.append({"role": "tool", "tool_call_id": call_id, "content": body})
        if draw(st.integers(0, 9)) == 0:  # a duplicated result
            results.append({"role": "tool", "tool_call_id": call_id, "content": "again"})
    if draw(st.integers(0, 9)) == 0 and results:  # a lost result
        results.pop()
    return [assistant, *results]


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text) or "Be helpful."}]
    if draw(st.booleans()):
        messages.append({"role": "developer", "content": draw(text) or "Use tools."})
    for turn in range(draw(st.integers(1, 14))):
        kind = draw(
            st.sampled_from(
                ["user", "user-parts", "assistant", "tools", "tools", "giant", "orphan"]
            )
        )
        if kind == "user":
            messages.append({"role": "user", "content": draw(text) or "go"})
        elif kind == "user-parts":
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": draw(text) or "look"},
                        {
                            "type": "image_url",
                            "image_url": {
                                "url": PNG,
                                "detail": draw(st.sampled_from(["low", "high"])),
                            },
                        },
                    ],
                }
            )
        elif kind == "assistant":
            messages.append(
                {"role": "assistant", "content": draw(text) or "ok", "x_vendor": {"kept": True}}
            )
        elif kind == "tools":
            messages += draw(generated_tool_turn(turn))
        elif kind == "giant":
            messages.append(
                {"role": "user", "content": "giant paste line\n" * draw(st.integers(500, 3000))}
            )
        else:
            messages.append({"role": "tool", "tool_call_id": f"lost_{turn}", "content": "orphaned"})
    messages.append({"role": "user", "content": "And now the final question?"})
    return messages


def run(messages: list[dict[str, Any]], limit: int, repair: bool = True) -> Outcome:
    return compress(
        DIALECT, messages, 3, METER, POLICIES, limit=limit, low_water=0.85, repair=repair
    )


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=conversations(), limit=st.integers(150, 12_000))
def test_compressed_requests_are_valid_within_budget_and_keep_what_matters(
    messages: list[dict[str, Any]], limit: int
) -> None:
    outcome = run(messages, limit)
    event("refused" if not outcome.fits else ("compressed" if outcome.records else "untouched"))
    event(f"policies run: {len(outcome.tried)}")
    out = [dict(m) for m in outcome.messages]
    assert DIALECT.violations(outcome.messages) == []
    assert pairing_errors(out) == []
    exact = COUNTER.request(CHAT, {"messages": out}, "o200k_base").total
    assert exact == outcome.tokens_out
    if not outcome.fits:  # the guard answers 400; nothing more to check
        return
    assert exact <= limit
    system = messages[0]
    assert out[0] == system or (
        out[0]["role"] == "system" and "cut from the middle by brim" in out[0]["content"]
    )
    last_user = messages[-1]
    assert last_user in out or any(
        "cut from the middle by brim" in str(m.get("content")) for m in out if m["role"] == "user"
    )
    assert run(messages, limit).messages == outcome.messages  # deterministic


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages=conversations())
def test_requests_that_fit_and_pair_correctly_are_left_alone(
    messages: list[dict[str, Any]],
) -> None:
    repaired, _ = DIALECT.repaired(messages)
    outcome = run(repaired, 10_000_000)
    assert not outcome.changed
    assert outcome.actions == "none"
    assert all(a is b for a, b in zip(outcome.messages, repaired, strict=True))


def growing_session(turns: int, lines: int) -> list[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Find the rounding bug."},
    ]
    snapshots = []
    for turn in range(turns):
        if turn and turn % 10 == 0:
            messages.append({"role": "user", "content": f"Also check module {turn}."})
        snapshots.append(list(messages))
        output = "\n".join(f"def f_{turn}_{n}(v): return v * {n}" for n in range(lines))
        messages += tool_turn(f"c{turn}", output, said=f"step {turn}")
    return snapshots


@pytest.mark.parametrize(
    ("window", "lines", "floor"),
    [
        (32_768, (40,), 0.95),
        (128_000, (100,), 0.95),
        # Turns of four sizes, pooled: where a cut lands on the batch grid moves with a few
        # tokens of a notice, and one size alone by ±3 of its ~86 pairs (40 lines: 34 of 86 kept
        # with commas between listed names, 31 with spaces; all four: 126 and 125 of 339).
        # 40 lines alone kept 47 before the recent results were spared the batches (the results
        # that turn older each turn join the cleared set at their place, not ahead of need),
        # 42 before evict put back the units a batch's long last unit left room for.
        (8_192, (30, 35, 40, 45), 0.36),
        pytest.param(
            8_192,
            (120,),
            0.7,
            marks=pytest.mark.xfail(
                strict=True,
                reason="issue 35: since text is cut only as far as the budget needs, turns of "
                "~1 500 tokens at 8K re-cut every turn from scratch: none of 94 prefixes kept "
                "(0.7 held while older results were digested ahead of need); the guard's "
                "carry-forward keeps more (tests/middleware/stages/test_guard.py)",
            ),
        ),
    ],
)
def test_the_compressed_prefix_is_kept_by_the_next_request(
    window: int, lines: tuple[int, ...], floor: float
) -> None:
    """Compressed from scratch every turn (no session memory), the snapped batches keep the cut
    where it was while the session grows within them: the batch is the slack between the limit
    and the low-water mark (about 1 100 tokens at 8K), so turns of about 520 tokens move the cut
    every second turn at most. (A turn larger than the slack moves it every turn: the recent
    turns stay whole, and carrying the compressed request forward keeps the prefix then,
    `tests/policies/test_carry.py`.)"""
    limit = int(window * 0.95) - 512
    pairs = kept = 0
    for size in lines:
        previous: tuple[Any, ...] | None = None
        previous_prefix = 0
        for snapshot in growing_session(100, size):
            current = run(snapshot, limit).messages
            if previous is not None and previous_prefix:
                shared = 0
                while (
                    shared < min(len(previous), len(current))
                    and previous[shared] == current[shared]
                ):
                    shared += 1
                pairs += 1
                kept += shared >= previous_prefix
            changed = [
                i for i, m in enumerate(current) if not any(m is original for original in snapshot)
            ]
            previous, previous_prefix = current, (max(changed) + 1 if changed else 0)
    assert pairs >= 10
    assert kept / pairs >= floor, (kept, pairs)


@pytest.mark.parametrize(
    "api", ["openai.chat", "anthropic.messages", "openai.responses", "gemini.generate"]
)
def test_a_large_newest_result_that_fits_the_budget_is_never_cut(api: str) -> None:
    """A session ending in a large tool result, the newest message: the older turns go, and the
    result stays whole, because it fits the budget beside the task — the low-water mark is for
    reversible cuts only, never a reason to cut into text."""
    from brim.policies.compress import compress_request
    from brim.policies.wires import WIRES
    from tests.test_wire_contract import CASES

    case = CASES[api]
    wire = WIRES[api]
    meter = CounterMeter(COUNTER, "o200k_base", "gpt-4o", wire)
    items = [case.user("Why does the nightly build fail? Read the logs and tell me.")]
    for turn in range(6):
        lines = [f"old output {turn}.{i}: step finished in {i} ms" for i in range(120)]
        items += case.tool_turn(f"old_{turn}", "\n".join(lines))
    newest = "\n".join(f"build log line {i}: compiling module number {i}" for i in range(1_040))
    items += case.tool_turn("newest", newest)
    body = case.body("m", items, False)
    limit = 15_000
    outcome = compress_request(body, meter, POLICIES, limit=limit, low_water=0.85)
    assert outcome.tokens_in > limit and outcome.fits
    assert not any(record.policy == "truncate" for record in outcome.records)
    assert outcome.messages[-1] == items[-1]  # the newest result as the client sent it
    assert case.violations(list(outcome.messages)) == []


SAME_EVERYWHERE = """
import hashlib, orjson
from brim.proxy.resources import use_bundled_tiktoken_files
use_bundled_tiktoken_files()
from bench import sessions
from bench.sessions import MODELS, RENDER
from brim.policies.compress import DEFAULT_ORDER, build_policies, compress_request
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires import WIRES
counter, session = TokenCounter(), sessions.generate(1, 60_000)
for api, wire in sorted(WIRES.items()):
    body = RENDER[api](session, None)
    meter = CounterMeter(counter, "o200k_base", MODELS[api], wire)
    limit = int(counter.request(wire, body, "o200k_base", MODELS[api]).total / 2.5)
    out = compress_request(body, meter, build_policies(DEFAULT_ORDER, {}), limit=limit,
                           low_water=0.85)
    print(api, hashlib.sha256(orjson.dumps(out.messages)).hexdigest())
"""


@pytest.mark.timeout(120)
def test_every_process_compresses_a_request_to_the_same_bytes() -> None:
    """Two brim processes (instances behind a load balancer, a restart) cut the same request to
    the same bytes, so a provider's prompt cache holds across them: nothing depends on the
    per-process hash seed (a sum of word scores taken in a frozenset's order did: ties between
    lines a digest keeps flipped from one process to the next, in every session at 2.5x)."""
    root = Path(__file__).parents[2]
    outputs = [
        subprocess.run(
            [sys.executable, "-c", SAME_EVERYWHERE],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root / ".pythonpath")},
        ).stdout
        for seed in ("1", "2")
    ]
    assert len(outputs[0].splitlines()) == 4
    assert outputs[0] == outputs[1]


class CountingDialect(ChatDialect):
    """Chat, counting how often the pairing is checked."""

    def __init__(self) -> None:
        self.checks = 0

    def violations(self, messages: Any) -> list[str]:
        self.checks += 1
        return super().violations(messages)


class DropsAResult:
    """A policy that drops the first tool result: the request no longer pairs."""

    name = "drops_a_result"

    def apply(self, conversation: Any, goal: Any, meter: Any) -> tuple[Any, list[Any]]:
        first = next(i for i, m in enumerate(conversation.messages) if m["role"] == "tool")
        return conversation.keep(lambda index: index != first, {}), []


class RewritesResults:
    """A policy that only rewrites the texts of tool results (as prune and clear do)."""

    name = "rewrites_results"

    def apply(self, conversation: Any, goal: Any, meter: Any) -> tuple[Any, list[Any]]:
        dialect = conversation.dialect
        changes = {}
        for index, message in enumerate(conversation.messages):
            if message["role"] == "tool":
                short = dialect.with_tool_result(message, message["tool_call_id"], "short")
                changes[index] = (short, meter.message(short))
        return conversation.with_results(changes), []


def long_tool_session(turns: int = 6) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Find the rounding bug."},
    ]
    for turn in range(turns):
        output = "\n".join(f"def f_{turn}_{n}(v): return v * {n}" for n in range(150))
        messages += tool_turn(f"c{turn}", output)
    messages.append({"role": "user", "content": "And now?"})
    return messages


def test_pairing_is_not_checked_again_where_only_result_texts_were_rewritten() -> None:
    dialect = CountingDialect()
    messages = long_tool_session()
    for policies in ([RewritesResults()], POLICIES[:2]):  # a stub, and prune and clear
        dialect.checks = 0
        outcome = compress(dialect, messages, 3, METER, policies, limit=1_500, low_water=0.85)
        assert outcome.tokens_out < outcome.tokens_in and not outcome.repairs
        assert dialect.checks == 1  # the request as it came, not the one made from it
        assert not pairing_errors(list(outcome.messages))


def test_pairing_is_checked_again_and_repaired_after_a_policy_changes_the_structure() -> None:
    dialect = CountingDialect()
    messages = long_tool_session()
    policies = [DropsAResult(), RewritesResults()]
    outcome = compress(dialect, messages, 3, METER, policies, limit=1_500, low_water=0.01)
    assert outcome.tried == ("drops_a_result", "rewrites_results")
    assert dialect.checks == 2
    assert outcome.repairs  # the call whose result went got one again
    assert not pairing_errors(list(outcome.messages))
    # Without repair up front nothing was checked: the end checks (and repairs) as before.
    dialect.checks = 0
    outcome = compress(
        dialect, messages, 3, METER, [RewritesResults()], limit=1_500, low_water=0.85, repair=False
    )
    assert dialect.checks == 1
