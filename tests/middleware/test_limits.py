"""ResolveLimits attaches the model's limits and the request's budget to every exchange."""

from __future__ import annotations

import logging
import threading
from typing import Any

import httpx
import openai
import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from adapters.base import UpstreamResponse
from adapters.exchange import Exchange
from middleware.limits import ResolveLimits
from policies.clients import ClientRule
from policies.limits import LimitSource, LimitsRegistry, ModelFacts
from policies.tokens import ChatCount, TokenCounter
from tests.conftest import BrimFactory


def exchange(
    model: str, body: dict[str, Any] | None = None, user_agent: str = "", **headers: str
) -> Exchange:
    full = {"model": model, "messages": [], **(body or {})}
    return Exchange(
        api="openai.chat",
        method="POST",
        endpoint="/chat/completions",
        query="",
        model=model,
        body=full,
        raw=orjson.dumps(full),
        headers=CIMultiDictProxy(CIMultiDict(headers)),
        stream=False,
        upstream="u",
        request_id="r",
        user_agent=user_agent,
    )


class RecordingCounter(TokenCounter):
    """Remembers which thread each exact count ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def chat(self, body: Any, tokenizer: str, model: str = "") -> ChatCount:
        self.threads.append(threading.current_thread())
        return super().chat(body, tokenizer, model)


class Capture:
    def __init__(self) -> None:
        self.seen: list[Exchange] = []

    async def __call__(self, exchange: Exchange) -> UpstreamResponse:
        self.seen.append(exchange)
        return UpstreamResponse(
            status=200, headers={"content-type": "application/json"}, body=b"{}"
        )


CLIENTS = {
    "claude-code": ClientRule(user_agent="claude-cli/*", cli="claude"),
    "tagged": ClientRule(header="x-agent: custom-*", cli_overhead=12_345),
}


@pytest.fixture
def stage() -> ResolveLimits:
    registry = LimitsRegistry({"local": ModelFacts(context_window=8_192, max_output=1_024)})
    return ResolveLimits(registry, RecordingCounter(), safety_margin=0.05, clients=CLIENTS)


async def test_budget_counts_reserved_output_and_margin(stage: ResolveLimits) -> None:
    capture = Capture()
    reply = await stage(exchange("local", {"max_tokens": 5_000}), capture)
    (seen,) = capture.seen
    assert seen.context is not None
    assert seen.context.limits.limits.context_window == 8_192
    assert seen.context.budget.reserved_output == 1_024  # capped at the model's max output
    assert seen.context.budget.effective() == 8_192 - 1_024 - 410
    assert reply.headers["x-brim-budget"] == str(8_192 - 1_024 - 410)


async def test_cli_model_ids_carry_their_overhead(stage: ResolveLimits) -> None:
    capture = Capture()
    await stage(exchange("claude:sonnet"), capture)
    budget = capture.seen[0].context.budget  # type: ignore[union-attr]
    assert budget.cli_overhead == 60_000
    assert budget.effective() == 200_000 - 60_000 - 10_000


async def test_client_rules_match_on_user_agent_or_header(stage: ResolveLimits) -> None:
    capture = Capture()
    await stage(exchange("local", user_agent="claude-cli/2.0.14 (external, cli)"), capture)
    await stage(exchange("local", **{"x-agent": "custom-bot"}), capture)
    await stage(exchange("local", user_agent="curl/8"), capture)
    contexts = [e.context for e in capture.seen]
    assert [c.client for c in contexts] == ["claude-code", "tagged", None]  # type: ignore[union-attr]
    assert [c.budget.cli_overhead for c in contexts] == [60_000, 12_345, 0]  # type: ignore[union-attr]


async def test_unknown_models_warn_once(
    stage: ResolveLimits, caplog: pytest.LogCaptureFixture
) -> None:
    capture = Capture()
    with caplog.at_level(logging.WARNING, logger="brim.limits"):
        for _ in range(3):
            await stage(exchange("acme-llm-7"), capture)
    warnings = [r for r in caplog.records if "acme-llm-7" in r.getMessage()]
    assert len(warnings) == 1
    assert "128000" in warnings[0].getMessage()
    assert capture.seen[0].context.limits.source is LimitSource.DEFAULT  # type: ignore[union-attr]


def test_invalid_margin_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="safety_margin"):
        ResolveLimits(LimitsRegistry(), TokenCounter(), safety_margin=1.5, clients={})


def test_budget_header_reaches_an_sdk_client(brim: BrimFactory) -> None:
    base = brim(
        models={"fake-model": {"context_window": 10_000, "max_output": 2_000}},
        guard={"safety_margin": 0.1},
    )
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=500
    )
    assert raw.headers["x-brim-budget"] == str(10_000 - 500 - 1_000)
    assert raw.parse().choices[0].message.content == "pong"
    streamed = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": "fake-model",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
    )
    assert streamed.headers["x-brim-budget"] == str(10_000 - 1_000)


def chatty(words: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "lorem ipsum " * words}]}


async def test_small_requests_are_counted_exactly_on_the_spot(stage: ResolveLimits) -> None:
    capture = Capture()
    body = chatty(100)
    reply = await stage(exchange("local", body), capture)
    tokens = capture.seen[0].context.tokens  # type: ignore[union-attr]
    assert tokens.exact == TokenCounter().chat(body, "o200k_base").total
    assert tokens.upper_bound >= tokens.exact
    assert stage.counter.threads == [threading.main_thread()]  # type: ignore[attr-defined]
    assert reply.headers["x-brim-tokens-in"] == str(tokens.exact)


async def test_large_requests_with_room_are_counted_beside_the_upstream_call(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    body = chatty(10_000)  # ~120 KB, far below a 1M window: the bound clears it
    reply = await stage(exchange("gpt-4.1", body), capture)
    tokens = capture.seen[0].context.tokens  # type: ignore[union-attr]
    assert tokens.exact is None and tokens.pending is not None  # forwarded before counting
    expected = TokenCounter().chat(body, "o200k_base").total
    assert await tokens.resolve() == expected
    assert reply.headers["x-brim-tokens-in"] == str(expected)
    assert stage.counter.threads[0] is not threading.main_thread()  # type: ignore[attr-defined]


async def test_large_requests_near_the_budget_are_counted_before_forwarding(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    body = chatty(30_000)  # ~360 KB against an 8k window: a decision hangs on the count
    await stage(exchange("local", body), capture)
    context = capture.seen[0].context
    assert context is not None and context.tokens.exact is not None
    assert context.tokens.exact == TokenCounter().chat(body, "o200k_base").total
    assert not context.fits
    assert stage.counter.threads[0] is not threading.main_thread()  # type: ignore[attr-defined]
