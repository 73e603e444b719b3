"""Typed settings of the pipeline's stages (`[guard]`), checked at construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from policies.budget import DEFAULT_SAFETY_MARGIN
from policies.tokens import DEFAULT_CLAUDE_FACTOR


class GuardConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=0, lt=0.5)
    claude_token_factor: float = Field(DEFAULT_CLAUDE_FACTOR, ge=1, le=3)
