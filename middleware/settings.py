"""Typed settings of the pipeline's stages (`[guard]`), checked at construction."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from brim.policies.budget import DEFAULT_SAFETY_MARGIN
from brim.policies.clear import ClearSettings
from brim.policies.compress import DEFAULT_ORDER, REGISTRY
from brim.policies.evict import EvictSettings
from brim.policies.prune import PruneSettings
from brim.policies.tokens import DEFAULT_CLAUDE_FACTOR
from brim.policies.truncate import TruncateSettings


class GuardConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = True
    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=0, lt=0.5)
    low_water: float = Field(0.85, gt=0.1, le=1.0)
    # A compressed session's next turns go out as its compressed request plus what is new,
    # while that fits (the provider's prompt cache keeps the prefix); the next re-cut leaves
    # room for this many turns of the session's growth (at most down to 70 % of the budget).
    carry_forward: bool = True
    room_for_turns: float = Field(4, ge=0, le=100)
    session_memory_mb: float = Field(32, gt=0)
    warn_at: float = Field(0.8, gt=0, le=1.0)  # x-brim-context-warning above this usage
    loop_limit: int = Field(5, ge=0)  # identical failures before brim answers 429 itself (0: off)
    loop_window_s: float = Field(120, gt=0)
    repair_pairs: bool = True
    # A request over its model's budget goes whole to the first of the model's fallbacks
    # (`[models."ID"] fallbacks`) that holds it, before anything is cut
    # (`middleware.stages.fallback`).
    prefer_fallback: bool = True
    claude_token_factor: float = Field(DEFAULT_CLAUDE_FACTOR, ge=1, le=3)
    # Learn each model's ratio of the provider's input tokens to brim's count from the usage in
    # its replies, and count with it (`policies.ratios`); off: the factors above, fixed.
    learn_token_ratios: bool = True
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


class TelemetryConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    service_name: str = "brim"
    traces: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str = "http://127.0.0.1:4318"  # OTLP/HTTP; /v1/traces and /v1/metrics
    sample_ratio: float = Field(1.0, ge=0, le=1)
    prometheus: bool = True  # GET /metrics
    otlp_metrics: bool = False
    otlp_metrics_interval_s: float = Field(60, gt=0)
    capture_content: bool = False  # put message bodies on spans: off unless you need it


class AuditConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    path: str | None = None  # unset: no audit log
    max_mb: float = Field(10, gt=0)
    backups: int = Field(5, ge=0)


class ArchiveConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = False
    dir: str = "~/.local/state/brim/archive"
    ttl_hours: float = Field(72, gt=0)
    cleanup_interval_s: float = Field(600, gt=0)


class SummarizeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = False  # it costs a model call on the requests that need it
    provider: str | None = None  # a cheap, fast model, routed like any other
    providers: tuple[str, ...] = ()  # fallbacks, in order
    timeout_s: float = Field(120, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    retry_delay_s: float = Field(3, ge=0)
    deadline_s: float = Field(30, gt=0)  # slower than this: go on with evict's notice
    cache: bool = True
    cache_ttl_hours: float = Field(24, gt=0)
    prompt_version: Literal["v1"] = "v1"
    truncate_fallback: bool = True

    @field_validator("provider")
    @classmethod
    def _named(cls, provider: str | None) -> str | None:
        return provider.strip() or None if provider is not None else None

    def chain(self) -> tuple[str, ...]:
        return tuple(p for p in (self.provider, *self.providers) if p)


class RestoreConfig(BaseModel):
    """Nothing cut is lost: the model may fetch back what brim removed, by its key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool = True
    max_rounds: int = Field(3, ge=1, le=10)  # restore rounds brim answers in one request
    store_mb: float = Field(64, gt=0)  # in-process store (and local copy when Redis is used)
    ttl_hours: float = Field(24, gt=0)


class CacheConfig(BaseModel):
    """Redis, shared by every brim process and instance that names it
    (`middleware.services.shared`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    url: str | None = None  # e.g. "redis://127.0.0.1:6379/0"; unset: each process on its own
    refresh_s: float = Field(1.0, gt=0, le=60)  # how often each process syncs with Redis
    retry_s: float = Field(5.0, gt=0, le=600)  # while Redis is unreachable, how often to retry
    timeout_s: float = Field(2.0, gt=0, le=60)  # to connect, and for each answer
