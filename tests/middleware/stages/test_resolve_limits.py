"""ResolveLimits attaches the model's limits and the request's budget to every exchange."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any

import httpx
import openai
import orjson
import pytest

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.exchange import Exchange, RequestContext, RequestTokens
from brim.middleware.services.reply_headers import brim_headers
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.policies.budget import TokenBudget
from brim.policies.clients import ClientRule
from brim.policies.limits import LimitSource, LimitsRegistry, ModelFacts
from brim.policies.tokens import ChatCount, TokenCounter
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files
from tests import builders
from tests.conftest import BrimFactory
from tests.fake_anthropic import FakeAnthropic, token_count

use_bundled_tiktoken_files()


def exchange(
    model: str, body: dict[str, Any] | None = None, user_agent: str = "", **headers: str
) -> Exchange:
    full = {"model": model, "messages": [], **(body or {})}
    return builders.exchange(
        model=model,
        body=full,
        headers=headers,
        endpoint="/chat/completions",
        user_agent=user_agent,
    )


class RecordingCounter(TokenCounter):
    """Remembers which thread each exact count ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def request(
        self, wire: Any, body: Any, tokenizer: str, model: str = "", ratio: float | None = None
    ) -> ChatCount:
        self.threads.append(threading.current_thread())
        return super().request(wire, body, tokenizer, model, ratio)


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
    await stage(exchange("local", {"max_tokens": 5_000}), capture)
    (seen,) = capture.seen
    assert seen.context is not None
    assert seen.context.limits.limits.context_window == 8_192
    assert seen.context.budget.reserved_output == 1_024  # capped at the model's max output
    assert seen.context.budget.effective == 8_192 - 1_024 - 410
    headers = await brim_headers(seen.report, warn_at=1.0)
    assert headers["x-brim-budget"] == str(8_192 - 1_024 - 410)


async def test_cli_model_ids_carry_their_overhead(stage: ResolveLimits) -> None:
    capture = Capture()
    await stage(exchange("claude:sonnet"), capture)
    budget = capture.seen[0].context.budget  # type: ignore[union-attr]
    assert budget.cli_overhead == 60_000
    assert budget.effective == 200_000 - 60_000 - 10_000


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


async def test_the_context_1m_beta_gives_an_anthropic_model_a_million_token_window(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    betas = {"anthropic-beta": "interleaved-thinking-2025-05-14, context-1m-2025-08-07"}
    await stage(exchange("claude-sonnet-4-5", None, "", **betas), capture)
    await stage(exchange("claude-sonnet-4-5"), capture)
    await stage(exchange("gpt-4o", None, "", **betas), capture)
    long, plain, other = (e.context for e in capture.seen)
    assert long is not None and plain is not None and other is not None
    assert long.limits.limits.context_window == 1_000_000
    assert long.limits.source is LimitSource.HEADER
    assert long.budget.effective == 1_000_000 - 50_000  # Claude's output has its own room
    assert plain.limits.limits.context_window == 200_000
    assert plain.budget.effective == 200_000 - 10_000
    assert other.limits.limits.context_window == 128_000  # not an Anthropic model: no change


def file_reading_session(turns: int) -> list[dict[str, Any]]:
    """A tool-use session: each turn reads a ~10k-token file."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Find the bug in the payment service."}
    ]
    for turn in range(turns):
        use_id = f"toolu_{turn:03d}"
        path = f"src/module_{turn}.py"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": use_id, "name": "read_file", "input": {"path": path}}
                ],
            }
        )
        text = "\n".join(
            f"{n:5d}  def handler_{turn}_{n}(request): return compute(request, {n * 7 + turn})"
            for n in range(440)
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use_id, "content": text}],
            }
        )
    return messages


def test_a_1m_context_claude_session_is_not_compressed_to_200k(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    base = brim(upstreams={"claude": {"api": "anthropic", "base_url": anthropic_fake.url}})
    # Claude Code's 1M Sonnet: a dated id (the fake reads no window into its date suffix).
    body: dict[str, Any] = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 1_024}
    body["messages"] = file_reading_session(30)
    tokens = token_count(body)
    assert 250_000 < tokens < 400_000
    headers = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
    betas = "interleaved-thinking-2025-05-14,context-1m-2025-08-07"

    long = httpx.post(
        f"{base}/v1/messages", json=body, headers={**headers, "anthropic-beta": betas}, timeout=60
    )
    assert long.status_code == 200 and long.json()["content"][0]["text"] == "pong"
    assert long.headers["x-brim-budget"] == str(1_000_000 - 50_000)
    assert long.headers.get("x-brim-actions", "none") == "none"
    assert orjson.loads(anthropic_fake.last.body) == body  # forwarded as the client sent it
    assert anthropic_fake.counts[-1] == tokens

    plain = httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=60)
    assert plain.status_code == 200
    assert plain.headers["x-brim-budget"] == str(200_000 - 10_000)
    assert plain.headers["x-brim-actions"] != "none"
    assert anthropic_fake.counts[-1] <= 200_000 - 10_000 < tokens  # compressed to 200K


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


class Upstream(Capture):
    """Answers as an upstream would: after a wait (the provider working), remembering how many
    exact counts the stage had made when it was asked."""

    def __init__(self, counter: RecordingCounter) -> None:
        super().__init__()
        self.counter = counter
        self.counts_when_asked: list[int] = []

    async def __call__(self, exchange: Exchange) -> UpstreamResponse:
        self.counts_when_asked.append(len(self.counter.threads))
        await asyncio.sleep(0)  # the provider's turn: the loop runs what waits for it
        return await super().__call__(exchange)


async def test_small_requests_with_room_are_counted_on_the_loop_while_the_upstream_works(
    stage: ResolveLimits,
) -> None:
    """The bound clears the budget: nothing waits for the exact count, which is made on the
    event loop once the upstream is asked — and is exact by the time the reply's headers are."""
    counter = stage.counter
    assert isinstance(counter, RecordingCounter)
    upstream = Upstream(counter)
    body = chatty(100)
    await stage(exchange("local", body), upstream)
    assert upstream.counts_when_asked == [0]  # not counted before the upstream was called
    tokens = upstream.seen[0].context.tokens  # type: ignore[union-attr]
    assert tokens.exact is None and tokens.pending is not None and tokens.pending.done()
    expected = TokenCounter().request(CHAT, body, "o200k_base").total
    assert tokens.upper_bound > expected
    assert tokens.known() == expected  # what metrics and status read, without waiting
    assert counter.threads == [threading.main_thread()]  # on the loop, no thread hop
    headers = await brim_headers(upstream.seen[0].report, warn_at=1.0)
    assert headers["x-brim-tokens-in"] == str(expected)


async def test_small_requests_over_the_bound_are_counted_before_forwarding(
    stage: ResolveLimits,
) -> None:
    """A decision hangs on the count where the bound exceeds the budget: made at once."""
    counter = stage.counter
    assert isinstance(counter, RecordingCounter)
    upstream = Upstream(counter)
    body = chatty(700)  # ~8.4 KB: the bound exceeds the 7.7k budget, the count (~1.4k) fits
    await stage(exchange("local", body), upstream)
    assert upstream.counts_when_asked == [1]  # counted before the upstream was called
    context = upstream.seen[0].context
    assert context is not None and context.tokens.pending is None
    assert context.tokens.upper_bound > context.budget.effective
    assert context.tokens.exact == TokenCounter().request(CHAT, body, "o200k_base").total
    assert context.fits
    assert counter.threads == [threading.main_thread()]


async def test_a_pending_count_cancelled_with_its_request_is_not_made(
    stage: ResolveLimits,
) -> None:
    counter = stage.counter
    assert isinstance(counter, RecordingCounter)
    context = await stage.context_for(exchange("local", chatty(100)))
    pending = context.tokens.pending
    assert pending is not None and not pending.done()
    pending.cancel()  # the request that waited for it went away
    await asyncio.sleep(0)
    assert counter.threads == []
    assert context.tokens.known() == context.tokens.upper_bound


async def test_large_requests_with_room_are_counted_beside_the_upstream_call(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    body = chatty(10_000)  # ~120 KB, far below a 1M window: the bound clears it
    await stage(exchange("gpt-4.1", body), capture)
    tokens = capture.seen[0].context.tokens  # type: ignore[union-attr]
    assert tokens.exact is None and tokens.pending is not None  # forwarded before counting
    expected = TokenCounter().request(CHAT, body, "o200k_base").total
    assert await tokens.resolve() == expected
    headers = await brim_headers(capture.seen[0].report, warn_at=1.0)
    assert headers["x-brim-tokens-in"] == str(expected)
    assert stage.counter.threads[0] is not threading.main_thread()  # type: ignore[attr-defined]


async def test_large_requests_near_the_budget_are_counted_before_forwarding(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    body = chatty(30_000)  # ~360 KB against an 8k window: a decision hangs on the count
    await stage(exchange("local", body), capture)
    context = capture.seen[0].context
    assert context is not None and context.tokens.exact is not None
    assert context.tokens.exact == TokenCounter().request(CHAT, body, "o200k_base").total
    assert not context.fits
    assert stage.counter.threads[0] is not threading.main_thread()  # type: ignore[attr-defined]


async def test_the_count_never_exceeds_the_free_bound(stage: ResolveLimits) -> None:
    """Counting reads the parsed body, which writes `9e15` out again as `9000000000000000.0`;
    the provider reads the bytes sent. The bound holds for those bytes, so it caps the count."""
    capture = Capture()
    samples = ",".join(["9e15"] * 20_000)
    raw = (
        '{"model": "local", "messages": [{"role": "user", "content": '
        f'[{{"type": "input_audio", "samples": [{samples}]}}]}}]}}'
    ).encode()
    body = orjson.loads(raw)
    await stage(dataclasses.replace(exchange("local", body), raw=raw), capture)
    tokens = capture.seen[0].context.tokens  # type: ignore[union-attr]
    assert tokens.exact is not None and tokens.exact == tokens.upper_bound
    uncapped = TokenCounter().request(CHAT, body, "o200k_base").total
    assert uncapped > tokens.upper_bound  # what the cap corrects


async def test_a_budget_is_worked_out_once_and_again_when_a_window_is_learned(
    stage: ResolveLimits,
) -> None:
    capture = Capture()
    for _ in range(2):
        await stage(exchange("local", {"max_tokens": 100}), capture)
    first, second = (seen.context for seen in capture.seen)
    assert first is not None and second is not None
    assert second.budget is first.budget  # the same limits, output and client: remembered
    stage.registry.learn("local", 4_096)  # a provider said the window is smaller
    await stage(exchange("local", {"max_tokens": 100}), capture)
    learned = capture.seen[-1].context
    assert learned is not None and learned.budget.context_window == 4_096
    assert learned.budget.effective == 4_096 - 100 - 205
    # Another output limit or client rule is another budget.
    await stage(exchange("local", {"max_tokens": 200}), capture)
    await stage(exchange("local", {"max_tokens": 100}, **{"x-agent": "custom-1"}), capture)
    other_output, other_client = (seen.context for seen in capture.seen[-2:])
    assert other_output is not None and other_output.budget.reserved_output == 200
    assert other_client is not None and other_client.budget.cli_overhead == 12_345


def test_with_context_is_replace_with_the_context() -> None:
    plain = exchange("local", {"max_tokens": 100})
    context = RequestContext(
        LimitsRegistry().resolve("local"), TokenBudget(8_192), RequestTokens(upper_bound=10)
    )
    changed = plain.with_context(context)
    assert changed == dataclasses.replace(plain, context=context)
    assert changed.context is context and changed.report is plain.report
    assert plain.context is None
