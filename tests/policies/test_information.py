"""Shrinking by information, on every wire API: exact copies become pointers, superseded and
uninformative results go first, long results keep their task lines, error lines and task items,
and no text is cut while the request is under its target."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from brim.policies.clear import ClearSettings, ClearToolResults
from brim.policies.compress import DEFAULT_ORDER, build_policies, compress
from brim.policies.conversation import Conversation, Goal, archive_key
from brim.policies.evict import Evict, EvictSettings
from brim.policies.facts import STALE, call_terms, requests, result_values, stale_results
from brim.policies.information import (
    fitting,
    gist,
    name_counts,
    names,
    names_fitting,
    ranked_names,
)
from brim.policies.prune import PruneSettings, PruneToolResults
from brim.policies.text import (
    NAMES_LABEL,
    NAMES_SEPARATOR,
    SAME_AS_PREFIX,
    has_evidence,
    is_anomaly,
    names_line,
    terms_of,
)
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.truncate import Truncate
from brim.policies.wires import WIRES
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import without_named_whole

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
Item = dict[str, Any]
Call = tuple[str, str, dict[str, Any], str]  # call id, tool, args, result


@dataclass(frozen=True)
class Builder:
    """Small conversations in one wire API's shape."""

    api: str
    user: Callable[[str], Item]
    said: Callable[[str], Item]  # plain assistant text
    turns: Callable[[list[Call]], list[Item]]  # one assistant turn making these calls, answered

    @property
    def meter(self) -> CounterMeter:
        return CounterMeter(COUNTER, "o200k_base", "gpt-4o", WIRES[self.api])

    def conversation(self, items: list[Item]) -> Conversation:
        return Conversation.of(WIRES[self.api].dialect, items, self.meter, 3)

    def turn(self, call_id: str, tool: str, args: dict[str, Any], result: str) -> list[Item]:
        return self.turns([(call_id, tool, args, result)])


def _chat_turns(calls: list[Call]) -> list[Item]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": orjson.dumps(args).decode()},
                }
                for call_id, tool, args, _ in calls
            ],
        },
        *({"role": "tool", "tool_call_id": call_id, "content": r} for call_id, _, _, r in calls),
    ]


def _messages_turns(calls: list[Call]) -> list[Item]:
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call_id, "name": tool, "input": args}
                for call_id, tool, args, _ in calls
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": result}
                for call_id, _, _, result in calls
            ],
        },
    ]


def _responses_turns(calls: list[Call]) -> list[Item]:
    return [
        *(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": tool,
                "arguments": orjson.dumps(args).decode(),
            }
            for call_id, tool, args, _ in calls
        ),
        *(
            {"type": "function_call_output", "call_id": call_id, "output": result}
            for call_id, _, _, result in calls
        ),
    ]


def _gemini_turns(calls: list[Call]) -> list[Item]:
    return [
        {
            "role": "model",
            "parts": [
                {"functionCall": {"id": call_id, "name": tool, "args": args}}
                for call_id, tool, args, _ in calls
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": call_id, "name": tool, "response": {"output": result}}}
                for call_id, tool, _, result in calls
            ],
        },
    ]


BUILDERS = {
    "openai.chat": Builder(
        "openai.chat",
        user=lambda text: {"role": "user", "content": text},
        said=lambda text: {"role": "assistant", "content": text},
        turns=_chat_turns,
    ),
    "anthropic.messages": Builder(
        "anthropic.messages",
        user=lambda text: {"role": "user", "content": text},
        said=lambda text: {"role": "assistant", "content": [{"type": "text", "text": text}]},
        turns=_messages_turns,
    ),
    "openai.responses": Builder(
        "openai.responses",
        user=lambda text: {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        },
        said=lambda text: {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
        turns=_responses_turns,
    ),
    "gemini.generate": Builder(
        "gemini.generate",
        user=lambda text: {"role": "user", "parts": [{"text": text}]},
        said=lambda text: {"role": "model", "parts": [{"text": text}]},
        turns=_gemini_turns,
    ),
}


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> Builder:
    return BUILDERS[request.param]


def test_every_wire_has_a_builder() -> None:
    assert set(BUILDERS) == set(WIRES)


def result_of(conversation: Conversation, call_id: str) -> str:
    """The text of the result answering `call_id`, as the model will read it."""
    dialect = conversation.dialect
    names = dialect.tools_by_call(conversation.messages)
    for message in conversation.messages:
        for result in dialect.tool_results(message, names):
            if result.call_id == call_id:
                return result.text
    raise AssertionError(f"no result for {call_id}")


def valid(conversation: Conversation) -> bool:
    return conversation.dialect.violations(conversation.messages) == []


SOURCE = "\n".join(
    f"def parse_section_{n}(raw):\n    return raw.split('=', {n})[1].strip()" for n in range(60)
)
EDITED = SOURCE.replace("[1].strip()", "[-1].strip()")
NOISE = "\n".join(f"drwxr-xr-x  2 dev dev 4096 Nov 22 12:{n % 60:02d} dir_{n}" for n in range(80))


def session(builder: Builder, *middle: list[Item]) -> list[Item]:
    items = [builder.user("Why does parse_config fail on the staging profile?")]
    for turn in middle:
        items += turn
    return items


# ---- task terms, anomalies, call arguments --------------------------------------------------


def test_task_terms_are_identifiers_file_names_and_words_that_say_something() -> None:
    terms = terms_of(
        "Please look at src/brim/parse_config.py: why does ContextTooLarge come up in "
        "the staging profile? See issue E501 and the retry logic."
    )
    assert {"parse_config.py", "parse_config", "contexttoolarge", "e501"} <= terms
    assert {"staging", "profile", "issue", "retry", "logic"} <= terms
    assert not terms & {"please", "look", "does", "the", "and", "why", "see", "src", "brim"}


@pytest.mark.parametrize(
    "line",
    [
        "ERROR: build step 7 failed",
        "E   AssertionError: expected 3, got 4",
        "Traceback (most recent call last):",
        "thread 'main' panicked at src/main.rs:4:5",
        "warning: unused variable `x`",
        "FAILED tests/test_parse.py::test_staging - KeyError",
        '127.0.0.1 - - [22/Nov/2026] "GET /api/v1/items HTTP/1.1" 503 112',
        '{"status": 404, "path": "/x"}',
        "Process finished with exit code 2",
        "make: *** [all] exited with status 1",
    ],
)
def test_anomalies_are_recognised(line: str) -> None:
    assert is_anomaly(line)


@pytest.mark.parametrize(
    "line",
    [
        "INFO compiled module 7 in 12 ms",
        '127.0.0.1 - - [22/Nov/2026] "GET /api/v1/items HTTP/1.1" 200 112',
        '{"status": 201}',
        "Process finished with exit code 0",
    ],
)
def test_ordinary_lines_are_not_anomalies(line: str) -> None:
    assert not is_anomaly(line)


# ---- the names a result printed ---------------------------------------------------------------


def test_a_long_number_is_a_name_and_a_line_number_is_not() -> None:
    """A number that starts with four digits or more names a thing (an id, a constant, a
    port); the line number a file read prints before each line, a fraction, a version, a time
    of day, a step label and a short count do not."""
    rows = [f"{n:>6}\tretry_{n % 7} = load('src/pkg/module_{n % 5}.py')" for n in range(1000, 1040)]
    rows[3] = f"{1003:>6}\tDEADLINE_MS = 48213  # 0.48213 of the window, 2024.11 budget"
    rows[9] = f"{1009:>6}\tport = 8080, version 2.14.0, started 12:30:45 at step 3.119, 999 ok"
    counts = name_counts("\n".join(rows))
    assert {"48213", "2024.11", "8080", "DEADLINE_MS", "src/pkg/module_3.py"} <= set(counts)
    assert not {"0.48213", "2.14.0", "12:30:45", "3.119", "999"} & set(counts)
    assert not any(str(n) in counts for n in range(1000, 1040))  # the read's line numbers
    for gutter in ("{:05d}| ", "{:>5}→", "{}: "):  # a bar, an arrow or a colon after it
        read = "\n".join(gutter.format(n) + f"x_{n} = 1" for n in range(10_000, 10_050))
        assert not any(name.isdigit() for name in name_counts(read)), gutter


def test_a_grep_s_context_line_numbers_are_not_names() -> None:
    """`grep -n -C` and ripgrep print a match's line number before a colon and its context
    lines' before a dash: neither is a name, while a date at the start of a line is not a line
    number and its parts stay as printed."""
    rows = []
    for n in range(13_350, 13_390):
        sep = ":" if n % 10 == 4 else "-"
        rows.append(f'{n}{sep}        "max_tokens_{n % 3}": {64_000 + n % 2},')
    rows.append("2024-11-11  released with ticket 48213")
    rows.append("13391-DEADLINE_MS = 52000")  # a context line that starts with a name
    counts = name_counts("\n".join(rows))
    assert not any(str(n) in name for n in range(13_350, 13_392) for name in counts), counts
    assert {"64000", "64001", "48213", "2024-11-11", "DEADLINE_MS", "52000"} <= set(counts)


def test_a_codex_envelope_is_neither_a_gist_nor_a_name() -> None:
    """Codex's exec_command puts a chunk id, the wall time, the exit code and the output's size
    (and its warning, where it cut the output) around what a command printed: the gist and the
    names of such a result are those of the output (as a placeholder and evict's notice quote
    them), not the envelope's."""
    output = "\n".join(
        ["total 12", *[f"-rw-r--r-- 1 u u 120 Jan 1 {n:02d}:00 f{n}.py" for n in range(9)]]
    )
    output += "\nsrc/pkg/retry_policy.py: DEADLINE_MS = 48213"
    envelope = (
        "Chunk ID: 8f21c0\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
        "Original token count: 214\nOutput:\n"
    )
    wrapped = envelope + output
    assert gist(wrapped, 1) == gist(output, 1)
    assert not any(word in line for line in gist(wrapped, 3) for word in ("Wall time", "Chunk"))
    assert name_counts(wrapped) == name_counts(output)
    assert "8f21c0" not in name_counts(wrapped) and "48213" in name_counts(wrapped)
    cut = envelope + "Warning: truncated output (original token count: 3822)\n" + output
    assert gist(cut, 3) == gist(output, 3)  # Codex's own warning that it cut the output
    assert "Wall time" in gist("Wall time: 0.5 seconds in the lab\nok\nok", 1)[0]  # no envelope


def test_names_and_ids_are_ranked_in_turn() -> None:
    """The most repeated name, then the first id printed (a name with a long number in it),
    then the next name, the next id: a listing's sizes do not crowd out its file names, nor its
    names a file's one constant."""
    counts = {"a.py": 1, "48213": 1, "b.py": 3, "JEP-4213": 2, "c.py": 2, "d.py": 1, "v2_x": 5}
    assert ranked_names(counts) == ["v2_x", "48213", "b.py", "JEP-4213", "c.py", "a.py", "d.py"]
    assert ranked_names({"7305": 1, "issues/1044": 4}) == ["7305", "issues/1044"]  # as printed
    assert ranked_names({}) == []


def test_names_fitting_says_whether_every_name_fit() -> None:
    """A width that holds every name the text printed says so: any wider lists the same."""
    text = "\n".join(f"wrote build/pkg_{n}/out.tar.gz" for n in range(20))
    every = name_counts(text)
    assert len(every) == 20
    wide = sum(len(name) + len(NAMES_SEPARATOR) for name in every)
    assert names_fitting(text, wide) == (tuple(every), True)
    assert names_fitting(text, wide * 2) == (tuple(every), True)
    some, complete = names_fitting(text, wide - 1)
    assert len(some) == 19 and not complete
    assert names(text, wide - 1) == some


@given(
    st.lists(
        st.from_regex(r"[a-z_]{1,12}(\.py)?", fullmatch=True)
        | st.builds(
            lambda path, n: f"{path}/{n}",
            st.sampled_from(["github.com/o/r/pull", "github.com/o/r/issues", "out"]),
            st.integers(1000, 999_999),
        ),
        unique=True,
        max_size=60,
    ),
    st.integers(0, 600),
)
def test_fitting_counts_names_as_the_line_writes_them(ranked: list[str], width: int) -> None:
    """`fitting` charges ids under one path what `names_line` writes for them (the first whole,
    the second its own part and the braces, the next their own part): the line it chooses
    fits `width`, and it stops only where the next name would not."""

    def taken(named: list[str]) -> int:  # the characters a line's names take, separators in
        return len(names_line(named)) - len(NAMES_LABEL) + len(NAMES_SEPARATOR) if named else 0

    chosen = fitting(ranked, width)
    lead = next((n for n, name in enumerate(ranked) if taken([name]) <= width), len(ranked))
    assert chosen == ranked[lead : lead + len(chosen)]  # past the first ones too long alone
    assert taken(chosen) <= width
    if lead + len(chosen) < len(ranked):
        assert taken(ranked[lead : lead + len(chosen) + 1]) > width


def test_a_first_name_longer_than_the_width_leaves_room_for_the_next() -> None:
    """The name a result prints most may be a long absolute path (a CLI's read of a file in a
    temporary checkout): longer than a small result's whole room, it is passed over, and the
    names after it are listed rather than none."""
    path = "/tmp/brim-capture-1jxzkd4n/real-cli-opencode-requests/checkout/requirements-dev.txt"
    text = "\n".join([f"<path>{path}</path>", f"{path}: pytest_httpbin trustme_pinned 808348"])
    assert names(text, 40) == ("pytest_httpbin", "trustme_pinned", "808348")
    assert names(text, 200)[0] == path.lstrip("/")  # (as a name: without its first slash)


def test_ids_under_one_path_fit_many_more_in_a_width() -> None:
    """120 pull-request links take 4 000 characters written whole; under their path, 600."""
    text = "\n".join(f"merged https://github.com/acme/notes/pull/{7000 + n}" for n in range(120))
    every = name_counts(text)
    assert len(every) == 120
    listed = names(text, 700)
    assert listed == tuple(every)
    assert sum(len(name) + 1 for name in every) > 3_500


def test_call_arguments_and_task_terms_on_every_wire(wire: Builder) -> None:
    items = session(
        wire,
        wire.turn("c1", "read_file", {"path": "src/staging.py"}, SOURCE),
        wire.turn("c2", "grep", {"pattern": "load_profile", "path": "src"}, NOISE),
    )
    conversation = wire.conversation(items)
    call_message = items[-2]
    assert conversation.dialect.call_arguments(call_message) == [
        ("c2", {"pattern": "load_profile", "path": "src"})
    ]
    latest = [u for u in conversation.units() if u.kind == "tools"][-1]
    terms = requests(conversation)[-1] | call_terms(conversation, latest)  # the task at hand
    assert {"parse_config", "staging", "profile", "load_profile"} <= terms
    assert "staging.py" not in terms  # an older call's arguments are not the current task
    assert has_evidence("def load_profile(name):", terms)
    assert not has_evidence(NOISE, terms)


# ---- 1. exact copies become pointers; superseded reads are kept until needed -----------------


def test_an_older_copy_becomes_a_pointer_and_the_newer_copy_stays_whole(wire: Builder) -> None:
    items = session(
        wire,
        wire.turn("c1", "read_file", {"path": "config.py"}, SOURCE),
        [wire.said("Let me look at the callers too.")],
        wire.turn("c2", "grep", {"pattern": "parse_section"}, NOISE),
        wire.turn("c3", "read_file", {"path": "config.py"}, SOURCE),  # the newest turn
    )
    original = copy.deepcopy(items)
    before = wire.conversation(items)
    after, records = PruneToolResults().apply(before, Goal(10**6, 10**6), wire.meter)
    pointer = result_of(after, "c1")
    assert pointer.startswith(SAME_AS_PREFIX) and "read_file" in pointer and "c3" in pointer
    assert result_of(after, "c3") == SOURCE  # the kept copy, whole
    assert result_of(after, "c2") == NOISE  # under the target: nothing cut into
    assert [(r.action, r.detail) for r in records] == [("deduplicated", "same as c3")]
    assert records[0].original == SOURCE
    assert records[0].archive_key and f"sha256:{records[0].archive_key[:16]}" in pointer
    assert after.total < before.total
    assert valid(after)
    assert items == original  # the input is never mutated


def test_several_copies_point_each_to_the_next_so_old_pointers_never_change(
    wire: Builder,
) -> None:
    three = session(
        wire,
        wire.turn("c1", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c2", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c3", "bash", {"command": "ls"}, "ok"),
    )
    four = [*three, *wire.turn("c4", "read_file", {"path": "config.py"}, SOURCE)]
    prune = PruneToolResults()
    first, _ = prune.apply(wire.conversation(three), Goal(10**6, 10**6), wire.meter)
    second, _ = prune.apply(wire.conversation(four), Goal(10**6, 10**6), wire.meter)
    assert "c2" in result_of(first, "c1") and result_of(first, "c2") == SOURCE
    assert second.messages[:3] == first.messages[:3]  # c1's pointer (to c2) stays as it was
    assert "c4" in result_of(second, "c2") and result_of(second, "c4") == SOURCE


def test_a_file_read_edited_and_read_again_keeps_both_until_needed(wire: Builder) -> None:
    items = session(
        wire,
        wire.turn("c0", "list_dir", {"path": "."}, NOISE),
        wire.turn("c1", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c2", "edit_file", {"path": "config.py", "old": "[1]", "new": "[-1]"}, "ok"),
        wire.turn("c3", "read_file", {"path": "config.py"}, EDITED),
        wire.turn("c4", "bash", {"command": "pytest -q tests/test_config.py"}, "3 passed"),
    )
    before = wire.conversation(items)
    pruned, records = PruneToolResults().apply(before, Goal(10**6, 10**6), wire.meter)
    assert records == [] and pruned.messages == before.messages  # different content: no pointer
    stale = {call for (_, call), why in stale_results(before).items() if why == "superseded"}
    assert stale == {"c1"}  # the older read is out of date: first to go when room is needed

    # Clearing one result is enough: the superseded read goes, not the older listing.
    goal = Goal(target=before.total - 1, limit=before.total)
    clear = ClearToolResults(ClearSettings(keep=2, recent=0, clear_at_least=0))
    cleared, records = clear.apply(before, goal, wire.meter)
    assert [r.action for r in records] == ["cleared"]
    assert result_of(cleared, "c1").startswith("[brim cleared this read_file result")
    assert result_of(cleared, "c0") == NOISE and result_of(cleared, "c3") == EDITED
    assert valid(cleared)

    # Evicting: the superseded read's whole turn goes before the listing's.
    evicted, records = Evict(EvictSettings(keep_recent_turns=1, evict_at_least=0)).apply(
        before, goal, wire.meter
    )
    gone = [r for r in records if r.action == "evicted"]
    assert len(gone) == 1 and gone[0].detail == "tools"
    assert result_of(evicted, "c0") == NOISE and result_of(evicted, "c3") == EDITED
    with pytest.raises(AssertionError):
        result_of(evicted, "c1")
    assert valid(evicted)


def test_clear_keeps_results_with_evidence_longer(wire: Builder) -> None:
    failing = NOISE + "\nERROR: parse_config: no [staging] section in profile.ini"
    items = session(
        wire,
        wire.turn("c0", "bash", {"command": "make config"}, failing),  # the oldest: evidence
        wire.turn("c1", "list_dir", {"path": "build"}, NOISE.replace("dir_", "out_")),
        wire.turn("c2", "list_dir", {"path": "dist"}, NOISE.replace("dir_", "pkg_")),
        wire.turn("c3", "bash", {"command": "true"}, "ok"),
    )
    before = wire.conversation(items)
    goal = Goal(target=before.total - 1, limit=before.total)
    after, records = ClearToolResults(ClearSettings(keep=1, recent=0, clear_at_least=0)).apply(
        before, goal, wire.meter
    )
    assert len(records) == 1
    assert result_of(after, "c0") == failing  # older, but it holds the error
    assert result_of(after, "c1").startswith("[brim cleared this list_dir result")
    assert result_of(after, "c2") == NOISE.replace("dir_", "pkg_")  # the next to go: still whole
    assert valid(after)


def test_room_below_the_budget_comes_from_older_results_never_the_recent(wire: Builder) -> None:
    """A batch that aims below the budget (room for later turns) clears older results, even
    ones holding evidence, before the `recent` ones — those go only as far as the budget itself
    needs, and then the least valuable first."""
    failing = "\n".join(f"{NOISE}\nERROR: parse_config: no [staging{n}] section" for n in (0, 1))
    listings = [NOISE.replace("dir_", f"out{n}_") for n in range(3)]
    items = session(
        wire,
        wire.turn("c0", "bash", {"command": "make config"}, failing),  # evidence
        wire.turn("c1", "bash", {"command": "make check"}, failing.replace("staging", "prod")),
        wire.turn("c2", "list_dir", {"path": "a"}, listings[0]),  # recent: no evidence
        wire.turn("c3", "list_dir", {"path": "b"}, listings[1]),
        wire.turn("c4", "list_dir", {"path": "c"}, listings[2]),  # kept
    )
    before = wire.conversation(items)
    clear = ClearToolResults(ClearSettings(keep=1, recent=2, clear_at_least=0))
    room = Goal(target=before.total // 4, limit=before.total - 1)  # aiming far below the budget
    after, records = clear.apply(before, room, wire.meter)
    assert len(records) == 2  # the older two: their values ranked after the listings'
    assert all(result_of(after, c).startswith("[brim cleared this bash") for c in ("c0", "c1"))
    assert [result_of(after, c) for c in ("c2", "c3", "c4")] == listings  # the recent stay whole
    assert valid(after)

    without_older = after.total
    tight = Goal(target=before.total // 4, limit=without_older - 1)  # the budget needs one more
    after, records = clear.apply(before, tight, wire.meter)
    assert len(records) == 3 and after.total <= tight.limit
    assert result_of(after, "c2").startswith("[brim cleared this list_dir")  # least recently used
    assert [result_of(after, c) for c in ("c3", "c4")] == listings[1:]
    assert valid(after)
    first_pass = dataclasses.replace(tight, reversible_only=True)  # evict's old turns go first
    assert len(clear.apply(before, first_pass, wire.meter)[1]) == 2

    old_rule = ClearToolResults(ClearSettings(keep=1, recent=0, clear_at_least=0))
    after, records = old_rule.apply(before, room, wire.meter)  # recent=0: value order alone
    assert len(records) == 4 and result_of(after, "c3").startswith("[brim cleared this list_dir")


@pytest.mark.parametrize("api", ["openai.chat", "openai.responses"])
def test_evicts_notice_goes_before_the_clients_instructions_are_cut(api: str) -> None:
    """Where the newest result is at its floor and the request is still over: brim's own
    notice goes, and the system message stays whole. (Chat and Responses carry instructions in
    the conversation; Anthropic's `system` and Gemini's `systemInstruction` are fixed cost, never
    cut, and their notice is a user message.)"""
    wire = BUILDERS[api]
    dialect = WIRES[api].dialect
    instructions = dialect.notice(SOURCE)  # a system / developer message of the same shape
    instructions["content"] = "You are a careful coding agent.\n" + SOURCE
    log, _ = build_log()
    newest = wire.turn("c1", "bash", {"command": "make"}, log)
    plain = wire.conversation([instructions, wire.user("fix the build"), *newest])
    notice = dialect.notice(
        "[brim removed 12 earlier messages (9000 tokens) to fit the context window; "
        "restorable as sha256:0123456789abcdef]"
    )
    with_notice = plain.keep(lambda i: True, {1: (notice, wire.meter.message(notice))})
    assert with_notice.origin[1] == -1
    floor = Truncate().apply(plain, Goal(0, 0), wire.meter)[0].sizes[-1]  # min_keep_tokens
    newest_at_floor = plain.total - plain.sizes[-1] + floor
    limit = newest_at_floor + with_notice.sizes[1] // 2  # over with the notice, not without
    after, records = Truncate().apply(with_notice, Goal(limit, limit), wire.meter)
    assert after.total <= limit
    assert after.messages[0] is instructions  # whole
    assert notice not in after.messages and len(after.messages) == len(plain.messages)
    assert [r.detail for r in records] == ["tool_result:c1"]  # the newest cut, nothing else
    assert valid(after)
    # Where cutting the newest is enough, the notice stays.
    roomy = limit + with_notice.sizes[1]
    after, _ = Truncate().apply(with_notice, Goal(roomy, roomy), wire.meter)
    assert notice in after.messages and after.messages[0] is instructions


def test_clear_by_value_can_be_turned_off(wire: Builder) -> None:
    failing = NOISE + "\nERROR: parse_config: no [staging] section in profile.ini"
    items = session(
        wire,
        wire.turn("c0", "bash", {"command": "make config"}, failing),
        wire.turn("c1", "list_dir", {"path": "build"}, NOISE),
        wire.turn("c2", "bash", {"command": "true"}, "ok"),
    )
    before = wire.conversation(items)
    goal = Goal(target=before.total - 1, limit=before.total)
    settings = ClearSettings(keep=1, recent=0, clear_at_least=0, by_value=False)
    after, records = ClearToolResults(settings).apply(before, goal, wire.meter)
    assert len(records) == 1 and result_of(after, "c1") == NOISE  # the oldest goes, as before
    assert result_of(after, "c0").startswith("[brim cleared this bash result")


def test_gemini_results_paired_by_name_are_never_rewritten_one_for_another() -> None:
    """Two calls of the same function without ids in one turn share their key: rewriting one
    by it would overwrite both, so neither is pointed onward, cut or cleared."""
    wire = BUILDERS["gemini.generate"]
    log, _ = build_log()
    twin = {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "read_file", "response": {"output": SOURCE}}},
            {"functionResponse": {"name": "read_file", "response": {"output": log}}},
        ],
    }
    calls = {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "read_file", "args": {"path": "config.py"}}},
            {"functionCall": {"name": "read_file", "args": {"path": "build.log"}}},
        ],
    }
    items = [
        wire.user("Why does parse_config fail?"),
        calls,
        twin,
        *wire.turn("c9", "read_file", {"path": "config.py"}, SOURCE),
    ]
    before = wire.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=300))
    pruned, _ = prune.apply(before, Goal(0, 0), wire.meter)
    cleared, _ = ClearToolResults(ClearSettings(keep=0)).apply(before, Goal(0, 0), wire.meter)
    assert pruned.messages[2] == twin and cleared.messages[2] == twin
    assert valid(pruned) and valid(cleared)


def test_evict_removes_stale_tool_turns_before_chatter(wire: Builder) -> None:
    items = session(
        wire,
        [wire.said("First I will read the configuration module and its callers. " * 8)],
        wire.turn("c1", "read_file", {"path": "config.py"}, SOURCE),
        [wire.said("Now I will edit the split so it takes the last field. " * 8)],
        wire.turn("c2", "read_file", {"path": "config.py"}, EDITED),
        [wire.said("Done.")],
        [wire.user("And now?")],
    )
    before = wire.conversation(items)
    goal = Goal(target=before.total - 1, limit=before.total)
    after, records = Evict(EvictSettings(keep_recent_turns=1, evict_at_least=0)).apply(
        before, goal, wire.meter
    )
    assert [r.detail for r in records if r.action == "evicted"] == ["tools"]
    # …and it is recorded in the batch of its value class (stale), which summaries go by
    assert [r.batch for r in records if r.action == "evicted"] == [(STALE, 0)]
    assert result_of(after, "c2") == EDITED
    assert any("First I will read" in after.dialect.text(m) for m in after.messages)
    assert valid(after)


def test_gemini_calls_keyed_by_name_are_never_superseded_by_another_call_of_the_tool() -> None:
    """Gemini calls without ids are keyed by their name: two reads of different files share the
    key, so neither is known by its arguments, and neither makes the other out of date."""
    wire = BUILDERS["gemini.generate"]
    dialect = WIRES[wire.api].dialect
    log, _ = build_log()

    def call(name: str, args: dict[str, Any], call_id: str | None = None) -> Item:
        called = {"name": name, "args": args} | ({} if call_id is None else {"id": call_id})
        return {"role": "model", "parts": [{"functionCall": called}]}

    def answer(name: str, text: str, call_id: str | None = None) -> Item:
        response = {"name": name, "response": {"output": text}}
        return {
            "role": "user",
            "parts": [
                {"functionResponse": response | ({} if call_id is None else {"id": call_id})}
            ],
        }

    items = [
        wire.user("Why does parse_config fail?"),
        call("read_file", {"path": "config.py"}),
        answer("read_file", SOURCE),
        call("read_file", {"path": "build.log"}),
        answer("read_file", log),
        call("grep", {"pattern": "load_profile"}, call_id=""),  # an empty id: keyed by name too
        answer("grep", NOISE, call_id=""),
        wire.user("And?"),
    ]
    conversation = wire.conversation(items)
    assert "superseded" not in stale_results(conversation).values()
    assert dialect.call_arguments(items[3]) == [("read_file", {"path": "build.log"})]
    grep = next(u for u in conversation.units() if u.start == 5)
    assert "load_profile" in call_terms(conversation, grep)
    both = {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "read_file", "args": {"path": "a.py"}}},
            {"functionCall": {"name": "read_file", "args": {"path": "b.py"}}},
        ],
    }
    assert dialect.call_arguments(both) == [
        ("read_file", {"path": "a.py"}),
        ("read_file", {"path": "b.py"}),
    ]


def test_a_pointer_to_a_gemini_result_keyed_by_name_says_where_it_is() -> None:
    """With several `read_file` calls keyed by name, "for call read_file" would not say which
    result: the pointer names the message too, and the sha256 the archive keeps the copy under;
    clearing that result clears the pointer with it."""
    wire = BUILDERS["gemini.generate"]

    def turn(name: str, args: dict[str, Any], text: str) -> list[Item]:
        return [
            {"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": name, "response": {"output": text}}}],
            },
        ]

    items = [
        wire.user("Why does parse_config fail?"),
        *turn("read_file", {"path": "config.py"}, SOURCE),
        *turn("list_dir", {"path": "."}, NOISE),
        *turn("read_file", {"path": "config.py"}, SOURCE),
        *turn("bash", {"command": "true"}, "ok"),
    ]
    before = wire.conversation(items)
    pruned, records = PruneToolResults().apply(before, Goal(10**6, 10**6), wire.meter)
    (pointed,) = before.dialect.tool_results(pruned.messages[2], {})
    assert pointed.text == (
        f"{SAME_AS_PREFIX}the later read_file result for call read_file in message 6; see there; "
        f"sha256:{archive_key(SOURCE)[:16]}]"
    )
    assert [r.archive_key for r in records] == [archive_key(SOURCE)]

    cleared, records = ClearToolResults(ClearSettings(keep=1)).apply(pruned, Goal(0, 0), wire.meter)
    (old,) = before.dialect.tool_results(cleared.messages[2], {})
    (new,) = before.dialect.tool_results(cleared.messages[6], {})
    assert new.text.startswith("[brim cleared this read_file result") and old.text == new.text
    assert valid(cleared)


def test_a_pointer_is_cleared_with_the_result_it_names(wire: Builder) -> None:
    """An older copy pointed onward would name a result that is gone: it takes the same
    placeholder in the same step (same content, same sha256)."""
    items = session(
        wire,
        wire.turn("c0", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c1", "list_dir", {"path": "."}, NOISE),
        wire.turn("c2", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c3", "bash", {"command": "true"}, "ok"),
    )
    before = wire.conversation(items)
    pruned, _ = PruneToolResults().apply(before, Goal(10**6, 10**6), wire.meter)
    assert result_of(pruned, "c0").startswith(SAME_AS_PREFIX)
    clear = ClearToolResults(ClearSettings(keep=1))
    cleared, records = clear.apply(pruned, Goal(0, 0), wire.meter)
    assert result_of(cleared, "c2").startswith("[brim cleared this read_file result")
    assert result_of(cleared, "c0") == result_of(cleared, "c2")
    assert f"sha256:{archive_key(SOURCE)[:16]}" in result_of(cleared, "c0")
    linked = [r for r in records if r.detail == "pointed to c2"]
    assert len(linked) == 1 and linked[0].archive_key == archive_key(SOURCE)
    assert linked[0].original == SOURCE
    assert valid(cleared)


def test_evict_never_removes_a_result_before_the_pointer_to_it(wire: Builder) -> None:
    """A result an older copy points to is no stale turn, even when a later read supersedes it:
    the turn holding the pointer goes first."""
    items = session(
        wire,
        wire.turns(
            [
                ("c0", "read_file", {"path": "config.py"}, SOURCE),  # → pointer to c2
                ("c1", "list_dir", {"path": "."}, NOISE),
            ]
        ),
        wire.turn("c2", "read_file", {"path": "config.py"}, SOURCE),
        wire.turn("c3", "read_file", {"path": "config.py"}, EDITED),  # supersedes c2
        wire.turn("c4", "bash", {"command": "pytest -q"}, "3 passed"),
        [wire.user("And now?")],
    )
    pruned, _ = PruneToolResults().apply(wire.conversation(items), Goal(10**6, 10**6), wire.meter)
    assert result_of(pruned, "c0").startswith(SAME_AS_PREFIX)
    goal = Goal(target=pruned.total - 1, limit=pruned.total)
    evict = Evict(EvictSettings(keep_recent_turns=1, evict_at_least=0))
    evicted, records = evict.apply(pruned, goal, wire.meter)
    assert [r.detail for r in records if r.action == "evicted"] == ["tools"]
    assert result_of(evicted, "c2") == SOURCE  # what the pointer named is still there…
    with pytest.raises(AssertionError):
        result_of(evicted, "c0")  # …and the pointer went first
    assert valid(evicted)


def test_the_last_request_is_never_a_turn_of_tool_results(wire: Builder) -> None:
    """Anthropic and Gemini send tool results as user turns: the last user message is the
    last one that asks something, for evict (which always keeps it) and truncate (which cuts
    it last) alike."""
    request = "Please fix parse_config for the staging profile, then rerun the tests."
    items = [
        wire.user("First, look around the repository."),
        *wire.turn("c1", "list_dir", {"path": "."}, NOISE),
        wire.said("The layout is clear. " * 200),
        wire.user(request),
        *wire.turn("c2", "read_file", {"path": "config.py"}, SOURCE),  # an ongoing tool loop
    ]
    before = wire.conversation(items)
    evicted, _ = Evict(EvictSettings(keep_recent_turns=0, evict_at_least=0)).apply(
        before, Goal(1, 1), wire.meter
    )
    assert items[4] in evicted.messages  # the request itself, not just a quote in the notice
    assert evicted.messages[-2:] == before.messages[-2:]
    assert valid(evicted)

    items[4] = wire.user(request + "\n" + SOURCE)  # as large as the newest result
    before = wire.conversation(items)
    goal = Goal(target=before.total - 400, limit=before.total - 400)
    truncated, records = Truncate().apply(before, goal, wire.meter)
    assert truncated.total <= goal.limit and [r.action for r in records] == ["truncated"]
    assert records[0].index not in (4, len(items) - 1)  # an older message, not…
    assert truncated.messages[4] == items[4]  # …the last request…
    assert truncated.messages[-1] == items[-1]  # …nor the newest message


# ---- 2. inside a result: task lines, error lines and task items are kept ---------------------

CUT_ONLY = PruneSettings(digest_share=1)  # step 3 alone: cut to the relevant part, no digests


def build_log(lines: int = 600) -> tuple[str, list[str]]:
    rows = [
        f"2026-11-22 12:{n // 60:02d}:{n % 60:02d} INFO compiled unit {n} in {n % 97} ms"
        for n in range(lines)
    ]
    facts = {
        150: "2026-11-22 12:02:30 WARNING disk usage at 91% on /var/build",
        300: "2026-11-22 12:05:00 ERROR step 7 exited with code 2",
        450: "2026-11-22 12:07:30 DEBUG parse_config loaded profile staging from profile.ini",
    }
    for at, line in facts.items():
        rows[at] = line
    return "\n".join(rows), list(facts.values())


def test_a_long_log_keeps_error_and_task_lines_and_loses_noise(wire: Builder) -> None:
    log, facts = build_log()
    items = session(
        wire,
        wire.turn("c1", "bash", {"command": "make build"}, log),
        wire.turn("c2", "bash", {"command": "cat profile.ini"}, "[default]\nname = dev"),
    )
    before = wire.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=400, digest_share=1))
    after, records = prune.apply(before, Goal(0, 0), wire.meter)
    kept = without_named_whole(result_of(after, "c1"), log)
    assert all(fact in kept for fact in facts)
    assert kept.startswith("2026-11-22 12:00:00 INFO") and kept.endswith("unit 599 in 17 ms")
    assert "lines omitted by brim" in kept
    assert len(wire.meter.tokens(kept)) <= 400 * 1.1  # lines cost their share of the characters
    assert [r.action for r in records] == ["pruned"]
    assert records[0].original == log
    assert prune.apply(before, Goal(0, 0), wire.meter)[0].messages == after.messages
    assert PruneToolResults(prune.settings).apply(before, Goal(0, 0), wire.meter)[0] == after
    assert valid(after)


def test_json_arrays_keep_the_items_that_mention_the_tasks_identifiers(wire: Builder) -> None:
    orders = [{"id": f"ORD-{1000 + n}", "status": "shipped", "total": n} for n in range(200)]
    orders[90]["status"] = "payment_failed"
    orders[120]["id"] = "ORD-4711"
    items = [
        wire.user("What happened to order ORD-4711?"),
        *wire.turn("c1", "list_orders", {"since": "2026-11-01"}, orjson.dumps(orders).decode()),
        *wire.turn("c2", "bash", {"command": "date"}, "Sun Nov 22 12:00:00 UTC 2026"),
    ]
    before = wire.conversation(items)
    after, _ = PruneToolResults(CUT_ONLY).apply(before, Goal(0, 0), wire.meter)
    kept = orjson.loads(without_named_whole(result_of(after, "c1"), orjson.dumps(orders).decode()))
    ids = [item["id"] for item in kept if isinstance(item, dict)]
    assert ids[:8] == [f"ORD-{1000 + n}" for n in range(8)]
    assert ids[-4:] == [f"ORD-{1000 + n}" for n in range(196, 200)]
    assert "ORD-4711" in ids and "ORD-1090" in ids  # the task's order, and the failed one
    assert len(ids) == 14
    assert [item for item in kept if isinstance(item, str)] == [
        "… 82 more items …",
        "… 29 more items …",
        "… 75 more items …",
    ]
    assert valid(after)


def test_array_items_are_judged_by_their_values_not_their_keys(wire: Builder) -> None:
    """`"failed": false` in every item is no failure in any: only the item that failed, and the
    one the task names, are kept besides head and tail."""
    orders = [
        {"id": f"ORD-{1000 + n}", "failed": False, "note": None, "total": n} for n in range(200)
    ]
    orders[90]["failed"] = True
    orders[120]["id"] = "ORD-4711"
    items = [
        wire.user("What happened to order ORD-4711?"),
        *wire.turn("c1", "list_orders", {"since": "2026-11-01"}, orjson.dumps(orders).decode()),
        *wire.turn("c2", "bash", {"command": "date"}, "Sun Nov 22 12:00:00 UTC 2026"),
    ]
    after, _ = PruneToolResults(CUT_ONLY).apply(wire.conversation(items), Goal(0, 0), wire.meter)
    kept = orjson.loads(without_named_whole(result_of(after, "c1"), orjson.dumps(orders).decode()))
    ids = [item["id"] for item in kept if isinstance(item, dict)]
    head, tail = [f"ORD-{1000 + n}" for n in range(8)], [f"ORD-{1000 + n}" for n in range(196, 200)]
    assert ids == [*head, "ORD-1090", "ORD-4711", *tail]
    assert valid(after)


def test_a_json_result_with_one_field_keeps_its_field(wire: Builder) -> None:
    """`{"stdout": "…"}` is JSON on every wire (only Gemini's own `{"output": …}` wrapper is
    the wire's shape, and its dialect reads through it): cut, it stays that JSON object."""
    log, facts = build_log()
    result = orjson.dumps({"stdout": log}).decode()
    items = session(
        wire,
        wire.turn("c1", "bash", {"command": "make build"}, result),
        wire.turn("c2", "bash", {"command": "true"}, "ok"),
    )
    prune = PruneToolResults(PruneSettings(max_text_tokens=400, digest_share=1))
    after, _ = prune.apply(wire.conversation(items), Goal(0, 0), wire.meter)
    kept = orjson.loads(without_named_whole(result_of(after, "c1"), result))
    assert list(kept) == ["stdout"] and "omitted by brim" in kept["stdout"]
    assert all(fact in kept["stdout"] for fact in facts)
    assert valid(after)


# ---- 3. a cut into text goes only as far as the budget needs -----------------------------------


def test_no_text_is_cut_while_the_request_is_within_its_limit(wire: Builder) -> None:
    """prune cuts into text only in compress's last-resort pass, and then only to the limit —
    never to the low-water mark, which the reversible cuts aim for: the request uses (nearly)
    all of its budget, the oldest result is cut first, the newest turn never."""
    log, _ = build_log()
    other = log.replace("INFO compiled", "INFO linked")
    items = session(
        wire,
        wire.turn("c1", "bash", {"command": "make build"}, log),
        wire.turn("c2", "bash", {"command": "make link"}, other),
        wire.turn("c3", "bash", {"command": "make test"}, other.replace("linked", "tested")),
    )
    before = wire.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=400))
    # Over the low-water mark, within the limit: nothing to cut.
    goal = Goal(target=before.total // 2, limit=before.total)
    untouched, records = prune.apply(before, goal, wire.meter)
    assert records == [] and untouched.messages == before.messages
    # Over the limit, in the reversible pass: still no cut into text.
    sparing = Goal(target=before.total - 500, limit=before.total - 500, reversible_only=True)
    assert prune.apply(before, sparing, wire.meter)[1] == []

    # A little over the limit: only the oldest result is cut, just enough.
    limit = before.total - 500
    after, records = prune.apply(before, Goal(target=limit // 2, limit=limit), wire.meter)
    assert len(records) == 1 and limit * 0.97 <= after.total <= limit
    assert "omitted by brim" in result_of(after, "c1")
    assert result_of(after, "c2") == other
    everything, _ = prune.apply(before, Goal(0, 0), wire.meter)
    assert "omitted by brim" in result_of(everything, "c2")
    assert result_of(everything, "c3") == result_of(before, "c3")  # the newest turn: whole
    assert valid(after) and valid(everything)


# ---- generated sessions through the whole policy chain ---------------------------------------

POLICIES = build_policies(DEFAULT_ORDER, {})
FILES = {
    "config.py": SOURCE,
    "config.py@edited": EDITED,
    "listing": NOISE,
    "log": build_log(500)[0],
}


def generated_session(api: str, kinds: list[str]) -> list[Item]:
    builder = BUILDERS[api]
    items = [builder.user("Why does parse_config fail on the staging profile?")]
    for turn, kind in enumerate(kinds):
        if kind == "chatter":
            items.append(builder.said(f"step {turn}: thinking about it"))
        elif kind == "ask":
            items.append(builder.user(f"also check module_{turn}"))
        else:
            content = FILES[
                "config.py@edited" if kind == "edited" else kind.replace("read", "config.py")
            ]
            path = "config.py" if kind in ("read", "edited") else kind
            items += builder.turn(f"c{turn}", "read_file", {"path": path}, content)
    items.append(builder.user("So what is the fix?"))
    return items


@st.composite
def generated(draw: Any) -> tuple[str, list[Item]]:
    api = draw(st.sampled_from(sorted(WIRES)))
    kinds = ["read", "read", "edited", "listing", "log", "chatter", "ask"]
    turns = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=12))
    return api, generated_session(api, turns)


# Copies pointed onward (c0 to c1, c3 to c5) and a superseded read (c1, by c4): at 9,000 tokens
# the pointers stay; at 7,000 clear takes c1, and c0 with it.
COPIES = ["read", "read", "log", "listing", "edited", "listing", "chatter"]


def with_copies(test: Callable[..., None]) -> Callable[..., None]:
    for api in sorted(WIRES):
        for limit in (7_000, 9_000):
            test = example(case=(api, generated_session(api, COPIES)), limit=limit)(test)
    return test


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=generated(), limit=st.integers(800, 12_000))
@with_copies
def test_generated_sessions_stay_valid_deterministic_and_keep_the_newest_copy(
    case: tuple[str, list[Item]], limit: int
) -> None:
    api, items = case
    builder = BUILDERS[api]
    dialect = WIRES[api].dialect
    original = copy.deepcopy(items)
    outcome = compress(dialect, items, 3, builder.meter, POLICIES, limit=limit, low_water=0.85)
    assert dialect.violations(list(outcome.messages)) == []
    assert items == original
    again = compress(dialect, items, 3, builder.meter, POLICIES, limit=limit, low_water=0.85)
    assert again.messages == outcome.messages
    conversation = builder.conversation(list(outcome.messages))
    assert conversation.total == outcome.tokens_out
    if outcome.fits:
        assert conversation.total <= limit

    def results(messages: tuple[Any, ...] | list[Item]) -> dict[str, str]:
        names = dialect.tools_by_call(messages)
        return {
            result.call_id: result.text
            for message in messages
            for result in dialect.tool_results(message, names)
        }

    sent, shown = results(items), results(conversation.messages)
    newest = {text: call_id for call_id, text in sent.items()}  # each content's newest copy
    for text, call_id in newest.items():
        kept = shown.get(call_id)
        if kept is None:  # evicted
            continue
        assert not kept.startswith(SAME_AS_PREFIX)  # never pointed onward: there is no later copy
        if not kept.startswith("[brim cleared") and "by brim" not in kept:  # not cleared nor cut
            assert kept == text  # …so whole
    for call_id, text in shown.items():
        if text.startswith(SAME_AS_PREFIX):  # a pointer names a later call that is still there
            target = text.split("for call ", 1)[1].split(";", 1)[0]
            assert target in shown and int(target[1:]) > int(call_id[1:])
            assert not shown[target].startswith("[brim cleared")  # …and not cleared either
            assert sent[target] == sent[call_id]  # a copy of it
            assert f"sha256:{archive_key(sent[call_id])[:16]}" in text  # archived under this


def test_brims_own_markers_report_no_anomaly() -> None:
    marker = "[… 40 lines without task terms or errors omitted by brim …]"
    assert not is_anomaly(f"compiled unit 1\n{marker}\ncompiled unit 99")
    assert is_anomaly(f"compiled unit 1\n{marker}\nERROR unit 99 failed")
    assert is_anomaly("[… brim did not write this: an error …]")  # not brim's marker


def test_a_result_prune_cut_keeps_its_value(wire: Builder) -> None:
    """A plain log cut to its most informative lines is still plain: the marker of the lines it
    left out ("[… N lines omitted by brim …]") is no anomaly, so clear and evict rank it alike
    whether or not prune cut it first."""
    log = "\n".join(f"2026-11-22 12:00:{n % 60:02d} INFO compiled unit {n}" for n in range(600))
    items = session(
        wire,
        wire.turn("c1", "bash", {"command": "make"}, log),
        wire.turn("c2", "bash", {"command": "true"}, "ok"),
    )
    before = wire.conversation(items)
    prune = PruneToolResults(PruneSettings(max_text_tokens=400, digest_share=1))
    after, _ = prune.apply(before, Goal(0, 0), wire.meter)
    assert "lines omitted by brim" in result_of(after, "c1")
    assert result_values(after) == result_values(before)
