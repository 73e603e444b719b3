"""Learning a model's token ratio: what is evidence, how far one reply moves it, how fast a
steady ratio is learned, its bounds, and what is adopted from elsewhere; which ratio a client is
counted at (its own once settled, else the median of the settled clients', else its own, else
the prior), and that one client cannot set it for the others."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.ratios import (
    BOUNDS,
    FULL_EVIDENCE,
    MIN_EVIDENCE,
    MIN_REPLIES,
    RATIOS_MAX,
    STEP,
    TTL_S,
    Ratio,
    Shared,
    TokenRatios,
    evidence,
    may_be_evidence,
    median,
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
        learned = ratios.observe("a", "up", "m", prior, counted, reported)
        held = ratios.get("a", "up", "m")
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
        ratios.observe("a", "up", "m", prior, size, round(size * target))
    assert abs(ratios.ratio("a", "up", "m", prior) / target - 1) <= 0.03
    # and a client that taught nothing yet is counted at it too: the median of one
    assert ratios.ratio("b", "up", "m", prior) == ratios.ratio("a", "up", "m", prior)


def test_a_small_request_teaches_less_than_a_full_one() -> None:
    small, full = updated(1.0, 1.5, FULL_EVIDENCE // 4), updated(1.0, 1.5, FULL_EVIDENCE)
    assert 1.0 < small < full
    assert updated(1.0, 1.5, FULL_EVIDENCE) == updated(1.0, 1.5, 10 * FULL_EVIDENCE)


def test_a_model_counted_exactly_stays_at_one() -> None:
    """The ratio is always taken against brim's count in its encoding (never against a count
    it scaled already), so replies that match brim's count keep 1 exactly."""
    ratios = TokenRatios()
    for size in range(1_000, 200_000, 3_000):
        ratios.observe("a", "up", "gpt-4o", 1.0, size, size)
    learned = ratios.get("a", "up", "gpt-4o")
    assert learned is not None and learned.value == 1.0 and learned.replies == 67


def test_ratios_are_kept_per_upstream_and_model_and_forgotten_after_their_ttl() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    ratios.observe("a", "a", "m", 1.0, 10_000, 15_000)
    assert ratios.ratio("a", "b", "m", 1.0) == 1.0  # another upstream's replies: not its evidence
    assert ratios.ratio("a", "a", "n", 1.15) == 1.15
    assert ratios.ratio("a", "a", "m", 1.0) > 1.0
    clock.now += TTL_S + 1
    assert ratios.ratio("a", "a", "m", 1.0) == 1.0
    assert ratios.learned() == {}
    assert ratios.models() == [] and ratios.shared("a", "m", 1.0) is None


def test_only_a_valid_and_later_ratio_is_adopted() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    now = clock.now
    assert not ratios.adopt("o", "up", "m", Ratio(3.5, 4, now))  # out of bounds
    assert not ratios.adopt("o", "up", "m", Ratio(float("nan"), 4, now))
    assert not ratios.adopt("o", "up", "m", Ratio(1.4, 0, now))  # learned from no reply
    assert not ratios.adopt("o", "up", "m", Ratio(1.4, 4, now + 3_600))  # from the future
    assert not ratios.adopt("o", "up", "m", Ratio(1.4, 4, now - TTL_S - 1))  # forgotten
    assert ratios.learned() == {}
    assert ratios.adopt("o", "up", "m", Ratio(1.4, 4, now - 10))
    assert not ratios.adopt("o", "up", "m", Ratio(1.2, 9, now - 20))  # older than the one held
    assert ratios.adopt("o", "up", "m", Ratio(1.3, 9, now))
    assert ratios.ratio("o", "up", "m", 1.0) == 1.3
    assert ratios.adopt("p", "up", "m", Ratio(1.2, 9, now - 20))  # another owner's: its own


def settle(ratios: TokenRatios, owner: str, ratio: float, replies: int = MIN_REPLIES) -> None:
    """`replies` full replies to `owner` that show `ratio` (gemini-ish model "m", prior 1)."""
    for _ in range(replies):
        ratios.observe(owner, "up", "m", 1.0, FULL_EVIDENCE, round(FULL_EVIDENCE * ratio))


def test_a_client_is_counted_at_its_own_settled_ratio_whatever_the_others_teach() -> None:
    ratios = TokenRatios()
    settle(ratios, "honest", 1.0)
    assert ratios.ratio("honest", "up", "m", 1.0) == 1.0
    settle(ratios, "hostile", 3.0, replies=40)  # as high as the bounds let it go
    assert ratios.ratio("hostile", "up", "m", 1.0) == BOUNDS[1]  # its own, for itself
    assert ratios.ratio("honest", "up", "m", 1.0) == 1.0


def test_an_unsettled_client_gets_the_median_so_one_of_three_moves_nothing() -> None:
    ratios = TokenRatios()
    settle(ratios, "a", 1.5, replies=12)
    settle(ratios, "b", 1.45, replies=12)
    settle(ratios, "hostile", 3.0, replies=40)
    a = ratios.ratio("a", "up", "m", 1.0)
    assert ratios.ratio("newcomer", "up", "m", 1.0) == a  # the middle of 1.45, 1.5, 3
    settle(ratios, "hostile-low", 0.5, replies=40)  # a fourth, pulling the other way
    assert ratios.ratio("newcomer", "up", "m", 1.0) in {a, ratios.ratio("b", "up", "m", 1.0)}
    shared = ratios.shared("up", "m", 1.0)
    assert shared is not None and (shared.owners, shared.settled, shared.replies) == (4, 4, 104)


def test_half_of_the_clients_cannot_pull_the_others_away_from_the_prior() -> None:
    """Of an even number of settled clients the middle one nearer the prior is taken: a
    hostile one of two, high or low, leaves the others at the honest one's ratio."""
    for hostile in (3.0, 0.5):
        ratios = TokenRatios()
        settle(ratios, "honest", 1.2, replies=12)
        settle(ratios, "hostile", hostile, replies=40)
        assert ratios.ratio("newcomer", "up", "m", 1.0) == ratios.ratio("honest", "up", "m", 1.0)
    assert median([], 1.0) is None
    assert median([2.0, 0.5], 1.0) == 0.5  # a tie in log space: the lower one
    assert median([1.3, 1.1, 1.2], 1.0) == 1.2


def test_before_anyone_settles_a_client_has_its_own_ratio_and_the_others_the_prior() -> None:
    ratios = TokenRatios()
    settle(ratios, "a", 1.5, replies=MIN_REPLIES - 1)
    own = ratios.ratio("a", "up", "m", 1.0)
    assert 1.3 < own < 1.5  # learning: its own evidence, for itself
    assert ratios.ratio("b", "up", "m", 1.0) == 1.0  # not yet a vote: the prior
    assert ratios.shared("up", "m", 1.0) == Shared(
        None, 1, 0, MIN_REPLIES - 1, ratios.learned()[("a", "up", "m")].updated
    )
    settle(ratios, "c", 1.2)  # c settles: a, still learning, is counted at the median now
    assert ratios.ratio("a", "up", "m", 1.0) == ratios.ratio("c", "up", "m", 1.0) < 1.3


def test_the_median_follows_what_is_forgotten() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    settle(ratios, "old", 1.1)
    clock.now += TTL_S / 2
    settle(ratios, "new", 2.0)
    old = ratios.ratio("old", "up", "m", 1.0)
    assert ratios.ratio("x", "up", "m", 1.0) == old  # of two, the one nearer the prior
    clock.now += TTL_S / 2 + 1  # "old" is forgotten: the votes are counted again
    assert ratios.ratio("x", "up", "m", 1.0) == ratios.ratio("new", "up", "m", 1.0) > old
    assert [owner for owner, _, _ in ratios.learned()] == ["new"]


def test_estimates_are_bounded_the_least_recently_used_going_first() -> None:
    clock = Clock()
    ratios = TokenRatios(timer=clock)
    settle(ratios, "steady", 1.5)
    for n in range(RATIOS_MAX + 500):  # a crowd of clients, each teaching one reply
        ratios.observe(f"o{n}", "up", f"m{n % 3}", 1.0, FULL_EVIDENCE, FULL_EVIDENCE)
        if n % 200 == 0:
            assert ratios.ratio("steady", "up", "m", 1.0) > 1.4  # used: kept
    held = ratios.learned()
    assert len(held) == RATIOS_MAX and ("steady", "up", "m") in held
    assert ("o0", "up", "m0") not in held  # the least recently used went
    assert ratios._indexed <= 2 * RATIOS_MAX  # the index of who taught what, bounded too
    shared = ratios.shared("up", "m0", 1.0)
    assert shared is not None and shared.owners == sum(1 for _, _, model in held if model == "m0")


@given(counted=st.integers(0, 10**7), over=st.integers(0, 10**6), reported=st.integers(-5, 10**8))
def test_a_reply_skipped_uncounted_could_not_have_been_evidence(
    counted: int, over: int, reported: int
) -> None:
    """`may_be_evidence` decides from a bound on brim's count, without counting: it never
    turns away a reply that `evidence` would take."""
    if evidence(counted, reported) is not None:
        assert may_be_evidence(counted + over, reported)
