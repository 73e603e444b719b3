"""`default_pipeline`: every stage in its order, each built by its own `from_config`, a stage
that is off left out."""

from __future__ import annotations

from typing import Any

from brim.middleware.pipeline import default_pipeline
from brim.proxy.app import build_services
from brim.proxy.config import BrimConfig


def stages(sections: dict[str, Any]) -> list[str]:
    config = BrimConfig.model_validate(sections)
    return [type(stage).__name__ for stage in default_pipeline(config, build_services(config))]


def test_with_everything_on_every_stage_is_there_in_order() -> None:
    every = {
        "guard": {"prefer_fallback": True, "loop_limit": 3, "learn_token_ratios": True},
        "server": {"requests_per_minute": 5},
        "restore": {"enabled": True},
        "retry": {"enabled": True},
    }
    assert stages(every) == [
        "Observe",
        "LoopBreaker",
        "ResolveLimits",
        "RateLimit",
        "PreferFallback",
        "Guard",
        "RestoreRounds",
        "RetryOnOverflow",
        "LearnRatios",
        "Forward",
    ]


def test_a_stage_that_is_off_is_left_out() -> None:
    off = {
        "guard": {"enabled": False, "loop_limit": 0, "learn_token_ratios": False},
        "restore": {"enabled": False},
        "retry": {"enabled": False},
    }
    assert stages(off) == ["Observe", "ResolveLimits", "Forward"]
    # prefer_fallback needs the guard on
    no_guard = {"guard": {"enabled": False, "prefer_fallback": True}}
    assert "PreferFallback" not in stages(no_guard)
