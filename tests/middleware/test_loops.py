"""A client repeating the same failing request is stopped before it reaches the provider again."""

from __future__ import annotations

import httpx

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider

FAILING = {"model": "error-400", "messages": [{"role": "user", "content": "compact this"}]}


def test_the_same_failing_request_is_answered_429_after_the_limit(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(guard={"loop_limit": 3, "loop_window_s": 60})
    statuses = [
        httpx.post(f"{base}/v1/chat/completions", json=FAILING).status_code for _ in range(5)
    ]
    assert statuses == [400, 400, 400, 429, 429]
    assert len(provider.requests) == 3  # the provider was not called again
    stopped = httpx.post(f"{base}/v1/chat/completions", json=FAILING).json()["error"]
    assert stopped["code"] == "brim_repeated_failure" and "failed 3 times" in stopped["message"]
    other = {**FAILING, "messages": [{"role": "user", "content": "something else"}]}
    assert (
        httpx.post(f"{base}/v1/chat/completions", json=other).status_code == 400
    )  # a new request goes through
    assert (
        httpx.post(
            f"{base}/v1/chat/completions",
            json=FAILING,
            headers={"Authorization": "Bearer someone-else"},
        ).status_code
        == 400
    )


def test_a_success_clears_the_count(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim(guard={"loop_limit": 2})
    ok = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(4):
        assert httpx.post(f"{base}/v1/chat/completions", json=ok).status_code == 200


def test_anthropic_clients_get_it_in_their_shape(brim: BrimFactory, anthropic_fake: object) -> None:
    base = brim(
        upstreams={"claude": {"api": "anthropic", "base_url": "http://127.0.0.1:9"}},
        guard={"loop_limit": 1},
    )
    body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{base}/v1/messages", json=body).status_code == 502
    stopped = httpx.post(f"{base}/v1/messages", json=body)
    assert stopped.status_code == 429
    assert (
        stopped.json()["type"] == "error" and stopped.json()["error"]["type"] == "rate_limit_error"
    )
