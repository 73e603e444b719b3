"""`[server] requests_per_minute` / `tokens_per_minute`: per brim key (per address without
keys), per-key overrides, shared through a real Redis, 429s in each wire API's shape that the
official SDKs raise as their rate-limit error."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import anthropic
import httpx
import openai
import pytest

from brim.middleware.services.rates import LocalRates
from brim.middleware.stages.ratelimit import reset_text
from tests.conftest import BrimFactory, RedisServer, every_api, fake_upstream
from tests.fakes import FakeProvider

HELLO = [{"role": "user", "content": "ping"}]
CHAT = {"model": "fake-model", "messages": HELLO}


def burst(base: str, count: int, **headers: str) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=30, headers=headers) as client:
            return list(
                await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=CHAT) for _ in range(count))
                )
            )

    return asyncio.run(run())


def test_40_requests_against_30_per_minute_get_exactly_10_429s(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(server={"requests_per_minute": 30})
    replies = burst(base, 40)
    refused = [r for r in replies if r.status_code == 429]
    assert len(refused) == 10 and len(provider.requests) == 30
    for reply in refused:
        assert 1 <= int(reply.headers["retry-after"]) <= 60
        assert reply.headers["x-ratelimit-limit-requests"] == "30"
        assert reply.headers["x-ratelimit-remaining-requests"] == "0"
        assert reply.headers["x-ratelimit-reset-requests"].endswith("s")
        error = reply.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "x-ratelimit-limit-tokens" not in refused[0].headers
    # Refusals are not failures: the loop guard (5 identical failures) stays out of it.
    more = burst(base, 10)
    assert {r.json()["error"]["code"] for r in more} == {"rate_limit_exceeded"}
    text = httpx.get(f"{base}/metrics").text
    assert re.search(r'brim_requests_rate_limited_total\{[^}]*limit="requests"[^}]*\} 20\.0', text)
    # Counted as brim's own refusal, not as the provider's error.
    assert re.search(r'brim_requests_total\{[^}]*outcome="rate_limited"[^}]*\} 20\.0', text)
    assert 'outcome="upstream_error"' not in text


def test_the_split_is_exact_over_two_instances_sharing_redis(
    brim: BrimFactory, provider: FakeProvider, redis_url: str
) -> None:
    settings = {"server": {"requests_per_minute": 30}, "cache": {"url": redis_url}}
    first, second = brim(**settings), brim(**settings)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            replies = await asyncio.gather(
                *(
                    client.post(f"{(first, second)[n % 2]}/v1/chat/completions", json=CHAT)
                    for n in range(40)
                )
            )
        return [reply.status_code for reply in replies]

    statuses = asyncio.run(run())
    assert statuses.count(429) == 10 and statuses.count(200) == 30
    assert len(provider.requests) == 30


def test_redis_down_falls_back_to_local_counts_never_a_500(
    brim: BrimFactory, redis_server: RedisServer
) -> None:
    base = brim(
        server={"requests_per_minute": 3},
        cache={"url": redis_server.url, "timeout_s": 0.5, "retry_s": 60},
    )
    redis_server.stop()
    statuses = [reply.status_code for reply in burst(base, 5)]
    assert sorted(statuses) == [200, 200, 200, 429, 429]


def test_tokens_per_minute_trips_on_one_huge_request(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(server={"tokens_per_minute": 1_000})
    small = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
    assert small.status_code == 200
    huge = {"model": "fake-model", "messages": [{"role": "user", "content": "word " * 5_000}]}
    reply = httpx.post(f"{base}/v1/chat/completions", json=huge)
    assert reply.status_code == 429
    error = reply.json()["error"]
    assert error["type"] == "tokens" and "too large" in error["message"]
    assert reply.headers["x-ratelimit-limit-tokens"] == "1000"
    assert int(reply.headers["x-ratelimit-remaining-tokens"]) < 1000
    assert "retry-after" in reply.headers
    assert len(provider.requests) == 1
    # The refused request was not counted: small ones still pass.
    assert httpx.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200


def test_limits_are_per_key_with_overrides(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RL_KEYS", "key-a,key-b,key-vip")
    monkeypatch.setenv("RL_VIP", "key-vip")
    base = brim(
        server={
            "api_keys_env": "RL_KEYS",
            "requests_per_minute": 2,
            "key_limits": {"vip": {"key_env": "RL_VIP", "requests_per_minute": 5}},
        }
    )

    def statuses(key: str, count: int) -> list[int]:
        return sorted(r.status_code for r in burst(base, count, authorization=f"Bearer {key}"))

    assert statuses("key-a", 3) == [200, 200, 429]
    assert statuses("key-b", 3) == [200, 200, 429]  # its own window
    assert statuses("key-vip", 6) == [200] * 5 + [429]


def test_a_key_limit_must_name_an_accepted_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from brim.proxy.config import BrimConfig

    monkeypatch.setenv("RL_KEYS", "key-a")
    monkeypatch.setenv("RL_OTHER", "key-z")
    with pytest.raises(ValueError, match=r"key_limits\.x"):
        BrimConfig(server={"api_keys_env": "RL_KEYS", "key_limits": {"x": {"key_env": "RL_OTHER"}}})


def test_no_limits_configured_means_no_rate_stage(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim()
    assert {r.status_code for r in burst(base, 40)} == {200}


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", CHAT, "openai"),
        ("/v1/responses", {"model": "fake-model", "input": "ping"}, "openai"),
        ("/v1/messages", {"model": "claude-x", "max_tokens": 10, "messages": HELLO}, "anthropic"),
        (
            "/v1beta/models/gem-x:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": "ping"}]}]},
            "gemini",
        ),
    ],
)
def test_the_429_comes_in_each_wire_apis_shape(
    brim: BrimFactory, provider: FakeProvider, path: str, body: dict[str, Any], shape: str
) -> None:
    base = brim(
        server={"requests_per_minute": 1},
        **every_api(provider),
    )
    assert httpx.post(f"{base}{path}", json=body).status_code == 200
    reply = httpx.post(f"{base}{path}", json=body)
    assert reply.status_code == 429
    assert reply.headers["x-ratelimit-limit-requests"] == "1"
    assert int(reply.headers["retry-after"]) >= 1
    error = reply.json()
    if shape == "openai":
        assert error["error"]["code"] == "rate_limit_exceeded"
    elif shape == "anthropic":
        assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
    else:
        assert error["error"]["status"] == "RESOURCE_EXHAUSTED"


def test_the_official_sdks_raise_their_rate_limit_errors(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        server={"requests_per_minute": 1},
        upstreams={
            "openai": fake_upstream(provider),
            "anthropic": {"api": "anthropic", "base_url": provider.url},
        },
        routes={"claude-*": "anthropic", "*": "openai"},
    )
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    oa.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as raised:
        oa.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    ant = anthropic.Anthropic(base_url=base, api_key="sk-ant", max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        ant.messages.create(
            model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )


def test_local_windows_reset_after_a_minute() -> None:
    now = [0.0]
    rates = LocalRates(timer=lambda: now[0])

    async def take() -> bool:
        return (await rates.take("h", 2, None, 0)).allowed

    async def scenario() -> None:
        assert [await take(), await take(), await take()] == [True, True, False]
        window = await rates.take("h", 2, None, 0)
        assert window.resets_in_s == 60
        now[0] = 59.9
        assert not await take()
        now[0] = 60.0
        assert await take()

    asyncio.run(scenario())


def test_reset_durations_are_written_as_openai_does() -> None:
    assert reset_text(0.25) == "250ms"
    assert reset_text(12.2) == "13s"
    assert reset_text(60) == "1m0s"
