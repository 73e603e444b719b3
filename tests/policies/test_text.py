"""Names lines (`policies.text.names_line`): what a stand-in lists of what it replaced."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from brim.policies.information import name_counts
from brim.policies.text import NAMES_LABEL, listed_names, names_line
from brim.policies.tokens import TokenCounter
from brim.proxy.resources import use_bundled_tiktoken_files

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
NAME = st.from_regex(r"[A-Za-z_][\w./\-]{0,30}|[0-9]{4,9}", fullmatch=True)


@given(st.lists(NAME, min_size=1, max_size=30, unique=True))
def test_a_names_line_reads_back_as_the_names_it_lists(named: list[str]) -> None:
    line = names_line(named)
    assert line.startswith(NAMES_LABEL)
    assert listed_names(line.removeprefix(NAMES_LABEL)) == named
    assert listed_names(", ".join(named)) == named  # as brim wrote it before 2026-12-07


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
