"""Fixtures of the tests that run `brim serve` as its own process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.proxy.test_workers import Served, alive


@pytest.fixture
def launched() -> Iterator[list[Served]]:
    """The brims a test started (`tests.proxy.test_workers.start`): whatever is left of them is
    killed after it."""
    started: list[Served] = []
    yield started
    for served in started:
        if served.process.poll() is None:
            pids = served.workers()
            served.process.kill()
            served.process.wait(10)
            for pid in pids:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
