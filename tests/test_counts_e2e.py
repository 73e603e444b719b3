"""Counts right for every model, end to end through the clients' SDKs: a dated Claude id gets the
window Anthropic gives it (200 K, or 1 M with the context-1m beta) on every wire API, and one
message far over a Claude model's budget goes out close to the budget, not a fraction of it
(the counts it is cut by are scaled once)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from brim.policies.wires import WIRES
from tests.conftest import BrimFactory
from tests.fakes import LoopThread, start_app
from tests.usage_provider import UsageProvider, send

BETA = "context-1m-2025-08-07"
DATED = "claude-sonnet-4-20250514"  # litellm's map: 1 M (the beta's), dearer above 200 K


@pytest.fixture(scope="module")
def upstream(loop_thread: LoopThread) -> Iterator[UsageProvider]:
    provider = UsageProvider(ratio=1.15)  # counts as brim estimates Claude: 1.15 × o200k
    runner, provider.url = loop_thread.run(start_app(provider.app()))
    yield provider
    loop_thread.run(runner.cleanup())


def every_api_to(provider: UsageProvider) -> dict[str, Any]:
    """Every wire API's requests for any model to `provider`, in their own format."""
    return {
        "upstreams": {
            "chat": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "messages": {"api": "anthropic", "base_url": provider.url, "native_count": False},
            "gemini": {"api": "gemini", "base_url": provider.url, "native_count": False},
        },
        "guard": {"learn_token_ratios": False},  # the prior, 1.15: what the issue was seen with
    }


def ask(api: str, base: str, model: str, content: str, beta: bool = False) -> httpx.Headers:
    """One request through the API's own client, with the context-1m beta if `beta`."""
    return send(api, base, model, content, headers={"anthropic-beta": BETA} if beta else None)


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_dated_sonnet_4_id_has_200k_without_the_beta_and_1m_with_it(
    api: str, brim: BrimFactory, upstream: UsageProvider
) -> None:
    base = brim(**every_api_to(upstream))
    # Anthropic counts the reply apart from the window: the budget is the window less 5 %.
    assert ask(api, base, DATED, "hello")["x-brim-budget"] == str(190_000)
    assert ask(api, base, DATED, "hello", beta=True)["x-brim-budget"] == str(950_000)


def words(tokens: int) -> str:
    """About `tokens` tokens of o200k_base (each word below is two)."""
    return " ".join(f"w{n % 9_000}" for n in range(tokens // 2))


@pytest.mark.parametrize(
    ("api", "estimated"),
    [("anthropic.messages", 1_130_000), *((api, 230_000) for api in sorted(WIRES))],
)
def test_one_huge_message_goes_out_close_to_the_budget(
    api: str, estimated: int, brim: BrimFactory, upstream: UsageProvider
) -> None:
    """1.13 M tokens (as brim estimates Claude's) for a 200 K Claude model once went out at
    49 K, 230 K at ~115 K: the excess was counted in the provider's tokens and cut in the
    encoding's. Now both go out at ≥ 75 % of the window, within the budget."""
    base = brim(**every_api_to(upstream))
    headers = ask(api, base, DATED, words(int(estimated / 1.15)))
    assert int(headers["x-brim-tokens-in"]) >= estimated * 0.95
    assert headers["x-brim-actions"] == "truncate:1"
    sent = upstream.reported[-1]  # 1.15 × what the provider received, in o200k_base
    assert 0.98 * 190_000 <= sent <= 190_000  # ≥ 75 % of the window: close to the budget
    assert 0.98 * 190_000 <= int(headers["x-brim-tokens-out"]) <= 190_000
