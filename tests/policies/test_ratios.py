"""Learning a model's token ratio: what is evidence, how far one reply moves it, how fast a
steady ratio is learned, its bounds, and what is adopted from elsewhere."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.ratios import (
    BOUNDS,
    FULL_EVIDENCE,
    MIN_EVIDENCE,
    STEP,
    TTL_S,
    Ratio,
    TokenRatios,
    evidence,
    may_be_evidence,
    updated,
)
from tests.policies.test_limits import _Clock as Clock


def test_what_a_reply_is_evidence_of() -> None:
    assert evidence(10_000, 15_000) == 1.5
    assert evidence(MIN_EVIDENCE - 1, 400) is None  # a tiny request: mostly fixed overhead
    assert evidence(10_000, 0) is None
    assert evidence(10_000, -5) is None
    assert evidence(10_000, 10**9) is None  # absurd: no evidence at all
    assert evidence(10_000, 4_999) is None  # under half of brim's count
    assert evidence(10_000, 30_001) is None  # over three times it
    assert evidence(10_000, 30_000) == BOUNDS[1]


replies = st.lists(
    st.tuples(st.integers(0, 2_000_000), st.integers(-10, 10**10)), min_size=1, max_size=40
)


@given(prior=st.floats(1.0, 3.0), seen=replies)
def test_no_sequence_of_replies_takes_the_ratio_out_of_bounds_or_far_in_one_step(
    prior: float, seen: list[tuple[int, int]]
) -> None:
    ratios = TokenRatios()
    before = prior
    for counted, reported in seen:
        learned = ratios.observe("up", "m", prior, counted, reported)
        held = ratios.get("up", "m")
        now = prior if held is None else held.value
        assert BOUNDS[0] <= now <= BOUNDS[1]
        assert max(now / before, before / now) <= math.sqrt(STEP) + 1e-9
        assert learned is not None or now == before  # no evidence: no change
        before = now


@pytest.mark.parametrize("prior", [1.0, 1.15])
@given(target=st.floats(0.8, 1.6), size=st.integers(FULL_EVIDENCE, 400_000))
def test_five_full_replies_of_a_steady_ratio_learn_it_within_3_percent(
    prior: float, target: float, size: int
) -> None:
    ratios = TokenRatios()
    for _ in range(5):
        ratios.observe("up", "m", prior, size, round(size * target))
    assert abs(ratios.ratio("up", "m", prior) / target - 1) <= 0.03


def test_a_small_request_teaches_less_than_a_full_one() -> None:
    small, full = updated(1.0, 1.5, FULL_EVIDENCE // 4), updated(1.0, 1.5, FULL_EVIDENCE)
    assert 1.0 < small < full
    assert updated(1.0, 1.5, FULL_EVIDENCE) == updated(1.0, 1.5, 10 * FULL_EVIDENCE)


def test_a_model_counted_exactly_stays_at_one() -> None:
    """The ratio is always taken against brim's count in its encoding (never against a count
    it scaled already), so replies that match brim's count keep 1 exactly."""
    ratios = TokenRatios()
    for size in range(1_000, 200_000, 3_000):
        ratios.observe("up", "gpt-4o", 1.0, size, size)
    learned = ratios.get("up", "gpt-4o")
    assert learned is not None and learned.value == 1.0 and learned.replies == 67


def test_ratios_are_kept_per_upstream_and_model_and_forgotten_after_their_ttl() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    ratios.observe("a", "m", 1.0, 10_000, 15_000)
    assert ratios.ratio("b", "m", 1.0) == 1.0  # another upstream's replies: not its evidence
    assert ratios.ratio("a", "n", 1.15) == 1.15
    assert ratios.ratio("a", "m", 1.0) > 1.0
    clock.now += TTL_S + 1
    assert ratios.ratio("a", "m", 1.0) == 1.0
    assert ratios.learned() == {}


def test_only_a_valid_and_later_ratio_is_adopted() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    now = clock.now
    assert not ratios.adopt("up", "m", Ratio(3.5, 4, now))  # out of bounds
    assert not ratios.adopt("up", "m", Ratio(float("nan"), 4, now))
    assert not ratios.adopt("up", "m", Ratio(1.4, 0, now))  # learned from no reply
    assert not ratios.adopt("up", "m", Ratio(1.4, 4, now + 3_600))  # from the future
    assert not ratios.adopt("up", "m", Ratio(1.4, 4, now - TTL_S - 1))  # forgotten
    assert ratios.learned() == {}
    assert ratios.adopt("up", "m", Ratio(1.4, 4, now - 10))
    assert not ratios.adopt("up", "m", Ratio(1.2, 9, now - 20))  # older than the one held
    assert ratios.adopt("up", "m", Ratio(1.3, 9, now))
    assert ratios.ratio("up", "m", 1.0) == 1.3


@given(counted=st.integers(0, 10**7), over=st.integers(0, 10**6), reported=st.integers(-5, 10**8))
def test_a_reply_skipped_uncounted_could_not_have_been_evidence(
    counted: int, over: int, reported: int
) -> None:
    """`may_be_evidence` decides from a bound on brim's count, without counting: it never
    turns away a reply that `evidence` would take."""
    if evidence(counted, reported) is not None:
        assert may_be_evidence(counted + over, reported)
