"""The fidelity bench, at its quick size, so it cannot rot (the real run is
`python -m bench.fidelity`); and its session generator, rendered in every wire API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import fidelity, sessions
from policies.information import words
from policies.tokens import TokenCounter
from policies.wires import WIRES
from proxy.resources import use_bundled_tiktoken_files

COLUMNS = (
    "valid",
    "within budget",
    "system kept",
    "newest kept",
    "facts kept, older",
    "facts kept, last 8",
    "look-alike facts kept",
    "tokens / budget",
    "refused",
    "prefix kept 8K",
    "prefix kept 32K",
    "first · later · resend",
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("fidelity") / "fidelity.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.fidelity", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout


@pytest.mark.timeout(300)
def test_brim_sends_valid_requests_within_budget_on_every_api(
    quick: tuple[dict[str, Any], str],
) -> None:
    report, _ = quick
    brim_rows = [
        r for r in report["fidelity"] if r["method"] in (fidelity.BRIM, fidelity.BRIM_SUMMARIZE)
    ]
    assert {(r["factor"], r["method"], r["api"]) for r in brim_rows} == {
        (f, m, a)
        for f in fidelity.FACTORS
        for m in (fidelity.BRIM, fidelity.BRIM_SUMMARIZE)
        for a in fidelity.APIS
    }
    for row in brim_rows:
        assert row["refused"] == 0, row
        assert row["valid_pct"] == 100 and row["within_budget_pct"] == 100, row
        assert row["system_kept_pct"] == 100, row
    brim_cases = [c for c in report["cases"] if c["method"].startswith("brim")]
    assert brim_cases
    for case in brim_cases:
        assert case["tokens_out"] <= case["budget"], case
    brim_growth = [r for r in report["growth"] if r["method"].startswith("brim")]
    assert {r["method"] for r in brim_growth} == {fidelity.BRIM, fidelity.BRIM_SUMMARIZE}
    for row in brim_growth:
        for window in map(str, report["windows"]):
            assert row[window]["refused"] == 0, row  # valid_pct leaves refused turns out
            assert row[window]["valid_pct"] == 100 and row[window]["within_budget_pct"] == 100
            assert row[window]["pairs"] > 0


@pytest.mark.timeout(300)
def test_every_method_and_column_is_reported(quick: tuple[dict[str, Any], str]) -> None:
    report, table = quick
    for method in fidelity.METHODS:
        assert f"| {method} |" in table
        assert {r["factor"] for r in report["fidelity"] if r["method"] == method} == set(
            fidelity.FACTORS
        )
        assert any(r["method"] == method for r in report["growth"])
    for column in COLUMNS:
        assert column in table, column
    assert "n/a" in table  # baselines only take Chat Completions messages
    for row in report["fidelity"]:
        if row["method"] in fidelity.BASELINES:
            assert row["api"] == "openai.chat"
        for key in ("facts_older_kept_pct", "facts_recent_kept_pct", "facts_lookalike_kept_pct"):
            assert row[key] is not None and 0 <= row[key] <= 100, row
    assert all(s["facts"] > 0 and s["lookalike_facts"] > 0 for s in report["sessions"])


@pytest.mark.timeout(300)
def test_litellm_trim_messages_breaks_tool_pairing_or_budget(
    quick: tuple[dict[str, Any], str],
) -> None:
    """LiteLLM's trim_messages skips a message that does not fit and goes on with older ones,
    so a tool result can lose its call; it counts tool calls low and appends trailing tool
    messages without counting them, so it ends over budget."""
    report, _ = quick
    litellm = [c for c in report["cases"] if c["method"] == fidelity.LITELLM]
    assert litellm
    assert any(not c["valid"] for c in litellm)
    assert any("answered by" in e for c in litellm for e in c["errors"])
    assert any(not c["within"] for c in litellm)


@pytest.mark.timeout(300)
def test_a_resent_request_costs_no_summarizer_call(quick: tuple[dict[str, Any], str]) -> None:
    report, _ = quick
    rows = [r for r in report["growth"] if r["method"] == fidelity.BRIM_SUMMARIZE]
    assert rows
    for row in rows:
        for window in map(str, report["windows"]):
            assert row[window]["resend_calls"] == 0


def test_sessions_are_valid_in_every_api_and_deterministic() -> None:
    checks = fidelity.checkers()
    for seed, ending in ((4, "user"), (5, "tools")):
        session = sessions.generate(seed, 30_000)
        again = sessions.generate(seed, 30_000)
        for api, render in sessions.RENDER.items():
            body = render(session, None)
            assert orjson.dumps(body) == orjson.dumps(render(again, None))
            WIRES[api].check(body)
            items = WIRES[api].conversation(body)
            assert checks[api](items) == [], api
            for point in session.request_points():  # every request of the growing session
                assert checks[api](WIRES[api].conversation(render(session, point))) == []
        assert session.turns[-1].role == ("user" if ending == "user" else "assistant")
        facts = fidelity.facts_of(session)
        assert facts.older and facts.recent  # planted all along, and in the last 8 messages
        places = set(sessions.fact_places(session).values())
        assert {"user message"} < places
        chat = sessions.chat_body(session)
        kinds = {c["function"]["name"] for m in chat["messages"] for c in m.get("tool_calls") or []}
        assert {"read_file", "http_get", "run_build", "run_tests"} <= kinds
        paths = [
            c["function"]["arguments"]
            for m in chat["messages"]
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "read_file"
        ]
        assert len(paths) > len(set(paths))  # some file is read again


def test_lookalike_facts_look_like_their_neighbours_and_shift_no_other_turn() -> None:
    """A registry listing's planted fact has no word its listing's other lines lack, its decoys
    are no facts, and the session's other turns are those of a session without listings."""
    session = sessions.generate(3, 40_000)
    plain = sessions.generate(3, 40_000, lookalikes=False)
    listings = [t for t in session.turns if any(c.name == "run_command" for c in t.calls)]
    assert len(listings) >= 2 and not plain.lookalikes
    assert [t for t in session.turns if t not in listings] == plain.turns
    assert {f.split()[0] for f in plain.facts()} == {
        f.split()[0] for f in session.facts() if not session.is_lookalike(f)
    }
    found: list[str] = []
    for turn in listings:
        rows = turn.calls[0].result.split("\n")[2:-1]
        assert 20 <= len(rows) <= 80
        assert all(sessions.STATEMENT_PATTERN.search(row) for row in rows)
        planted = [n for n, row in enumerate(rows) if sessions.FACT_PATTERN.search(row)]
        assert 1 <= len(planted) <= 2
        for n in planted:
            others = set().union(*(words(row) for m, row in enumerate(rows) if m != n))
            assert set(words(rows[n])) <= others, rows[n]
            found += sessions.FACT_PATTERN.findall(rows[n])
    assert {f.split()[0] for f in found} == session.lookalikes
    assert all(int(f.split()[0][5:]) >= sessions.LOOKALIKE_FIRST for f in found)
    facts = fidelity.facts_of(session)
    assert set(facts.lookalike) == set(found)
    assert not set(found) & {*facts.older, *facts.recent}
    assert set(sessions.fact_places(session).values()) >= {"look-alike line"}


def test_the_window_gives_the_guard_exactly_the_target_budget() -> None:
    session = sessions.generate(6, 4_000)
    for api, render in sessions.RENDER.items():
        body = render(session, None)
        for budget in (1_000, 7_777, 50_001):
            window = fidelity.window_for(api, body, budget)
            assert fidelity.window_budget(api, body, window) == budget


def test_a_request_judged_as_sent_and_as_refused() -> None:
    use_bundled_tiktoken_files()
    session = sessions.generate(3, 6_000)
    body = sessions.RENDER["openai.chat"](session, None)
    facts = fidelity.facts_of(session)

    def judged(sent: dict[str, Any] | None) -> fidelity.Case:
        return fidelity.judge(
            "m",
            "openai.chat",
            1.0,
            session,
            body,
            sent,
            10**6,
            TokenCounter(),
            facts,
            fidelity.checkers()["openai.chat"],
            0.1,
        )

    sent = judged(body)
    assert sent.valid and sent.within and sent.system_kept and sent.newest_kept
    assert sent.facts_older_kept + sent.facts_recent_kept == len(facts.older + facts.recent)
    assert not sent.refused and sent.lost == [] and sent.tokens_out == sent.tokens_in
    refused = judged(None)
    assert refused.refused and refused.tokens_out is None
    assert not (refused.valid or refused.within or refused.system_kept or refused.newest_kept)
    assert refused.facts_older_kept == refused.facts_recent_kept == 0
    assert len(refused.lost) == len(facts.all()) > 0
