"""brim learns each model's token ratio from the usage in its provider's replies, on every wire
API, streamed or not, through the clients' own SDKs: after five replies from a provider whose
tokenizer counts 1.5 × o200k_base, brim's count of the next request is within 3 % of the
provider's — for the client that taught it, and for another client (the median of the one that
settled). An upstream that reports absurd usage teaches nothing; one that reports the most the
bounds allow cannot take the ratio past them; a model brim counts exactly stays at 1."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from brim.policies.ratios import BOUNDS, MIN_REPLIES
from tests.conftest import BrimFactory, RedisServer
from tests.fakes import wait_for
from tests.usage_provider import UsageProvider, send

ADMIN = "calibrate-admin-key-0123456789"
ADMIN_ENV = "CALIBRATE_ADMIN_KEYS"
MODELS = {  # a model each API serves, and the ratio brim starts from (its tokenizer's prior)
    "openai.chat": ("llama-3.3-70b-instruct", 1.0),
    "anthropic.messages": ("claude-sonnet-4-6", 1.15),
    "openai.responses": ("acme-reasoner-2", 1.0),
    "gemini.generate": ("gemini-2.5-flash", 1.0),
}
WORDS = [
    "the",
    "build",
    "failed",
    "because",
    "module",
    "alpha",
    "imports",
    "beta",
    "which",
    "reads",
    "gamma",
    "config",
]


def sections(provider: UsageProvider, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every API routed to `provider` (without asking its token counters), admin status on."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    return {
        "upstreams": {
            "openai": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "anthropic": {"api": "anthropic", "base_url": provider.url, "native_count": False},
            "gemini": {"api": "gemini", "base_url": provider.url, "native_count": False},
        },
        "routes": {"claude-*": "anthropic", "gemini-*": "gemini", "*": "openai"},
        "server": {"admin_keys_env": ADMIN_ENV},
    }


def text(seed: int, words: int = 3_000) -> str:
    """About `words` × 1.7 tokens of log-like text, different for each seed."""
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 99)}" for _ in range(words))


def ask(api: str, base: str, model: str, content: str, stream: bool, key: str | None = None) -> int:
    """brim's count of one request (`x-brim-tokens-in`), sent through the API's own client
    with the provider key `key` (else the one client's of `send`)."""
    return int(send(api, base, model, content, stream=stream, key=key)["x-brim-tokens-in"])


def token_ratios(base: str) -> list[dict[str, Any]]:
    reply = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}, timeout=10)
    reply.raise_for_status()
    ratios: list[dict[str, Any]] = reply.json()["token_ratios"]
    return ratios


def replies_learned(base: str, model: str) -> Callable[[], int]:
    def replies() -> int:
        return next((r["replies"] for r in token_ratios(base) if r["model"] == model), 0)

    return replies


@pytest.mark.parametrize("api", sorted(MODELS))
def test_five_replies_bring_brims_count_within_3_percent_of_the_providers(
    api: str, brim: BrimFactory, usage_provider: UsageProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, prior = MODELS[api]
    base = brim(**sections(usage_provider, monkeypatch))
    learned = replies_learned(base, model)
    first = ask(api, base, model, text(0), stream=False)
    # Before any reply, brim counts with its tokenizer's prior: well off the provider's count.
    assert abs(first / usage_provider.reported[0] - 1) > 0.2
    for n in range(1, 5):
        assert wait_for(lambda n=n: learned() == n)  # type: ignore[misc]
        ask(api, base, model, text(n), stream=n % 2 == 1)  # streamed and whole replies
    assert wait_for(lambda: learned() == 5)
    counted = ask(api, base, model, text(99, 2_500), stream=False)
    assert abs(counted / usage_provider.reported[-1] - 1) <= 0.03, (
        counted,
        usage_provider.reported[-1],
    )
    # Another client, which taught nothing: counted at the median of the one that settled.
    other = ask(api, base, model, text(98, 2_500), stream=True, key="another-client-key")
    assert abs(other / usage_provider.reported[-1] - 1) <= 0.03, (
        other,
        usage_provider.reported[-1],
    )
    assert wait_for(lambda: learned() == 7)
    (shown,) = token_ratios(base)
    assert shown["upstream"] == api.split(".")[0]
    assert abs(shown["ratio"] - 1.5) <= 0.03 and shown["ratio"] != prior
    assert (shown["clients"], shown["settled"], shown["replies"]) == (2, 1, 7)


@pytest.mark.parametrize("api", sorted(MODELS))
@pytest.mark.parametrize("absurd", [10**9, 1, 0])
def test_absurd_usage_teaches_nothing(
    api: str,
    absurd: int,
    brim: BrimFactory,
    usage_provider: UsageProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usage_provider.absurd = absurd
    model, _ = MODELS[api]
    base = brim(**sections(usage_provider, monkeypatch))
    counts = [ask(api, base, model, text(7), stream=n % 2 == 1) for n in range(3)]
    usage_provider.absurd = None  # one honest reply: learned (so the absurd ones were looked at)
    ask(api, base, model, text(8), stream=False)
    assert wait_for(lambda: replies_learned(base, model)() == 1)
    assert counts == [counts[0]] * 3  # the same request, counted the same: nothing learned


def test_the_ratio_stays_within_its_bounds_however_high_an_upstream_reports(
    brim: BrimFactory, usage_provider: UsageProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream reporting 2.95 × brim's count, reply after reply (each within the bounds
    and so evidence), takes the ratio to the bound and no further."""
    usage_provider.ratio = 2.95
    model, _ = MODELS["openai.chat"]
    base = brim(**sections(usage_provider, monkeypatch))
    learned = replies_learned(base, model)
    for n in range(12):
        ask("openai.chat", base, model, text(n), stream=False)
        assert wait_for(lambda n=n: learned() == n + 1)  # type: ignore[misc]
        (shown,) = token_ratios(base)
        assert shown["ratio"] is None if n + 1 < MIN_REPLIES else shown["ratio"] <= BOUNDS[1]
    assert shown["ratio"] > 2.8


def test_a_model_brim_counts_exactly_stays_at_one(
    brim: BrimFactory, usage_provider: UsageProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt-4o, whose provider counts exactly what brim counts: the ratio is learned against
    brim's own count, never against a count already scaled by it, so it does not drift."""
    usage_provider.ratio = 1.0
    base = brim(**sections(usage_provider, monkeypatch))
    learned = replies_learned(base, "gpt-4o")
    for n in range(10):
        counted = ask("openai.chat", base, "gpt-4o", text(n, 1_000 + 300 * n), stream=n % 2 == 0)
        assert counted == usage_provider.reported[-1]
        assert wait_for(lambda n=n: learned() == n + 1)  # type: ignore[misc]
    (shown,) = token_ratios(base)
    assert shown["ratio"] == 1.0


@pytest.mark.parametrize("api", ["anthropic.messages", "gemini.generate"])
def test_a_ratio_one_instance_learned_counts_on_another_through_redis(
    api: str,
    brim: BrimFactory,
    usage_provider: UsageProvider,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
) -> None:
    model, _ = MODELS[api]
    cache = {"cache": {"url": redis_server.url, "refresh_s": 0.05}}
    a = brim(**sections(usage_provider, monkeypatch), **cache)
    b = brim(**sections(usage_provider, monkeypatch), **cache)
    alone = brim(**sections(usage_provider, monkeypatch))  # no Redis: learns only from its replies
    for n in range(5):
        ask(api, a, model, text(n), stream=n % 2 == 0)
        assert wait_for(lambda n=n: replies_learned(a, model)() == n + 1)  # type: ignore[misc]
    assert wait_for(lambda: replies_learned(b, model)() == 5)  # adopted: B had no reply
    content = text(99, 2_500)
    on_b = ask(api, b, model, content, stream=False)
    assert abs(on_b / usage_provider.reported[-1] - 1) <= 0.03
    on_alone = ask(api, alone, model, content, stream=False)
    assert abs(on_alone / usage_provider.reported[-1] - 1) > 0.2
