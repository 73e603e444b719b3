"""One client never sets the token ratio the others are counted at.

brim scales its counts of a model by the ratio of the provider's reported input tokens to its
own count, learned from the usage in replies. A client whose text tokenizes very differently on
the provider (long runs of CJK, base64, emoji) — or whose upstream reports inflated usage for it
— teaches a ratio far from everyone else's. Were that ratio shared as it is learned, it would
make every other client's requests count up to 3 × too large (over-compressed) or too small
(overflowing). So a client is counted at its own ratio once it settled one, else at the median
of the clients that did: a hostile client moves only its own counts, and what the others are
counted at only if it is most of the model's clients.

The clients are the official SDKs (plain HTTP for Gemini) against a running brim in front of
`UsageProvider`, which reports 3 × brim's count for the hostile client's credential and the
model's honest 1.2 × for everyone else.
"""

from __future__ import annotations

import random

import httpx
import pytest

from brim.policies.ratios import MIN_REPLIES
from brim.policies.wires import WIRES
from tests.conftest import BrimFactory
from tests.fakes import wait_for
from tests.usage_provider import UsageProvider, send

ADMIN = "ratio-poisoning-admin-key-0123"
ADMIN_ENV = "RATIO_POISONING_ADMIN_KEYS"
HONEST = 1.2  # the model's tokenizer: 1.2 tokens per o200k token, for every honest client
HOSTILE = "hostile-client-key"  # the provider reports 3 × brim's count for this credential
MODELS = {  # a model each API serves: a 20 K window, so 3 × an honest request overflows it
    "openai.chat": "poison-chat",
    "openai.responses": "poison-responses",
    "anthropic.messages": "claude-poison",
    "gemini.generate": "gemini-poison",
}


@pytest.fixture
def reporting(usage_provider: UsageProvider) -> UsageProvider:
    usage_provider.reset(HONEST)
    usage_provider.by_key[HOSTILE] = 3.0
    return usage_provider


@pytest.fixture
def base(brim: BrimFactory, reporting: UsageProvider, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    return brim(
        upstreams={
            "openai": {"api": "openai", "base_url": f"{reporting.url}/v1"},
            "anthropic": {"api": "anthropic", "base_url": reporting.url, "native_count": False},
            "gemini": {"api": "gemini", "base_url": reporting.url, "native_count": False},
        },
        routes={"claude-*": "anthropic", "gemini-*": "gemini", "*": "openai"},
        models={
            model: {"context_window": 20_000, "max_output": 1_000} for model in MODELS.values()
        },
        server={"admin_keys_env": ADMIN_ENV},
    )


def text(seed: int, words: int) -> str:
    """About `words` × 1.7 tokens of log-like text, different for each seed."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(['build', 'alpha', 'reads', 'config'])}{rng.randint(0, 99)}"
        for _ in range(words)
    )


def ask(api: str, base: str, content: str, key: str, stream: bool = False) -> httpx.Headers:
    return send(api, base, MODELS[api], content, stream=stream, key=key)


def status(base: str) -> httpx.Response:
    reply = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}, timeout=10)
    reply.raise_for_status()
    return reply


def replies(base: str) -> int:
    return sum(row["replies"] for row in status(base).json()["token_ratios"])


def teach(api: str, base: str, key: str, times: int, words: int, seed: int) -> None:
    """`times` requests of about `words` × 1.7 tokens from the client with `key`, each waited
    for until brim learned from its reply."""
    for n in range(times):
        before = replies(base)
        ask(api, base, text(seed + n, words), key, stream=n % 2 == 1)
        assert wait_for(lambda before=before: replies(base) == before + 1)  # type: ignore[misc]


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_hostile_client_does_not_change_how_another_is_counted(
    api: str, base: str, reporting: UsageProvider
) -> None:
    """B settles its ratio (the honest 1.2); A's replies then say 3 × brim's count, again and
    again. B's request is counted the same as before, within 3 % of what the provider counts,
    and goes out whole: A's ratio never reaches B's budget."""
    teach(api, base, "client-b-key", MIN_REPLIES, 4_700, seed=0)
    probe = text(999, 4_700)  # about 8 K tokens: fits the 20 K window at 1.2, not at 3
    before = ask(api, base, probe, "client-b-key")
    assert abs(int(before["x-brim-tokens-in"]) / reporting.reported[-1] - 1) <= 0.03
    teach(api, base, HOSTILE, 6, 2_500, seed=100)  # about 4.2 K tokens: fits even at 3 ×
    after = ask(api, base, probe, "client-b-key")
    assert abs(int(after["x-brim-tokens-in"]) / reporting.reported[-1] - 1) <= 0.03
    # the same count, but for what B's own replies still teach (its ratio settles on 1.2)
    assert abs(int(after["x-brim-tokens-in"]) / int(before["x-brim-tokens-in"]) - 1) <= 0.01
    assert after["x-brim-budget"] == before["x-brim-budget"]
    assert after["x-brim-tokens-out"] == after["x-brim-tokens-in"]  # not compressed
    assert after["x-brim-actions"] == "none"
    # A is counted at its own ratio (near 3, not the honest 1.2): its requests, its business.
    hostile = ask(api, base, text(200, 2_500), HOSTILE)
    assert int(hostile["x-brim-tokens-in"]) >= 0.85 * reporting.reported[-1]


def test_of_three_clients_one_hostile_the_others_are_counted_at_the_honest_twos(
    base: str, reporting: UsageProvider
) -> None:
    """Two honest clients and one reporting 3 × settle their ratios; a fourth client, which
    taught nothing, is counted at the median — the honest ratio — and the status shows the
    shared value and how many clients taught it, never who they are."""
    api = "openai.chat"
    teach(api, base, "honest-one-key", MIN_REPLIES, 4_700, seed=0)
    teach(api, base, HOSTILE, 8, 2_500, seed=100)
    teach(api, base, "honest-two-key", MIN_REPLIES, 4_700, seed=200)
    teach(api, base, HOSTILE, 4, 2_500, seed=300)  # the last word is the hostile one's
    taught = replies(base)
    newcomer = ask(api, base, text(999, 4_700), "newcomer-key")
    assert abs(int(newcomer["x-brim-tokens-in"]) / reporting.reported[-1] - 1) <= 0.03
    assert newcomer["x-brim-actions"] == "none"
    assert wait_for(lambda: replies(base) == taught + 1)  # the newcomer's first reply
    reply = status(base)
    (row,) = reply.json()["token_ratios"]
    assert (row["upstream"], row["model"]) == ("openai", MODELS[api])
    assert (row["clients"], row["settled"], row["replies"]) == (4, 3, taught + 1)
    assert abs(row["ratio"] / HONEST - 1) <= 0.03
    assert row.keys() == {
        "upstream",
        "model",
        "ratio",
        "clients",
        "settled",
        "replies",
        "updated_s_ago",
    }
    assert "cred-" not in reply.text  # no owner id
