"""The default stage order: resolve limits → guard → retry on overflow → forward."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from adapters.registry import Upstreams
from middleware.base import Stage
from middleware.forward import Forward
from middleware.guard import Guard
from middleware.limits import ResolveLimits
from middleware.retry import RetryOnOverflow
from middleware.settings import GuardConfig, RetryConfig
from policies.clients import ClientRule
from policies.compress import build_policies
from policies.limits import LimitsRegistry
from policies.tokens import TokenCounter


class PipelineConfig(Protocol):
    """The part of brim's configuration the pipeline reads (`proxy.config.BrimConfig` has it)."""

    @property
    def guard(self) -> GuardConfig: ...

    @property
    def clients(self) -> Mapping[str, ClientRule]: ...

    @property
    def retry(self) -> RetryConfig: ...


@dataclass(frozen=True, slots=True)
class Services:
    """Long-lived objects the stages share: upstream connections, limits (with what was learned
    from provider errors), and the token counter with its cache."""

    upstreams: Upstreams
    limits: LimitsRegistry
    counter: TokenCounter


def default_pipeline(config: PipelineConfig, services: Services) -> list[Stage]:
    guard = config.guard
    policies = build_policies(guard.policies, guard.policy_settings())
    stages: list[Stage] = [
        ResolveLimits(
            services.limits,
            services.counter,
            safety_margin=guard.safety_margin,
            clients=config.clients,
        )
    ]
    if guard.enabled:
        stages.append(
            Guard(
                services.counter,
                policies,
                low_water=guard.low_water,
                repair_pairs=guard.repair_pairs,
            )
        )
    if config.retry.enabled:
        stages.append(
            RetryOnOverflow(
                services.limits,
                services.counter,
                policies,
                services.upstreams.route,
                max_attempts=config.retry.max_attempts,
                steps=config.retry.steps,
                safety_margin=guard.safety_margin,
            )
        )
    stages.append(Forward(services.upstreams))
    return stages
