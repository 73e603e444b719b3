"""Typed settings of the pipeline's stages (`[guard]`), checked at construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policies.budget import DEFAULT_SAFETY_MARGIN
from policies.clear import ClearSettings
from policies.compress import DEFAULT_ORDER, REGISTRY
from policies.evict import EvictSettings
from policies.prune import PruneSettings
from policies.tokens import DEFAULT_CLAUDE_FACTOR
from policies.truncate import TruncateSettings


class GuardConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = True
    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=0, lt=0.5)
    low_water: float = Field(0.85, gt=0.1, le=1.0)
    repair_pairs: bool = True
    claude_token_factor: float = Field(DEFAULT_CLAUDE_FACTOR, ge=1, le=3)
    policies: tuple[str, ...] = DEFAULT_ORDER
    prune_tool_results: PruneSettings = PruneSettings()
    clear_tool_results: ClearSettings = ClearSettings()
    evict: EvictSettings = EvictSettings()
    truncate: TruncateSettings = TruncateSettings()

    @field_validator("policies")
    @classmethod
    def _known(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in names if name not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(REGISTRY)}")
        if len(set(names)) != len(names):
            raise ValueError("a policy is listed twice")
        return names

    def policy_settings(self) -> dict[str, BaseModel]:
        return {name: getattr(self, name) for name in REGISTRY}


class RetryConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = True
    max_attempts: int = Field(3, ge=0, le=10)
    steps: tuple[float, ...] = (0.2, 0.3, 0.4)  # share of the first attempt's tokens to cut

    @field_validator("steps")
    @classmethod
    def _fractions(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if not steps or not all(0 < step < 1 for step in steps):
            raise ValueError("steps must be one or more fractions between 0 and 1")
        return steps
