"""The default stage order: resolve limits → guard → (retry, in a later release) → forward."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from adapters.registry import Upstreams
from middleware.base import Stage
from middleware.forward import Forward
from middleware.guard import Guard
from middleware.limits import ResolveLimits
from middleware.settings import GuardConfig
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


@dataclass(frozen=True, slots=True)
class Services:
    """Long-lived objects the stages share: upstream connections, limits (with what was learned
    from provider errors), and the token counter with its cache."""

    upstreams: Upstreams
    limits: LimitsRegistry
    counter: TokenCounter


def default_pipeline(config: PipelineConfig, services: Services) -> list[Stage]:
    return [
        ResolveLimits(
            services.limits,
            services.counter,
            safety_margin=config.guard.safety_margin,
            clients=config.clients,
        ),
        *(
            [
                Guard(
                    services.counter,
                    build_policies(config.guard.policies, config.guard.policy_settings()),
                    low_water=config.guard.low_water,
                    repair_pairs=config.guard.repair_pairs,
                )
            ]
            if config.guard.enabled
            else []
        ),
        Forward(services.upstreams),
    ]
