"""`brim serve --workers 2` without Redis: what one worker learns, every worker lists and uses;
what an operator forgets through one worker, every worker forgets (within a second).

A real supervisor and real workers, as `tests/proxy/test_workers.py` runs them; which worker
holds a connection is read from the kernel, so each request below goes to the worker meant.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import LoopThread, start_app, wait_for
from tests.proxy.conftest import launched  # noqa: F401
from tests.proxy.test_workers import Served, Upstream, start
from tests.security.test_learned_limits import REAL_WINDOW, Echoing, long_conversation

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ADMIN = "workers-admin-key-0123456789"
MODEL = "echo-w8000"  # the fake holds 8 000 tokens; brim knows nothing of it (128 000)


@pytest.fixture
def echoing_upstream(loop_thread: LoopThread) -> Iterator[Upstream]:
    fake = Echoing()
    runner, url = loop_thread.run(start_app(fake.app()))
    fake.url = fake.provider.url = url
    yield Upstream(fake.provider)
    loop_thread.run(runner.cleanup())


def call(
    connection: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"x-brim-admin-key": ADMIN, "Authorization": "Bearer sk-client"}
    data = None if body is None else json.dumps(body)
    if data is not None:
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=data, headers=headers)
    reply = connection.getresponse()
    return reply.status, dict(reply.getheaders()), json.loads(reply.read())


def learned(connection: http.client.HTTPConnection) -> dict[str, int]:
    status, _, listing = call(connection, "GET", "/admin/limits")
    assert status == 200 and listing["shared_with"] == "workers", listing
    return {row["model"]: row["value"] for row in listing["learned"]}


def chat(connection: http.client.HTTPConnection) -> dict[str, str]:
    messages = [{"role": role, "content": text} for role, text in long_conversation()]
    status, headers, _ = call(
        connection, "POST", "/v1/chat/completions", {"model": MODEL, "messages": messages}
    )
    assert status == 200
    return {k.lower(): v for k, v in headers.items()}


def test_every_worker_lists_uses_and_forgets_what_one_learned(
    launched: list[Served],  # noqa: F811
    tmp_path: Path,
    echoing_upstream: Upstream,
) -> None:
    served = start(
        launched,
        tmp_path,
        echoing_upstream,
        server='admin_keys_env = "WORKERS_ADMIN_KEYS"',
        env={"WORKERS_ADMIN_KEYS": ADMIN},
    )
    one, two = served.connection_to_each_worker().values()

    assert chat(one)["x-brim-retries"] == "1"  # the first worker overflows and learns
    assert learned(one) == {MODEL: REAL_WINDOW}
    assert wait_for(lambda: learned(two) == {MODEL: REAL_WINDOW}, timeout=10)
    assert chat(two)["x-brim-retries"] == "0"  # the second cuts up front

    status, _, done = call(two, "DELETE", f"/admin/limits/{MODEL}")
    assert status == 200 and [row["model"] for row in done["forgotten"]] == [MODEL]
    assert learned(two) == {}
    assert wait_for(lambda: learned(one) == {}, timeout=10)
    assert chat(one)["x-brim-retries"] == "1"  # it is found out again, and learned again
    assert wait_for(lambda: learned(two) == {MODEL: REAL_WINDOW}, timeout=10)

    status, _, done = call(one, "DELETE", "/admin/limits")
    assert status == 200 and learned(one) == {}
    assert wait_for(lambda: learned(two) == {}, timeout=10)
    assert served.stop() == 0
