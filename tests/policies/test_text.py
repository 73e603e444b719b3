"""Names lines (`policies.text.names_line`): what a stand-in lists of what it replaced."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from brim.policies.information import name_counts
from brim.policies.text import NAMES_LABEL, grouped, id_under_path, listed_names, names_line
from brim.policies.tokens import TokenCounter
from brim.proxy.resources import use_bundled_tiktoken_files

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
NAME = st.from_regex(r"[A-Za-z_][\w./\-]{0,30}|[0-9]{4,9}", fullmatch=True)


LINK = st.builds(
    lambda path, n: f"{path}/{n}",
    st.sampled_from(["gh.com/o/r/pull", "a/b"]),
    st.integers(1000, 99999),
)


@given(st.lists(NAME | LINK, min_size=1, max_size=30, unique=True))
def test_a_names_line_reads_back_as_the_names_it_lists(named: list[str]) -> None:
    """Read back, a line lists the names it was given: those under one path (`grouped`) where
    the first of them stood, every other one in its place."""
    line = names_line(named)
    assert line.startswith(NAMES_LABEL)
    # Each name where it stood, but an id under a path listed already: after its path's others.
    paths = [parts[0] if (parts := id_under_path(name)) else None for name in named]
    expected: list[str] = []
    for at, (name, path) in enumerate(zip(named, paths, strict=True)):
        if path is None:
            expected.append(name)
        elif path not in paths[:at]:
            expected += [other for other, under in zip(named, paths, strict=True) if under == path]
    assert listed_names(line.removeprefix(NAMES_LABEL)) == expected
    assert listed_names(", ".join(named)) == named  # as brim wrote it before 2026-12-07


def test_ids_under_one_path_are_written_under_it_once() -> None:
    """A project's pull-request links, a directory's numbered files: the path once and the ids
    under it, as a shell writes them, where the first stood. A path's one id, a path whose own
    part is not an id (`src/a/b.py`, `build/1234/x.py`) and every other name stay whole: an
    agent's next step names a file by its whole path."""
    named = [
        "github.com/o/r/pull/2385",
        "src/app.py",
        "github.com/o/r/pull/2390",
        "github.com/o/r/issues/4077",
        "src/a/b.py",
        "src/a/c.py",
        "build/1234/x.py",
        "github.com/o/r/pull/2401",
        "48213",
    ]
    line = names_line(named)
    assert line == NAMES_LABEL + " ".join(
        [
            "github.com/o/r/pull/{2385,2390,2401}",
            "src/app.py",
            "github.com/o/r/issues/4077",
            "src/a/b.py",
            "src/a/c.py",
            "build/1234/x.py",
            "48213",
        ]
    )
    assert grouped(["a/1234"]) == ["a/1234"]
    assert listed_names(line.removeprefix(NAMES_LABEL)) == [
        "github.com/o/r/pull/2385",
        "github.com/o/r/pull/2390",
        "github.com/o/r/pull/2401",
        *named[1:2],
        *named[3:7],
        "48213",
    ]


def test_each_listed_number_costs_its_own_tokens_and_one_more() -> None:
    """A space between two names, not a comma and a space: a six-digit number listed costs
    three tokens of o200k (its two of digits and the space), not four, so a line in the same
    room lists a third more of them."""
    numbers = [str(481_000 + 37 * n) for n in range(40)]

    def tokens(text: str) -> int:
        return COUNTER.raw_text(text, "o200k_base")

    added = tokens(names_line(numbers)) - tokens(NAMES_LABEL)
    assert added <= sum(tokens(number) + 1 for number in numbers)
    assert added < tokens(NAMES_LABEL + ", ".join(numbers)) - tokens(NAMES_LABEL)


def test_the_names_a_line_lists_are_names_of_the_text_they_came_from() -> None:
    text = "deploy 48213 to eu-west-1 via scripts/deploy.py (JIRA-4411)"
    named = list(name_counts(text))
    assert listed_names(names_line(named).removeprefix(NAMES_LABEL)) == named
    assert "48213" in named and "scripts/deploy.py" in named
