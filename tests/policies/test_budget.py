"""The token budget: the arithmetic, building it from resolved limits, and output limits."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.budget import DEFAULT_SAFETY_MARGIN, TokenBudget, budget_for, requested_output
from brim.policies.limits import LimitSource, ModelContextLimits, ModelId, ResolvedLimits


def resolved(
    *,
    window: int = 200_000,
    max_output: int = 64_000,
    output_counts: bool = True,
    cli_overhead: int = 0,
) -> ResolvedLimits:
    model = ModelId(
        raw="claude:sonnet",
        cli="claude",
        provider="anthropic",
        name="sonnet",
        candidates=("claude:sonnet", "sonnet"),
    )
    limits = ModelContextLimits(
        provider="anthropic",
        model="claude:sonnet",
        context_window=window,
        max_output=max_output,
        output_counts=output_counts,
        tokenizer="claude",
    )
    sources = {
        "context_window": LimitSource.BUILTIN,
        "max_output": LimitSource.BUILTIN,
        "tokenizer": LimitSource.BUILTIN,
    }
    return ResolvedLimits(model=model, limits=limits, sources=sources, cli_overhead=cli_overhead)


# ---- TokenBudget ---------------------------------------------------------------------------


def test_effective_subtracts_reserved_overhead_and_margin() -> None:
    budget = TokenBudget(
        context_window=200_000, reserved_output=4_096, cli_overhead=60_000, safety_margin=0.05
    )
    assert budget.margin_tokens == 10_000
    assert budget.effective == 200_000 - 4_096 - 60_000 - 10_000 == 125_904


def test_default_margin_is_five_percent() -> None:
    assert DEFAULT_SAFETY_MARGIN == 0.05
    assert TokenBudget(context_window=100_000).effective == 95_000


def test_margin_is_rounded_up() -> None:
    budget = TokenBudget(context_window=1_001, safety_margin=0.1)  # 100.1 → 101
    assert budget.margin_tokens == 101
    assert budget.effective == 900


def test_float_noise_in_the_margin_costs_no_extra_token() -> None:
    assert 0.07 * 100 > 7  # 7.000000000000001
    assert TokenBudget(context_window=100, safety_margin=0.07).margin_tokens == 7


def test_fits_at_the_boundary() -> None:
    budget = TokenBudget(context_window=10_000, reserved_output=1_000, safety_margin=0)
    assert budget.effective == 9_000
    assert budget.fits(9_000)
    assert not budget.fits(9_001)
    assert budget.fits(0)


def test_allocate_returns_a_new_budget_and_leaves_the_original_alone() -> None:
    budget = TokenBudget(context_window=10_000, cli_overhead=2_000, safety_margin=0)
    smaller = budget.allocate(1_500)
    assert smaller is not budget
    assert budget.allocated == 0
    assert budget.effective == 8_000
    assert smaller.allocated == 1_500
    assert smaller.effective == 6_500
    assert smaller.allocate(500).effective == 6_000
    assert smaller.allocate(0).effective == 6_500
    assert not smaller.fits(8_000)


def test_negative_allocation_raises() -> None:
    budget = TokenBudget(context_window=10_000)
    with pytest.raises(ValueError, match="negative"):
        budget.allocate(-1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_window": 0},
        {"context_window": -1},
        {"context_window": 1_000, "safety_margin": 1.0},
        {"context_window": 1_000, "safety_margin": 1.5},
        {"context_window": 1_000, "safety_margin": -0.01},
        {"context_window": 1_000, "safety_margin": float("nan")},
        {"context_window": 1_000, "reserved_output": -1},
        {"context_window": 1_000, "cli_overhead": -1},
        {"context_window": 1_000, "allocated": -1},
    ],
)
def test_invalid_budget_raises(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TokenBudget(**kwargs)


def test_effective_never_goes_below_zero() -> None:
    budget = TokenBudget(context_window=1_000, reserved_output=800, cli_overhead=800)
    assert budget.effective == 0
    assert budget.fits(0)
    assert not budget.fits(1)
    assert budget.allocate(10_000).effective == 0


def test_budget_is_frozen() -> None:
    budget = TokenBudget(context_window=1_000)
    with pytest.raises(AttributeError):
        budget.allocated = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        budget.effective = 5  # type: ignore[misc]
    assert (budget.allocated, budget.effective) == (0, 950)


def test_allocate_makes_a_new_budget_and_leaves_the_old_one_as_it_was() -> None:
    budget = TokenBudget(context_window=1_000, safety_margin=0.0)
    bigger = budget.allocate(5)
    assert (budget.allocated, budget.effective) == (0, 1_000)
    assert (bigger.allocated, bigger.effective) == (5, 995)
    assert bigger == TokenBudget(context_window=1_000, safety_margin=0.0, allocated=5)


# ---- budget_for ----------------------------------------------------------------------------


def test_spec_example_cli_overhead_without_margin_or_output() -> None:
    budget = budget_for(resolved(window=200_000, cli_overhead=60_000), None, safety_margin=0)
    assert budget.cli_overhead == 60_000
    assert budget.reserved_output == 0
    assert budget.effective == 140_000


def test_requested_output_is_reserved() -> None:
    budget = budget_for(resolved(max_output=64_000), 4_096, safety_margin=0)
    assert budget.reserved_output == 4_096
    assert budget.effective == 200_000 - 4_096


def test_requested_output_is_capped_at_the_model_max_output() -> None:
    budget = budget_for(resolved(max_output=64_000), 1_000_000, safety_margin=0)
    assert budget.reserved_output == 64_000
    assert budget.effective == 136_000


def test_nothing_reserved_when_output_does_not_count_against_the_window() -> None:
    budget = budget_for(resolved(output_counts=False), 32_000, safety_margin=0)
    assert budget.reserved_output == 0
    assert budget.effective == 200_000


@pytest.mark.parametrize("requested", [None, 0])
def test_nothing_reserved_when_nothing_is_requested(requested: int | None) -> None:
    budget = budget_for(resolved(), requested, safety_margin=0)
    assert budget.reserved_output == 0
    assert budget.effective == 200_000


def test_cli_overhead_keyword_overrides_the_resolved_one() -> None:
    limits = resolved(cli_overhead=60_000)
    assert budget_for(limits, None, safety_margin=0, cli_overhead=10_000).effective == 190_000
    assert budget_for(limits, None, safety_margin=0, cli_overhead=0).effective == 200_000
    assert budget_for(limits, None, safety_margin=0).effective == 140_000


def test_budget_for_uses_the_default_margin() -> None:
    budget = budget_for(resolved(window=200_000), None)
    assert budget.safety_margin == DEFAULT_SAFETY_MARGIN
    assert budget.effective == 190_000


def test_budget_for_passes_the_margin_through() -> None:
    budget = budget_for(resolved(window=200_000, cli_overhead=60_000), 4_096, safety_margin=0.05)
    assert budget.effective == 125_904


# ---- requested_output ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, None),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_output_tokens": 300}, 300),
        ({"max_tokens": 100, "max_completion_tokens": 200, "max_output_tokens": 300}, 200),
        ({"max_tokens": 100, "max_output_tokens": 300}, 100),
        ({"max_completion_tokens": 0, "max_tokens": 100}, 100),
        ({"max_completion_tokens": -5, "max_output_tokens": 300}, 300),
        ({"max_completion_tokens": True, "max_tokens": 7}, 7),
        ({"max_tokens": False}, None),
        ({"max_tokens": "100"}, None),
        ({"max_tokens": 100.0}, None),
        ({"max_tokens": None, "max_output_tokens": 9}, 9),
        ({"max_tokens": [100]}, None),
        ({"max_tokens": 0, "max_completion_tokens": -1, "max_output_tokens": True}, None),
        ({"messages": [], "model": "gpt-4o"}, None),
    ],
)
def test_requested_output(body: dict[str, Any], expected: int | None) -> None:
    assert requested_output(body) == expected


# ---- properties ----------------------------------------------------------------------------


@given(
    window=st.integers(1, 2_000_000),
    reserved=st.integers(0, 500_000),
    overhead=st.integers(0, 500_000),
    allocated=st.integers(0, 500_000),
    margins=st.lists(st.floats(0, 1, exclude_max=True, allow_nan=False), min_size=2, max_size=2),
)
def test_effective_is_bounded_and_shrinks_as_the_margin_grows(
    window: int, reserved: int, overhead: int, allocated: int, margins: list[float]
) -> None:
    low, high = sorted(margins)
    budgets = [
        TokenBudget(
            context_window=window,
            reserved_output=reserved,
            cli_overhead=overhead,
            safety_margin=margin,
            allocated=allocated,
        )
        for margin in (low, high)
    ]
    for budget in budgets:
        assert 0 <= budget.effective <= window
        assert budget.effective == max(
            0,
            window
            - reserved
            - overhead
            - math.ceil(round(budget.safety_margin * window, 6))
            - allocated,
        )
    assert budgets[1].effective <= budgets[0].effective
