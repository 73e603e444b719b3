"""When brim's own measurement of a request bears out what a provider's overflow error states."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from brim.policies.evidence import RATIO, Sent, output_counts_unproven, window_unproven


def test_a_window_near_or_below_what_brim_sent_is_borne_out() -> None:
    assert window_unproven(128_000, 130_000, Sent(129_000), output_counts=False) is None
    assert window_unproven(128_000, None, Sent(100_000), output_counts=False) is None
    # brim counted a little low (an estimate), the provider's count is close to it
    assert window_unproven(200_000, 210_000, Sent(180_000), output_counts=False) is None


def test_a_window_far_above_what_brim_sent_is_not() -> None:
    """ "Hello" (5 tokens) cannot have overflowed a 2 000-token window."""
    why = window_unproven(2_000, None, Sent(5), output_counts=False)
    assert why is not None and "far below" in why


def test_the_providers_count_must_be_near_brims() -> None:
    why = window_unproven(10, 999_999, Sent(8), output_counts=False)
    assert why is not None and "999999" in why
    assert window_unproven(8_000, 2_100, Sent(9_000), output_counts=False) is not None


def test_the_output_limit_and_a_clis_overhead_count_where_the_provider_counts_them() -> None:
    sent = Sent(90_000, output=30_000, overhead=10_000)
    assert sent.span(output_counts=False) == (90_000, 100_000)
    assert sent.span(output_counts=True) == (90_000, 130_000)
    # 70 000 input + 30 000 output against a 170 000 window: borne out only with the output
    small = Sent(70_000, output=30_000)
    assert window_unproven(170_000, 172_000, small, output_counts=False) is not None
    assert window_unproven(170_000, 172_000, small, output_counts=True) is None


def test_output_sharing_the_window_needs_the_requests_own_output_limit() -> None:
    assert output_counts_unproven(21_333, Sent(195_000, output=21_333)) is None
    assert output_counts_unproven(21_333, Sent(195_000)) == "the request set no output limit"
    why = output_counts_unproven(4_096, Sent(195_000, output=21_333))
    assert why is not None and "4096" in why
    assert output_counts_unproven(None, Sent(195_000, output=21_333)) is not None


@given(
    sent=st.integers(1, 2_000_000),
    stated=st.integers(1, 4_000_000),
    provider=st.none() | st.integers(1, 8_000_000),
)
def test_borne_out_exactly_within_the_ratio(sent: int, stated: int, provider: int | None) -> None:
    why = window_unproven(stated, provider, Sent(sent), output_counts=False)
    near = sent * RATIO >= stated and (provider is None or sent / RATIO <= provider <= sent * RATIO)
    assert (why is None) == near
