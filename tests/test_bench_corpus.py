"""The fidelity bench's session files and measures, on small inputs whose answers are known:
the folder format (bench/corpus.py), the committed real-text and real-CLI sessions, next-action
evidence (bench/evidence.py), the oldest-first baseline, prompt-cache billing, the reduction
bands, the targets (bench/fidelity_report.py), and the exploring agent's fact planting and
moves (bench/explore.py)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import capture, corpus, evidence, explore, fidelity, fidelity_report, sessions
from bench.sessions import Call, Session, Tool, Turn
from brim.policies.tokens import REPLY_PRIMING, TokenCounter
from brim.policies.wires import WIRES
from brim.proxy.resources import use_bundled_tiktoken_files


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    use_bundled_tiktoken_files()
    return TokenCounter()


# ---------------------------------------------------------------- session files


@pytest.mark.parametrize("api", list(sessions.RENDER))
def test_every_api_reads_back_into_the_session_it_was_rendered_from(api: str) -> None:
    for seed in (4, 5):
        session = sessions.generate(seed, 12_000)
        body = sessions.RENDER[api](session, None)
        parsed = corpus.neutral(api, body, seed)
        assert parsed.session.system == session.system
        assert parsed.session.tools == session.tools
        assert parsed.session.turns == session.turns
        assert orjson.dumps(sessions.RENDER[api](parsed.session, None)) == orjson.dumps(body)
        # Each turn starts at an item of the body: the prefix before it is the request a client
        # sent before that turn.
        for turn, start in enumerate(parsed.starts):
            assert orjson.dumps(sessions.RENDER[api](session, turn)) == orjson.dumps(
                WIRES[api].with_conversation(body, WIRES[api].conversation(body)[:start])
            )


def test_a_folder_of_session_files_loads_and_bad_files_are_named(tmp_path: Path) -> None:
    session = sessions.generate(3, 6_000)
    made = corpus.SessionFile(
        "held-out-1", "held-out", "anthropic.messages", sessions.messages_body(session), ["x"]
    )
    corpus.save(tmp_path, made)
    plain = {**made.as_json(), "name": "held-out-2", "api": "openai.chat"}
    plain["body"] = sessions.chat_body(session)
    (tmp_path / "two.json").write_bytes(orjson.dumps(plain))
    (tmp_path / "notes.txt").write_text("not a session")  # other files are not read
    loaded = corpus.load(tmp_path)
    assert [f.name for f in loaded] == ["held-out-1", "held-out-2"]
    assert loaded[0].body == made.body and loaded[0].facts == ["x"]
    assert gzip.decompress((tmp_path / "held-out-1.json.gz").read_bytes())  # gzipped

    (tmp_path / "bad.json").write_bytes(orjson.dumps({**plain, "api": "openai.completions"}))
    with pytest.raises(corpus.SessionFileError, match=r"bad\.json: `api` must be one of"):
        corpus.load(tmp_path)
    (tmp_path / "bad.json").write_bytes(orjson.dumps({**plain, "name": "held-out-1"}))
    with pytest.raises(corpus.SessionFileError, match="used twice: held-out-1"):
        corpus.load(tmp_path)
    (tmp_path / "bad.json").write_bytes(orjson.dumps({**plain, "body": {"messages": []}}))
    with pytest.raises(corpus.SessionFileError, match=r"`body` must be a openai\.chat request"):
        corpus.load(tmp_path)


def test_a_session_file_is_sent_as_it_came_on_its_own_api_and_rendered_on_the_others() -> None:
    session = sessions.generate(3, 8_000)
    body = sessions.messages_body(session)
    body["messages"][0]["content"] = [  # what the neutral form has no place for
        {"type": "text", "text": body["messages"][0]["content"], "cache_control": {"x": 1}}
    ]
    made = corpus.SessionFile("s", "f", "anthropic.messages", body, [])
    subject = fidelity.file_subject(made)
    check = fidelity.checkers()
    assert subject.request("anthropic.messages") is body
    for point in subject.points():
        for api in fidelity.APIS:
            request = subject.request(api, point)
            items = WIRES[api].conversation(request)
            assert check[api](items) == [], (api, point)
            if api == "anthropic.messages":
                assert items == body["messages"][: len(items)]
                assert "cache_control" in orjson.dumps(request).decode()
            else:
                assert request == sessions.RENDER[api](subject.session, point)


CORPUS = sorted(fidelity.CORPUS.glob("*.json.gz"))


def test_the_committed_sessions_are_real_text_and_real_cli_traffic() -> None:
    """The committed session files: modest in size, with facts that are in them, assistant
    turns that act on earlier results, and for the CLIs the CLIs' own prompts and tools."""
    assert sum(path.stat().st_size for path in CORPUS) < 2.5 * 2**20
    files = [corpus.read(path) for path in CORPUS]
    families = {f.family for f in files}
    assert families == {"real-text", "real-cli"}
    apis = {f.api for f in files if f.family == "real-cli"}
    assert apis == {"anthropic.messages", "openai.responses"}
    for made in files:
        subject = fidelity.file_subject(made)
        text = evidence.plain(made.body)
        assert made.facts and all(evidence.found(fact, text) for fact in made.facts)
        used = 0  # assistant turns acting on earlier results: 20 tokens of evidence at least
        for point in subject.points()[:-1]:
            used += len(subject.evidence.of(point))
            if used > 20:
                break
        assert used > 20, made.name
        tools = {t.name for t in subject.session.tools}
        calls = {c.name for t in subject.session.turns for c in t.calls}
        if made.api == "anthropic.messages":  # Claude Code: its prompt, its own tools
            assert "Claude Code" in text and {"Read", "Grep", "Bash"} == tools == calls
        elif made.api == "openai.responses":  # Codex: its prompt, its shell tool
            assert "Codex CLI" in text and calls == {"exec_command"} and "exec_command" in tools
        else:
            assert calls <= {"read_file", "grep", "run_command"}
        # Every call answered, as the provider's rules want (a grep may print nothing).
        assert fidelity.checkers()[made.api](WIRES[made.api].conversation(made.body)) == []
        assert sum(bool(c.result) for t in subject.session.turns for c in t.calls) > 0.9 * sum(
            len(t.calls) for t in subject.session.turns
        )


# ---------------------------------------------------------------- next-action evidence


def tiny_session() -> Session:
    """A session whose evidence is known: turn 2 uses a path and a line number that a grep
    result (turn 1) printed first; turn 3 names a file the system prompt named, a number a
    user gave, and a commit hash the read result printed."""
    system = "You are a coding agent. The settings live in config.py."
    tools = [Tool("run_command", "Run a command.", {"type": "object"})]
    grep = "src/app/http.py:120:    retries = 3\nsrc/app/db.py:44:    RETRY_LIMIT = 5"
    read = "118 def send():\n120     retries = 3  # since 9f3c2e1\n"
    return Session(
        7,
        system,
        tools,
        [
            Turn("user", "Find why requests give up after 3 tries; ticket 4711."),
            Turn(
                "assistant",
                None,
                (Call("call_1", "run_command", {"command": "grep -rn retr src"}, grep),),
            ),
            Turn(
                "assistant",
                "src/app/http.py:120 sets retries; reading it.",
                (
                    Call(
                        "call_2",
                        "run_command",
                        {"command": "sed -n 100,140p /w/src/app/http.py"},
                        read,
                    ),
                ),
            ),
            Turn("assistant", "Per 4711, config.py and commit 9f3c2e1 decide it; 12051 is no id."),
        ],
    )


def test_evidence_is_what_a_turn_uses_that_a_tool_result_printed_first() -> None:
    found = evidence.Evidence(tiny_session())
    assert found.of(1) == ()  # its words come from the user
    # The path as the result printed it (the absolute one's tail), and the line number; not
    # "100" and "140", which no result printed.
    assert found.of(2) == ("src/app/http.py", "120")
    # config.py: the system prompt's; 4711: the user's; 9f3c2e1: the read result's.
    assert found.of(3) == ("9f3c2e1",)


def test_tokens_match_whole_and_requests_are_read_as_a_model_reads_them() -> None:
    assert evidence.found("120", "line 120: x")
    assert not evidence.found("120", "line 1205") and not evidence.found("120", "took 0.120 s")
    assert evidence.found("src/app/http.py", "at /w/src/app/http.py, line")
    assert not evidence.found("http.py", "http.pyc")
    body = {"messages": [{"role": "tool", "content": "a\nsrc/app/http.py:120: x"}]}
    assert evidence.found("src", evidence.plain(body))  # not `\nsrc` as in the JSON text
    arguments = {"tool_calls": [{"function": {"arguments": '{"path": "src/app/db.py"}'}}]}
    assert evidence.found("src/app/db.py", evidence.plain(arguments))
    kept = evidence.judge(("src/app/http.py", "120", "9f3c2e1"), "src/app/http.py", ["x 120 y"])
    assert kept.kept == ("src/app/http.py",)
    assert kept.recoverable == ("src/app/http.py", "120")


def test_evidence_of_a_compressed_replay_counts_only_what_the_provider_would_take(
    counter: TokenCounter,
) -> None:
    """A generated session replayed at a window its requests overflow: every compressed
    request gets its next turn's evidence judged, in its reduction band; a method without a
    store recovers nothing beyond what it kept."""
    session = sessions.generate(5, 20_000)
    subject = fidelity.Subject("s", "generated", session, fidelity.facts_of(session))
    check = fidelity.checkers()["openai.chat"]
    run = fidelity.grow(subject, fidelity.OLDEST_FIRST, "openai.chat", 8_192, 8, counter, check)
    assert run.turns == len(run.points) > 0
    for point in run.points:
        expected = subject.evidence.of(point.turns) if point.turns < len(session.turns) else ()
        assert point.evidence == len(expected)
        assert point.evidence_recoverable == point.evidence_kept <= point.evidence
        assert point.band == fidelity.band_of(point.tokens_in / run.budget)
        assert len(point.lost) == point.evidence - point.evidence_kept


# ---------------------------------------------------------------- the oldest-first baseline


@pytest.mark.parametrize("api", list(sessions.RENDER))
def test_oldest_first_drops_whole_turns_oldest_first_and_stays_valid(
    api: str, counter: TokenCounter
) -> None:
    session = sessions.generate(4, 20_000)
    body = sessions.RENDER[api](session, None)
    wire = WIRES[api]
    items = wire.conversation(body)
    system = 1 if api == "openai.chat" else 0
    task = items[system : system + 1]  # the first user message
    assert wire.dialect.role(task[0]) == "user"
    total = counter.request(wire, body, fidelity.tokenizer_of(api), fidelity.MODELS[api]).total
    check = fidelity.checkers()[api]
    tails = []
    least = fidelity.least_tokens(api, body, counter)  # system prompt, tools, newest turn
    for factor in (1.3, 2.5, 5.0, total / least):
        budget = int(total / factor)
        sent = fidelity.oldest_first(api, body, budget, counter)
        kept = wire.conversation(sent)
        tokens = counter.request(wire, sent, fidelity.tokenizer_of(api), fidelity.MODELS[api]).total
        assert check(kept) == [], (api, factor)
        assert fidelity.system_kept(api, body, sent) and kept[-1] == items[-1]
        # The system prompt, the task while anything else is kept, and the newest turns: a
        # tail of the conversation, whole turns.
        rest = kept[system:]
        if len(rest) > 1 and rest[:1] == task:
            rest = rest[1:]
        assert rest == items[len(items) - len(rest) :], (api, factor)
        tails.append(len(rest))
        units = wire.dialect.units(kept)
        assert units[system].kind == "user" or len(units) == system + 1
        assert tokens <= budget, (api, factor)
        if factor < 10:
            assert kept[system:][:1] == task, (api, factor)
    assert tails == sorted(tails, reverse=True) and tails[0] > tails[-1]
    # Nothing but the system prompt and the newest turn fit the least budget: the task went too.
    assert sent == fidelity.least_request(api, body)
    assert fidelity.oldest_first(api, body, total, counter) == body  # it fits: untouched


# ---------------------------------------------------------------- prompt-cache billing


def test_billed_input_reads_the_shared_prefix_and_writes_the_rest(counter: TokenCounter) -> None:
    api = "openai.chat"
    wire = WIRES[api]
    session = sessions.generate(3, 6_000)
    before = sessions.chat_body(session)
    items = wire.conversation(before)
    after = wire.with_conversation(before, [*items, {"role": "user", "content": "and now?"}])
    total = counter.request(wire, after, "o200k_base", fidelity.MODELS[api]).total
    shared = counter.request(wire, before, "o200k_base", fidelity.MODELS[api]).total - REPLY_PRIMING
    cached, cost = fidelity.billed(api, before, after, counter)
    assert cached == shared
    assert cost == pytest.approx(0.1 * shared + 1.25 * (total - shared))
    # Nothing before it, or other tools (the cache starts with them): all written.
    assert fidelity.billed(api, None, after, counter) == (0, pytest.approx(1.25 * total))
    other = {**after, "tools": after["tools"][:-1]}
    assert fidelity.billed(api, before, other, counter)[0] == 0
    # The same request again: all read.
    cached, cost = fidelity.billed(api, after, after, counter)
    assert cached == total - REPLY_PRIMING and cost == pytest.approx(
        0.1 * cached + 1.25 * REPLY_PRIMING
    )
    # A cut in the middle: only the items before it are read.
    cut = wire.with_conversation(after, [items[0], *items[3:], after["messages"][-1]])
    head = counter.request(
        wire, wire.with_conversation(before, items[:1]), "o200k_base", fidelity.MODELS[api]
    ).total
    assert fidelity.billed(api, before, cut, counter)[0] == head - REPLY_PRIMING


def test_reduction_bands() -> None:
    assert [fidelity.band_of(r) for r in (1.0, 2.5, 2.51, 5.0, 7.0, 10.0, 10.5)] == [
        "≤ 2.5×",
        "≤ 2.5×",
        "2.5–5×",
        "2.5–5×",
        "5–10×",
        "5–10×",
        "> 10×",
    ]
    assert fidelity.BANDS == ("≤ 2.5×", "2.5–5×", "5–10×", "> 10×")


# ---------------------------------------------------------------- targets


def report_with(**changes: Any) -> dict[str, Any]:
    """A tiny report every target passes on, with `changes`."""
    sessions_ = [{"family": "generated"}, {"family": "real-text"}]
    row = {
        "family": "real-text",
        "method": fidelity.BRIM,
        "api": "openai.chat",
        "refused": 0,
        "valid_pct": 100.0,
        "within_budget_pct": 100.0,
        "system_kept_pct": 100.0,
        "newest_kept_pct": 100.0,
    }
    case = {
        "method": fidelity.BRIM,
        "family": "real-text",
        "api": "openai.chat",
        "impossible": False,
        "band": "≤ 2.5×",
        **{f"facts_{w}": 3 for w in ("older", "recent", "lookalike")},
        **{f"facts_{w}_kept": 3 for w in ("older", "recent", "lookalike")},
    }
    evidence_rows = [
        {
            "family": "real-text",
            "band": band,
            "method": method,
            "api": "openai.chat",
            "kept_pct": kept,
            "evidence": 20,
            "kept": kept / 5,
        }
        for band in fidelity.BANDS[:3]
        for method, kept in ((fidelity.BRIM, 95.0), (fidelity.OLDEST_FIRST, 50.0))
    ]
    window = {
        "refused": 0,
        "valid_pct": 100.0,
        "within_budget_pct": 100.0,
        "system_kept_pct": 100.0,
        "newest_kept_pct": 100.0,
        "prefix_kept_pct": 96.0,
        "billed_vs_ceiling": 1.1,
    }
    growth = [
        {"family": "real-text", "method": fidelity.BRIM, "api": "openai.chat", "8192": window},
        {
            "family": "real-text",
            "method": fidelity.CEILING,
            "api": "openai.chat",
            "8192": {**window, "prefix_kept_pct": 100.0, "billed_vs_ceiling": 1.0},
        },
    ]
    budget = [
        {
            "family": "real-text",
            "method": fidelity.BRIM,
            "api": "openai.chat",
            "band": "≤ 2.5×",
            "cut_into_text": 4,
            "cut_into_text_under_80": 0,
        }
    ]
    report = {
        "sessions": sessions_,
        "fidelity": [row],
        "cases": [case, {**case, "band": "5–10×"}],
        "evidence": evidence_rows,
        "budget": budget,
        "growth": growth,
    }
    return report | changes


def test_every_target_passes_on_a_report_that_meets_it_and_each_miss_is_named() -> None:
    targets = fidelity_report.targets(report_with())
    assert len(targets) == 10 and all(t.passed for t in targets), [t.line() for t in targets]
    # the evidence lines end with brim's and oldest-first's figures over all their cells
    assert targets[4].detail.endswith("; pooled: brim 95 %, oldest-first 50 %")
    base = report_with()
    misses = {
        0: {"fidelity": [{**base["fidelity"][0], "newest_kept_pct": 90.0}]},
        1: {"cases": [{**base["cases"][0], "facts_older_kept": 2}, base["cases"][1]]},
        2: {
            "cases": [
                base["cases"][0],
                {**base["cases"][1], "facts_older_kept": 0, "facts_lookalike_kept": 0},
            ]
        },
        3: {"cases": [base["cases"][0], {**base["cases"][1], "facts_recent_kept": 2}]},
        4: {
            "evidence": [
                {**r, "kept_pct": 89.0}
                if r["band"] == "≤ 2.5×" and r["method"] == fidelity.BRIM
                else r
                for r in base["evidence"]
            ]
        },
        5: {
            "evidence": [
                {**r, "kept_pct": 84.0}
                if r["band"] == "5–10×" and r["method"] == fidelity.BRIM
                else r
                for r in base["evidence"]
            ]
        },
        6: {"evidence": [{**r, "kept_pct": 95.0} for r in base["evidence"]]},
        7: {"budget": [{**base["budget"][0], "cut_into_text_under_80": 1}]},
        8: {
            "growth": [
                {
                    **base["growth"][0],
                    "8192": {**base["growth"][0]["8192"], "prefix_kept_pct": 94.0},
                },
                base["growth"][1],
            ]
        },
        9: {
            "growth": [
                {
                    **base["growth"][0],
                    "8192": {**base["growth"][0]["8192"], "billed_vs_ceiling": 1.3},
                },
                base["growth"][1],
            ]
        },
    }
    for index, change in misses.items():
        targets = fidelity_report.targets(report_with(**change))
        assert [n for n, t in enumerate(targets) if not t.passed] == [index], [
            t.line() for t in targets
        ]
        assert targets[index].line().startswith("MISS  ") and "real-text" in targets[index].detail


# ---------------------------------------------------------------- the exploring agent


def test_a_planted_fact_is_a_copy_of_a_line_of_its_file_with_one_number_changed(
    tmp_path: Path,
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        '"""A module.\n\nRetries 25 times, waits 300 ms.\n"""\n\nX = 12  # not copied: code\n'
        "# see issue 4821 for the timeout\nvalue = 3\n"
    )
    (tmp_path / "CHANGES.rst").write_text("Version 2.1\n-----------\n\nReleased 2024-05-01\n")
    planted = explore.plant(tmp_path, random.Random(3), share=1.0)
    assert {p.path for p in planted} == {"pkg/mod.py", "CHANGES.rst"}
    everything = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    for fact in planted:
        lines = (tmp_path / fact.path).read_text().split("\n")
        copy, original = lines[fact.line - 1], lines[fact.line - 2]
        assert copy.strip() == fact.text
        # The original line with one of its numbers replaced by the needle.
        assert any(
            original[: m.start()] + fact.needle + original[m.end() :] == copy
            for m in explore.NUMBER.finditer(original)
        )
        assert everything.count(fact.needle) == 1 and len(fact.needle) >= 5
    mod = next(p for p in planted if p.path == "pkg/mod.py")
    assert "X = " not in mod.text  # only comments and docstring lines are copied in code
    compile((tmp_path / "pkg" / "mod.py").read_text(), "mod.py", "exec")  # still Python


def test_the_explorer_acts_on_what_a_result_printed(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("def handler():\n    return 1\n" * 30)
    agent = explore.Explorer(tmp_path, seed=1)
    grep = explore.Step("shell", {"command": "grep -rn handler src"}, None)
    moves = agent.moves(explore.Seen(grep, "src/app.py:41:def handler():\nsrc/missing.py:3:x"))
    kinds = {kind for kind, _ in moves}
    assert {"read around a line", "read a file", "grep a name"} <= kinds
    read = next(step for kind, step in moves if kind == "read around a line")
    assert read.arguments == {"path": "src/app.py", "start": 21, "count": 50}
    assert read.uses == ("src/app.py", "41")
    assert all("missing.py" not in str(step.arguments) for _, step in moves)  # no such file
    assert explore.run_step(read, tmp_path).startswith("    21\t")
    # The first steps are the openers; then each acts on an earlier result.
    first = agent.next()
    assert first is not None and first.arguments == {"command": "ls -la"}
    agent.seen(first, explore.run_step(first, tmp_path))
    assert "src" in agent.history[0].result


def test_each_cli_makes_the_agents_steps_with_its_own_tools(tmp_path: Path) -> None:
    read = explore.Step("read", {"path": "src/a.py", "start": 21, "count": 50}, "Reading.")
    grep = explore.Step("grep", {"pattern": "it's", "path": "src"}, None)
    shell = explore.Step("shell", {"command": "git log --oneline -n 5"}, None)
    root = tmp_path.resolve()
    assert capture.CLAUDE.call(read, root) == (
        "Read",
        {"file_path": str(root / "src/a.py"), "offset": 21, "limit": 50},
    )
    name, arguments = capture.CLAUDE.call(grep, root)
    assert name == "Grep" and arguments["path"] == str(root / "src")
    assert arguments["output_mode"] == "content" and arguments["-n"] is True
    assert capture.CLAUDE.call(shell, root) == (
        "Bash",
        {"command": "git log --oneline -n 5", "description": "git log --oneline -n 5"},
    )
    name, arguments = capture.CODEX.call(read, root)
    assert name == "exec_command" and arguments["cmd"] == "cat -n src/a.py | sed -n '21,70p'"
    assert arguments["login"] is False  # a login shell would set PATH anew, without pytest
    name, arguments = capture.CODEX.call(grep, root)
    assert arguments["cmd"] == "grep -rn --exclude-dir=.git -e 'it'\\''s' src | head -n 60"
    # What the bench's own tools answer is what the commands print.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1  # it's\n")
    assert explore.run_step(grep, tmp_path) == "src/a.py:1:x = 1  # it's"
