"""`default_pipeline`: every stage in its order, each built by its own `from_config`, a stage
that is off left out."""

from __future__ import annotations

from typing import Any

from brim.middleware.pipeline import default_pipeline
from brim.middleware.stages.guard import Guard
from brim.middleware.stages.restore import RestoreRounds
from brim.middleware.stages.retry import RetryOnOverflow
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


def test_the_guard_restore_and_retry_share_one_set_of_policies() -> None:
    """The policies remember what they pruned and cleared: one set serves every stage that
    compresses, so what the guard worked out is not worked out again by the retry."""
    config = BrimConfig.model_validate({"restore": {"enabled": True}, "retry": {"enabled": True}})
    built = default_pipeline(config, build_services(config))
    (guard,) = [stage for stage in built if isinstance(stage, Guard)]
    (restore,) = [stage for stage in built if isinstance(stage, RestoreRounds)]
    (retry,) = [stage for stage in built if isinstance(stage, RetryOnOverflow)]
    assert len(guard.policies) == len(config.guard.policies)
    for stage in (restore, retry):
        assert len(stage.policies) == len(guard.policies)
        assert all(a is b for a, b in zip(stage.policies, guard.policies, strict=True))
