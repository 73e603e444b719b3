"""The default stage order. Later stages (limits, guard, retry, tracing) slot in before Forward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from adapters.registry import Upstreams
from middleware.base import Stage
from middleware.forward import Forward


class PipelineConfig(Protocol):
    """The part of brim's configuration the pipeline reads (`proxy.config.BrimConfig` has it)."""

    @property
    def models(self) -> Mapping[str, Any]: ...


def default_pipeline(config: PipelineConfig, upstreams: Upstreams) -> list[Stage]:
    return [Forward(upstreams)]
