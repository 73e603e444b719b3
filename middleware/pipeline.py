"""The default stage order: observe → loop breaker → resolve limits → rate limit (when `[server]`
sets limits) → prefer a fallback that holds the request → guard → restore rounds → retry on
overflow → learn token ratios → forward. Restore sits outside the retry, so every hidden round it
asks is retried too, and goes on from the request as the retry last sent it; the ratios are
learned from every call to an upstream, with the body that call sent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from brim.adapters.registry import Upstreams
from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.audit import AuditLog
from brim.middleware.services.instruments import Telemetry
from brim.middleware.services.rates import RateCounts
from brim.middleware.services.sessions import SessionMemory
from brim.middleware.services.shared import RedisLink, SharedState
from brim.middleware.services.status_board import StatusBoard
from brim.middleware.services.store import ContentStore
from brim.middleware.services.summarize import Summarizer
from brim.middleware.settings import GuardConfig, RestoreConfig, RetryConfig, SummarizeConfig
from brim.middleware.stage import Stage
from brim.middleware.stages.calibrate import LearnRatios
from brim.middleware.stages.fallback import PreferFallback
from brim.middleware.stages.forward import Forward
from brim.middleware.stages.guard import Guard
from brim.middleware.stages.loops import LoopBreaker
from brim.middleware.stages.observe import Observe
from brim.middleware.stages.ratelimit import RateLimit
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.middleware.stages.restore import RestoreRounds
from brim.middleware.stages.retry import RetryOnOverflow
from brim.policies.clients import ClientRule
from brim.policies.compress import build_policies
from brim.policies.limits import LimitsRegistry
from brim.policies.ratios import TokenRatios
from brim.policies.tokens import TokenCounter


class PipelineConfig(Protocol):
    """The part of brim's configuration the pipeline reads (`proxy.config.BrimConfig` has it)."""

    @property
    def guard(self) -> GuardConfig: ...

    @property
    def clients(self) -> Mapping[str, ClientRule]: ...

    @property
    def retry(self) -> RetryConfig: ...

    @property
    def summarize(self) -> SummarizeConfig: ...

    @property
    def restore(self) -> RestoreConfig: ...


@dataclass(frozen=True, slots=True)
class Services:
    """Long-lived objects the stages share: upstream connections, limits (with what was learned
    from provider errors), the token counter with its cache and the token ratios learned from
    the providers' usage, what reports on it all, and the state shared with other processes and
    instances. The stages themselves hold only their settings: a reload builds new stages
    around the same services (and replaces the services its changes touch: upstreams,
    `[models]`, the token counter, the summarizer, the session memory)."""

    upstreams: Upstreams
    limits: LimitsRegistry
    counter: TokenCounter
    telemetry: Telemetry
    status: StatusBoard
    shared: SharedState  # what processes and instances share (through Redis with [cache] url)
    audit: AuditLog | None = None
    archive: ContentArchive | None = None
    summarizer: Summarizer | None = None
    store: ContentStore | None = None  # originals the model may fetch back (`[restore]`)
    rates: RateCounts | None = None  # per-key rate windows, when `[server]` sets any limit
    ratios: TokenRatios = field(default_factory=TokenRatios)
    sessions: SessionMemory | None = None  # the guard's last cut per session (`carry_forward`)
    link: RedisLink | None = None  # the one Redis connection (`[cache] url`), for whoever needs it


def default_pipeline(config: PipelineConfig, services: Services) -> list[Stage]:
    """The stages in order (module doc), each built by its own `from_config`; a stage that is
    off (None) is left out. The compression policies are built once, for the guard, the
    restore rounds and the retry alike: they remember what they pruned and cleared, so a cut
    the guard made is not worked out again when the retry or a restore round cuts."""
    limits = ResolveLimits.from_config(config, services)
    policies = build_policies(config.guard.policies, config.guard.policy_settings())
    stages: list[Stage | None] = [
        Observe.from_config(config, services),
        LoopBreaker.from_config(config, services),
        limits,
        RateLimit.from_config(config, services),
        PreferFallback.from_config(config, services, limits),
        Guard.from_config(config, services, policies),
        RestoreRounds.from_config(config, services, policies),
        RetryOnOverflow.from_config(config, services, policies),
        LearnRatios.from_config(config, services),
        Forward.from_config(config, services),
    ]
    return [stage for stage in stages if stage is not None]
