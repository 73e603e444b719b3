"""The token budget: how many input tokens a request may carry.

    effective = context_window − reserved_output − cli_overhead − ⌈safety_margin × context_window⌉
                − allocated

`reserved_output` is the request's own output limit (`max_tokens`, `max_completion_tokens`, …),
capped at the model's max output, and only where the provider counts output against the window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from brim.policies.limits import ResolvedLimits

DEFAULT_SAFETY_MARGIN = 0.05


@dataclass(frozen=True, slots=True)  # made once per resolution and request shape (remembered)
class TokenBudget:
    context_window: int
    reserved_output: int = 0
    cli_overhead: int = 0
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    allocated: int = 0
    # Input tokens still available, never negative: worked out when the budget is made (every
    # request asks for it several times).
    effective: int = field(init=False)

    def __post_init__(self) -> None:
        if self.context_window <= 0:
            raise ValueError(f"context_window must be positive, not {self.context_window}")
        if not 0 <= self.safety_margin < 1:
            raise ValueError(f"safety_margin must be in [0, 1), not {self.safety_margin}")
        if min(self.reserved_output, self.cli_overhead, self.allocated) < 0:
            raise ValueError("reserved output, CLI overhead and allocations cannot be negative")
        spent = self.reserved_output + self.cli_overhead + self.margin_tokens + self.allocated
        object.__setattr__(self, "effective", max(0, self.context_window - spent))

    @property
    def margin_tokens(self) -> int:
        # Rounded first, so float noise (0.07 × 100 = 7.000000000000001) costs no extra token.
        return math.ceil(round(self.safety_margin * self.context_window, 6))

    def fits(self, tokens: int) -> bool:
        return tokens <= self.effective

    def allocate(self, tokens: int) -> TokenBudget:
        """A budget with `tokens` more set aside (e.g. for a fixed system prompt)."""
        if tokens < 0:
            raise ValueError(f"cannot allocate a negative number of tokens ({tokens})")
        return dataclasses.replace(self, allocated=self.allocated + tokens)


def budget_for(
    resolved: ResolvedLimits,
    requested_output: int | None,
    *,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    cli_overhead: int | None = None,
) -> TokenBudget:
    """The budget of one request. `cli_overhead` (from a client rule) overrides the model id's."""
    limits = resolved.limits
    reserved = 0
    if limits.output_counts and requested_output is not None and requested_output > 0:
        reserved = min(requested_output, limits.max_output)
    return TokenBudget(
        context_window=limits.context_window,
        reserved_output=reserved,
        cli_overhead=resolved.cli_overhead if cli_overhead is None else cli_overhead,
        safety_margin=safety_margin,
    )


OUTPUT_LIMIT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The output limit a request sets for itself, in whichever wire API's spelling."""
    for name in OUTPUT_LIMIT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# How far brim's count may be from the provider's own, as a share of the budget, where brim can
# only estimate: Claude (Anthropic publishes no tokenizer: o200k_base × the model's ratio, learned
# from usage or else `claude_token_factor`) and Gemini (Google's tokenizer is not o200k_base,
# which brim counts with, × the learned ratio). A request whose estimate
# lies within the band around its budget may fit or not; the provider's own counter settles it.
# OpenAI's tokenizers are the ones brim counts with: no band, never asked.
ESTIMATE_BANDS: Mapping[str, float] = {"claude": 0.15, "gemini": 0.15}


def estimate_band(tokenizer: str, counted_by: str) -> float | None:
    """The error band of brim's count of a request for a model with `tokenizer`, served by an
    upstream speaking `counted_by` (`[upstreams.NAME] api`); None where brim's count is exact."""
    if tokenizer == "claude":
        return ESTIMATE_BANDS["claude"]
    return ESTIMATE_BANDS.get(counted_by)


def undecided(estimate: int, budget: int, band: float | None) -> bool:
    """Whether an estimate is too close to the budget to tell if the request fits: within
    ±band × budget of it. Requests that clearly fit or clearly do not are decided already."""
    if band is None or budget <= 0:
        return False
    return abs(estimate - budget) <= band * budget
