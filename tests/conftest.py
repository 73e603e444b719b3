from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

# CI explores the same examples every run, so a red run can be reproduced; locally they vary.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
for _name in [name for name in os.environ if name.startswith("BRIM_")]:
    del os.environ[_name]  # a developer's own BRIM_ settings must not leak into the tests

from proxy.app import bound_port, start  # noqa: E402
from proxy.config import BrimConfig  # noqa: E402
from tests.fake_anthropic import FakeAnthropic  # noqa: E402
from tests.fakes import FakeProvider, LoopThread, free_port, start_app  # noqa: E402


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def _provider(loop_thread: LoopThread) -> Iterator[FakeProvider]:
    provider = FakeProvider()
    runner, url = loop_thread.run(start_app(provider.app()))
    provider.url = url
    yield provider
    loop_thread.run(runner.cleanup())


@pytest.fixture
def provider(_provider: FakeProvider) -> FakeProvider:
    _provider.reset()
    return _provider


@pytest.fixture(scope="session")
def _anthropic_fake(loop_thread: LoopThread) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic()
    runner, url = loop_thread.run(start_app(fake.app()))
    fake.url = url
    yield fake
    loop_thread.run(runner.cleanup())


@pytest.fixture
def anthropic_fake(_anthropic_fake: FakeAnthropic) -> FakeAnthropic:
    _anthropic_fake.reset()
    return _anthropic_fake


def fake_upstream(provider: FakeProvider, **extra: Any) -> dict[str, Any]:
    return {"api": "openai", "base_url": f"{provider.url}/v1", **extra}


BrimFactory = Callable[..., str]


@pytest.fixture
def brim(loop_thread: LoopThread, provider: FakeProvider) -> Iterator[BrimFactory]:
    """Start brim in front of the fake provider; returns its base URL (without /v1).

    Keyword arguments are `proxy.toml` sections; by default one upstream, the fake provider.
    """
    runners = []

    def make(span_processors: Any = (), **sections: Any) -> str:
        sections.setdefault("upstreams", {"fake": fake_upstream(provider)})
        config = BrimConfig(**sections)
        runner = loop_thread.run(start(config, "127.0.0.1", 0, span_processors=span_processors))
        runners.append(runner)
        return f"http://127.0.0.1:{bound_port(runner)}"

    yield make
    for runner in runners:
        loop_thread.run(runner.cleanup())


@pytest.fixture
def closed_port() -> int:
    return free_port()
