"""Cutting a text by its information (`policies.lines`): which lines a cut keeps, judged
across the session (`policies.information.LineStats`), and that every dropped line is counted in
a marker — as pure functions."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from brim.policies.information import LineStats
from brim.policies.lines import (
    DIGEST_MARKER_TOKENS,
    FEW_ANOMALIES,
    cut_middle,
    digest_lines,
    informative_lines,
    relevant_lines,
)
from brim.policies.text import identifiers, is_anomaly
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files

use_bundled_tiktoken_files()
METER = CounterMeter(TokenCounter(), "o200k_base", "", CHAT)

MARKER = re.compile(r"\[… (\d+) lines omitted by brim(?:, (\d+) with task terms or anomalies)? …\]")

UNUSUAL = "2026-11-22 12:04:10 INFO  deploy-config: the staging key rotates on tuesdays at 0300"


def repetitive_log(lines: int = 300, unusual_at: int | None = 170) -> str:
    """A build log whose lines differ only in their numbers (and one source name of four),
    with one line that says something once."""
    sources = ("compiler", "resolver", "bundler", "cache")
    rows = [
        f"2026-11-22 12:{n // 60:02d}:{n % 60:02d} INFO  {sources[n % 4]}: compiled unit {n} "
        f"in {n % 97} ms (key {n * 7919:08x})"
        for n in range(lines)
    ]
    if unusual_at is not None:
        rows[unusual_at] = UNUSUAL
    return "\n".join(rows)


def replayed(digest: str, original: list[str]) -> int:
    """Walk a digest against the lines it was made of: every kept line is the next original
    line, every marker skips as many as it says. Returns how many lines the digest accounts
    for (all of them, if it is honest)."""
    at = 0
    for line in digest.split("\n"):
        found = MARKER.fullmatch(line)
        if found:
            at += int(found[1])
        else:
            assert line == original[at], (at, line)
            at += 1
    return at


# ---- the digest of a text ----------------------------------------------------------------------


def test_an_unusual_line_in_a_repetitive_log_survives_the_digest() -> None:
    log = repetitive_log()
    lines = log.split("\n")
    total = len(METER.tokens(log))
    digest = digest_lines(log, frozenset(), 0.1, 64, METER)
    assert UNUSUAL in digest.split("\n")
    kept = len(METER.tokens(digest))
    assert kept <= 0.1 * total * 1.25 and kept < total  # about the share asked for
    assert digest.startswith(lines[0] + "\n") and digest.endswith("\n" + lines[-1])
    assert replayed(digest, lines) == len(lines)  # every dropped line counted in a marker
    # Cut to the same size by position, the line is lost: the digest goes by information.
    assert UNUSUAL not in cut_middle(log, kept, METER)[0]


def test_the_digest_keeps_anomaly_and_task_lines_first() -> None:
    lines = repetitive_log(unusual_at=None).split("\n")
    lines[50] = "2026-11-22 12:00:50 ERROR linker: name 'cursor' is not defined"
    lines[90] = "2026-11-22 12:01:30 INFO  resolver: compiled unit parse_config in 3 ms"
    text = "\n".join(lines)
    digest = digest_lines(text, frozenset({"parse_config"}), 0.1, 64, METER).split("\n")
    assert lines[50] in digest and lines[90] in digest
    assert replayed("\n".join(digest), lines) == len(lines)


def test_a_task_term_on_most_lines_tells_none_apart() -> None:
    """A grep for `lookup_order` matches it on every line: those lines are no task lines, and
    the one line that says something else is what the digest keeps."""
    hits = [
        f"src/mod_{n % 7}.py:{n}:    result = lookup_order(record, retries={n % 4})"
        for n in range(30)
    ]
    hits[12] = (
        "src/billing/tasks.py:88:    # lookup_order: the legacy table is paused until ops-7318 closes"
    )
    digest = digest_lines("\n".join(hits), frozenset({"lookup_order"}), 0.2, 64, METER)
    assert hits[12] in digest.split("\n")


def test_a_digest_of_a_cut_text_adds_up_the_markers_it_drops() -> None:
    lines = repetitive_log(600).split("\n")
    cut = relevant_lines("\n".join(lines), frozenset(), 1_500, METER)
    assert "lines without task terms or errors omitted by brim" in cut
    digest = digest_lines(cut, frozenset(), 0.2, 64, METER)
    assert "without task terms" not in digest  # the cut's markers merged into the digest's
    omitted = sum(int(m[1]) for m in MARKER.finditer(digest))
    kept = sum(1 for line in digest.split("\n") if not MARKER.fullmatch(line))
    assert omitted + kept == len(lines)


def test_a_few_anomaly_lines_are_kept_wherever_they_fit() -> None:
    """Found by `test_digest_properties`: a budget of 100 tokens of which the first and last
    lines take half. Anomalies may take half of what is left, which holds one short line and
    its markers but not two; the second used to wait for the informative lines, and the junk
    that outscores it took its room."""
    lines = [
        f"2026-11-22 12:00:{n % 60:02d} INFO worker processed batch {n * 37 % 10_000} ok"
        for n in range(80)
    ]
    junk = ["y3Si?", 'e8lj.8==~;;"u>F`', "}`y%?K?R", "gYb}A", "1^f8Q_P'F_9+7o(Zzo-<<HMC>%"]
    junk += ['J,iT">HAzNb&gplf`', "wC<Stt@tZXg>`|lwU", "HUq+=P7e", "_VaZ?ck5xFOf +io"]
    junk += [";U6XE\\G?\\YlZQol%@Rd =.se89Ev5q)"]
    for k, line in enumerate(junk):
        lines[5 + 7 * k] = line
    lines[40] = "Traceback (most recent call last):"
    lines[60] = "ERROR: disk full on /var"
    lines[-1] = "2026-11-22 12:00:00 INFO worker processed batch 0 ok"
    text = "\n".join(lines)
    assert max(100, int(METER.text_tokens(text) * 0.05)) == 100
    assert _anomalies_fit(text, 0.05, 100)
    digest = digest_lines(text, frozenset(), 0.05, 100, METER).split("\n")
    assert lines[40] in digest and lines[60] in digest
    assert digest[0] == lines[0] and digest[-1] == lines[-1]
    assert replayed("\n".join(digest), lines) == len(lines)


def _anomalies_fit(text: str, share: float, floor: int) -> bool:
    """Whether a digest of `text` promises to keep each of its anomaly lines: there are a few
    (`FEW_ANOMALIES` different lines at most), and the first and last line and they, each
    with a marker of its own, fit the digest's budget — a line costing its share of the text's
    tokens by its characters, as `digest_lines` costs it."""
    lines = text.split("\n")
    middle = {line for line in lines[1:-1] if is_anomaly(line)}
    if len(middle) > FEW_ANOMALIES:
        return False
    total = METER.text_tokens(text)
    ratio = total / max(1, len(text))
    cost = [1 + int(len(line) * ratio) for line in (lines[0], lines[-1], *middle)]
    return sum(cost) + DIGEST_MARKER_TOKENS * (1 + len(middle)) <= max(floor, int(total * share))


ORDINARY = st.builds(
    lambda n, word: f"2026-11-22 12:00:{n % 60:02d} INFO {word} processed batch {n} ok",
    st.integers(0, 10_000),
    st.sampled_from(["worker", "scheduler", "reader"]),
)
FREE = st.text(
    st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="[]…"),
    max_size=60,
)
ANOMALY = st.sampled_from(
    ["ERROR: disk full on /var", "Traceback (most recent call last):", "WARNING: slow query"]
)


@st.composite
def texts(draw: Any) -> tuple[str, list[int]]:
    """A multi-line text (no line over 60 characters) and where its anomaly lines are."""
    lines = draw(st.lists(st.one_of(ORDINARY, ORDINARY, FREE), min_size=40, max_size=200))
    anomalies: list[int] = []
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(1, len(lines) - 2))
        lines[at] = draw(ANOMALY)
        anomalies.append(at)
    return "\n".join(lines), anomalies


PROPERTIES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(case=texts(), share=st.floats(0.05, 0.9), floor=st.integers(100, 300))
def test_digest_properties(case: tuple[str, list[int]], share: float, floor: int) -> None:
    text, anomalies = case
    lines = text.split("\n")
    digest = digest_lines(text, frozenset(), share, floor, METER)
    assert len(digest) <= len(text)  # never longer
    assert digest_lines(text, frozenset(), share, floor, METER) == digest  # deterministic
    event("cut" if digest != text else "whole")  # floors small enough that most are cut
    if digest == text:
        return
    out = digest.split("\n")
    assert out[0] == lines[0] and out[-1] == lines[-1]  # first and last lines kept
    assert all(is_anomaly(lines[at]) for at in anomalies)
    # A few anomaly lines are kept wherever they fit the budget with the first and last line
    # (in these texts, with a floor of 100 tokens, they nearly always do).
    fit = _anomalies_fit(text, share, floor)
    event(f"anomalies {'fit' if fit else 'need not fit'}")
    if fit:
        assert all(lines[at] in out for at in anomalies)
    assert replayed(digest, lines) == len(lines)  # kept lines in order, dropped ones counted


# ---- information across the session ------------------------------------------------------------

GO_FILE = """package ingest

import (
\t"context"
\t"encoding/json"
\t"fmt"
\t"io"
\t"net/http"
)

type Client struct {
\tbase string
\thttp *http.Client
}

func (c *Client) Fetch(ctx context.Context, id string) (*Record, error) {
\treq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/records/"+id, nil)
\tif err != nil {
\t\treturn nil, fmt.Errorf("build request: %w", err)
\t}
\tresp, err := c.http.Do(req)
\tif err != nil {
\t\treturn nil, fmt.Errorf("send request: %w", err)
\t}
\tdefer resp.Body.Close()
\tbody, err := io.ReadAll(resp.Body)
\tif err != nil {
\t\treturn nil, fmt.Errorf("read body: %w", err)
\t}
\tvar rec Record
\tif err := json.Unmarshal(body, &rec); err != nil {
\t\treturn nil, fmt.Errorf("decode record: %w", err)
\t}
\treturn &rec, nil
}

func (c *Client) List(ctx context.Context, page int) ([]Record, error) {
\t// The upstream caps pages at 250 records and drops the cursor after 15 minutes idle.
\treq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.page(page), nil)
\tif err != nil {
\t\treturn nil, fmt.Errorf("build list request: %w", err)
\t}
\tresp, err := c.http.Do(req)
\tif err != nil {
\t\treturn nil, fmt.Errorf("send list request: %w", err)
\t}
\tdefer resp.Body.Close()
\tbody, err := io.ReadAll(resp.Body)
\tif err != nil {
\t\treturn nil, fmt.Errorf("read list body: %w", err)
\t}
\tvar recs []Record
\tif err := json.Unmarshal(body, &recs); err != nil {
\t\treturn nil, fmt.Errorf("decode list: %w", err)
\t}
\treturn recs, nil
}
"""
# What the file says once, and what it says twenty times over.
FACT = "\t// The upstream caps pages at 250 records and drops the cursor after 15 minutes idle."


def go_file(functions: int = 5) -> str:
    """A Go source file of `functions` × 2 handlers, each checking four errors the same way."""
    head, _, rest = GO_FILE.partition("func (c *Client) Fetch")
    body = "func (c *Client) Fetch" + rest
    copies = [
        body.replace("Fetch(", f"Fetch{n}(").replace("List(", f"List{n}(") for n in range(functions)
    ]
    text = head + "\n".join(copies)
    first = text.index(FACT)  # the fact once: only the first List keeps its comment
    return text[: first + len(FACT)] + text[first + len(FACT) :].replace(FACT + "\n", "")


def test_a_digest_of_go_code_keeps_the_one_comment_not_the_twenty_error_returns() -> None:
    """Every `return nil, fmt.Errorf("…: %w", err)` reports an error (an anomaly), and there are
    forty of them: one kind of anomaly, said forty times. The one comment line, unlike every
    other line, is what the digest keeps."""
    text = go_file()
    lines = text.split("\n")
    errors = [line for line in lines if "fmt.Errorf" in line]
    assert len(errors) == 40 and all(is_anomaly(line) for line in errors)
    for stats in (None, LineStats.of([text, GO_FILE.replace("ingest", "export")])):
        digest = informative_lines(text, METER.text_tokens(text) // 6, frozenset(), METER, stats)
        kept = digest.split("\n")
        assert FACT in kept
        assert sum(line in errors for line in kept) <= FEW_ANOMALIES  # one kind, a few lines
        assert replayed(digest, lines) == len(lines)


def test_a_line_common_across_the_session_says_less_than_it_does_alone() -> None:
    """The scores are the session's: a line every other result has too is no news, though it
    is rare within its own text."""
    text = "\n".join(["compiled unit 1", "compiled unit 2", "cache warmed in 3 ms", "done"])
    alone = LineStats.of([text]).scores(text.split("\n"))
    others = ["\n".join(["cache warmed in 5 ms", f"step {n} finished"]) for n in range(30)]
    session = LineStats.of([text, *others]).scores(text.split("\n"))
    assert session[2] < alone[2]  # "cache warmed" is in every other result
    assert session[3] > session[2]  # "done" is in none of them


def test_a_repeated_line_counts_once_and_a_fresh_identifier_is_news() -> None:
    lines = ["worker ready", "worker ready", "request id=7f3a91c2 took 12 ms", "worker ready"]
    scores = LineStats.of(["\n".join(lines)]).scores(lines)
    assert scores[1] == scores[3] == 0.0 < scores[0]  # the words counted at the first
    assert scores[2] > scores[0]  # its id is found nowhere else


MEASURED = st.builds(
    lambda rows: "\n".join(rows),
    st.lists(st.one_of(ORDINARY, FREE, ANOMALY), min_size=40, max_size=200),
)


@PROPERTIES
@given(text=MEASURED, share=st.floats(0.2, 0.95))
def test_a_cut_keeps_about_what_it_is_asked_to(text: str, share: float) -> None:
    """A cut to `keep` tokens uses them: it goes no further than asked (a cut into text stops
    at the budget), and no line is lost uncounted."""
    total = METER.text_tokens(text)
    keep = max(60, int(total * share))
    out = informative_lines(text, keep, frozenset(), METER)
    size = METER.text_tokens(out)
    if out == text:
        assert total <= keep * 1.25
        return
    assert size <= keep * 1.25 + DIGEST_MARKER_TOKENS
    assert size >= keep * 0.8 - 2 * DIGEST_MARKER_TOKENS  # lines of at most 60 characters
    assert replayed(out, text.split("\n")) == len(text.split("\n"))


def test_identifiers_are_numbers_names_and_paths_as_written() -> None:
    found = identifiers("see src/app.py:42 and parse_config() in ContextTooLarge, v2.1.0, ok 7")
    assert {"src/app.py", "parse_config", "ContextTooLarge", "v2.1.0"} <= found
    assert "see" not in found and "ok" not in found and "7" not in found  # words, short numbers


def _plain_identifiers(text: str) -> frozenset[str]:
    """`identifiers` as its docstring defines it, a token at a time."""
    found = set()
    for token in re.findall(r"[\w][\w.\-/]*[\w]", text):
        inner = token[1:-1]
        if len(token) >= 3 and (
            re.search(r"\d", token)
            or "/" in token
            or "." in inner
            or "_" in inner
            or re.search(r"[a-z][A-Z]", token)
        ):
            found.add(token)
    return frozenset(found)


@given(st.text(alphabet="aZbQ_./-09 x\nYé²", max_size=80))
@settings(max_examples=300, deadline=None)
def test_identifiers_are_the_plain_definitions(text: str) -> None:
    assert identifiers(text) == _plain_identifiers(text)


@settings(max_examples=40, deadline=None)
@given(
    widths=st.lists(st.integers(40, 9_000), min_size=3, max_size=14),
    keep=st.integers(300, 3_000),
)
def test_a_cut_in_the_middle_keeps_about_what_it_was_asked_to(widths: list[int], keep: int) -> None:
    """Head and tail stop at a line end only where one is near: a text of a few long lines (a
    grep of a JSON file, 11 lines of up to 8 000 characters) kept about half of what a cut
    asked for when head and tail fell back to their line ends, and the request went out at
    77 % of its budget. Lines as wide as `widths`, cut to keep `keep` tokens: it keeps at least
    80 % of them, and never more."""
    text = "\n".join(
        " ".join(f"w{n}x{i}" for i in range(width // 8)) for n, width in enumerate(widths)
    )
    tokens = METER.tokens(text)
    cut, removed = cut_middle(text, keep, METER, tokens=tokens)
    if len(tokens) <= keep:
        assert (cut, removed) == (text, 0)
        return
    kept = len(tokens) - removed
    event(f"lines of {max(widths) // 1000}K characters at most")
    assert 0.8 * keep <= kept <= keep
