"""A client repeating the same failing request is stopped before it reaches the provider again."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

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
    reply = httpx.post(f"{base}/v1/chat/completions", json=FAILING)
    stopped = reply.json()["error"]
    assert stopped["code"] == "brim_repeated_failure" and "failed 3 times" in stopped["message"]
    assert 55 <= int(reply.headers["retry-after"]) <= 60  # the window, less the time since
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
    """One request fails, then succeeds, then fails again: the success restarted its count, so
    it takes two new failures (the limit) to stop it, not one."""
    base = brim(guard={"loop_limit": 2})
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}

    def send(failing: int | None) -> int:
        provider.failing = failing
        return httpx.post(f"{base}/v1/chat/completions", json=request).status_code

    assert [send(400), send(None), send(400), send(400), send(400)] == [400, 200, 400, 400, 429]
    assert len(provider.requests) == 4  # the last one was stopped in brim


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


def test_the_block_lifts_a_window_after_the_last_failure(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(guard={"loop_limit": 2, "loop_window_s": 1})
    statuses = [
        httpx.post(f"{base}/v1/chat/completions", json=FAILING).status_code for _ in range(3)
    ]
    assert statuses == [400, 400, 429] and len(provider.requests) == 2
    time.sleep(1.2)
    assert httpx.post(f"{base}/v1/chat/completions", json=FAILING).status_code == 400
    assert len(provider.requests) == 3  # it reached the provider again


def test_the_openai_sdk_sees_a_rate_limit_error_and_stops_calling_the_provider(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    sdk = openai.OpenAI(base_url=f"{brim(guard={'loop_limit': 2})}/v1", api_key="k", max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            sdk.chat.completions.create(**FAILING)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(**FAILING)
    assert caught.value.code == "brim_repeated_failure"
    assert len(provider.requests) == 2
