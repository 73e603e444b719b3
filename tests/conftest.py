from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI explores the same examples every run, so a red run can be reproduced; locally they vary.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Where tests keep what a person may want to look at afterwards (the dashboard's screenshot);
# read before the BRIM_ variables go. Unset: the test's own tmp dir.
ARTIFACTS = os.environ.get("BRIM_TEST_ARTIFACTS")
for _name in [name for name in os.environ if name.startswith("BRIM_")]:
    del os.environ[_name]  # a developer's own BRIM_ settings must not leak into the tests

from brim.proxy.app import bound_port, start  # noqa: E402
from brim.proxy.config import BrimConfig  # noqa: E402
from tests.fake_anthropic import FakeAnthropic  # noqa: E402
from tests.fakes import FakeProvider, LoopThread, free_port, start_app  # noqa: E402
from tests.usage_provider import UsageProvider  # noqa: E402


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


@pytest.fixture(scope="session")
def _usage_provider(loop_thread: LoopThread) -> Iterator[UsageProvider]:
    provider = UsageProvider()
    runner, provider.url = loop_thread.run(start_app(provider.app()))
    yield provider
    loop_thread.run(runner.cleanup())


@pytest.fixture
def usage_provider(_usage_provider: UsageProvider) -> UsageProvider:
    """The fake provider that reports usage at a ratio to brim's count (`UsageProvider`)."""
    _usage_provider.reset()
    return _usage_provider


def fake_upstream(provider: FakeProvider, **extra: Any) -> dict[str, Any]:
    return {"api": "openai", "base_url": f"{provider.url}/v1", **extra}


def every_api(provider: FakeProvider, anthropic_url: str | None = None) -> dict[str, Any]:
    """The `upstreams` and `routes` sections that route each wire API to a fake: Chat and
    Responses (and any other model) to `provider`, `claude-*` to the Anthropic fake at
    `anthropic_url` (else `provider`, which speaks Messages too), `gem*` to `provider`."""
    return {
        "upstreams": {
            "openai": fake_upstream(provider),
            "anthropic": {"api": "anthropic", "base_url": anthropic_url or provider.url},
            "gemini": {"api": "gemini", "base_url": provider.url},
        },
        "routes": {"claude-*": "anthropic", "gem*": "gemini", "*": "openai"},
    }


BrimFactory = Callable[..., str]


@pytest.fixture
def brim(loop_thread: LoopThread, provider: FakeProvider) -> Iterator[BrimFactory]:
    """Start brim in front of the fake provider; returns its base URL (without /v1).

    Keyword arguments are `proxy.toml` sections; by default one upstream, the fake provider.
    Or a whole `config`, as it is.
    """
    runners = []

    def make(config: BrimConfig | None = None, span_processors: Any = (), **sections: Any) -> str:
        if config is None:
            sections.setdefault("upstreams", {"fake": fake_upstream(provider)})
            config = BrimConfig(**sections)
        runner = loop_thread.run(start(config, "127.0.0.1", 0, span_processors=span_processors))
        runners.append(runner)
        return f"http://127.0.0.1:{bound_port(runner)}"

    yield make
    for runner in runners:
        loop_thread.run(runner.cleanup())


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """The folder for a test's artifacts: $BRIM_TEST_ARTIFACTS if set, else its tmp dir."""
    folder = Path(ARTIFACTS) if ARTIFACTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def closed_port() -> int:
    return free_port()


class RedisServer:
    """A real redis-server of the test's own: a free port, its own directory (its log is
    `redis.log` there), nothing persisted. `stop` kills it, as a crash would; `start` brings it
    back on the same port (the same `url`), empty."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10) -> None:
        """Start it and wait until it answers PING."""
        assert self.process is None, "redis-server is running already"
        log = self.directory / "redis.log"
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--logfile",
                str(log),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                said = log.read_text(errors="replace")[-2_000:] if log.exists() else ""
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{said}")
            time.sleep(0.05)

    def answers(self) -> bool:
        """Whether our redis-server is up and answering: the one on the port says it is our
        process (not another that had the port first, while ours fails to bind)."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                connection.sendall(b"INFO server\r\n")
                reply = b""
                while b"\r\nprocess_id:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = connection.recv(4096)
                    if not chunk:
                        return False
                    reply += chunk
        except OSError:
            return False
        said = reply.split(b"\r\nprocess_id:", 1)[1].split(b"\r\n", 1)[0]
        return said.strip() == str(self.process.pid).encode()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A running redis-server for the test, stopped after it. Without redis-server installed the
    test is skipped — but fails under CI (`CI` set), so that the Redis tests cannot pass there
    by not running: .ci/run installs it."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        pytest.skip("redis-server is not installed")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of a running redis-server of the test's own (see `redis_server`)."""
    return redis_server.url


@pytest.fixture
def chromium() -> str:
    """Debian's headless-capable Chromium. Without it the test is skipped — but fails under CI
    (`CI` set), as for redis-server: .ci/run installs it."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    return binary
