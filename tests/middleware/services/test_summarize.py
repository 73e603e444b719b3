"""Summarization: levels, map-reduce, the provider chain, the cache (memory and a real Redis),
and end to end a fact from an evicted turn that survives in the summary."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx
import openai
import orjson
import pytest

from brim.adapters.credentials import Caller
from brim.adapters.forwarded_headers import CREDENTIAL_HEADERS
from brim.middleware.services import summarize as summarize_module
from brim.middleware.services.shared import RedisLink
from brim.middleware.services.summarize import Job, MemoryCache, RedisCache, Summarizer
from brim.policies.evict import GISTS_HEADER
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import tool_turn
from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider, Seen
from tests.middleware.stages.test_fallback import CLIENTS
from tests.test_wire_contract import FACT, session

use_bundled_tiktoken_files()
METER = CounterMeter(TokenCounter(), "o200k_base", "", CHAT)
OWNER, OTHER = "cred-" + "1" * 32, "cred-" + "2" * 32  # two clients' requests


def of(owner: str) -> Caller:
    """A Chat Completions client whose requests are `owner`'s."""
    return Caller(api=CHAT.name, owner=owner)


LONG = "\n".join(
    f"step {n}: the build ran the integration suite and wrote its report" for n in range(300)
)


class FakeModel:
    """Answers like a summarizer; `verbose` ignores the first level; `failing` names providers
    that always fail."""

    def __init__(self, verbose: bool = False, failing: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, int]] = []
        self.verbose = verbose
        self.failing = failing

    async def __call__(
        self,
        provider: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        caller: Caller,
    ) -> str:
        self.calls.append((provider, max_tokens))
        if provider in self.failing:
            raise RuntimeError(f"{provider} is down")
        if self.verbose and "Condense" in messages[0]["content"]:
            return messages[1]["content"]
        return " ".join(messages[1]["content"].split()[: max_tokens // 3])


def summarizer(
    model: FakeModel,
    providers: tuple[str, ...] = ("cheap",),
    cache: Any = None,
    window: int = 100_000,
    **options: Any,
) -> Summarizer:
    registry = LimitsRegistry({p: ModelFacts(context_window=window) for p in providers})
    return Summarizer(model, providers, METER, registry, cache, retry_delay_s=0, **options)


def test_the_level_steps_down_when_a_summary_is_still_too_long() -> None:
    model = FakeModel(verbose=True)
    size = METER.text_tokens(LONG)
    target = int(size * 0.6)  # condensed (~50 %) should fit, so that is where it starts
    summary = asyncio.run(summarizer(model).summarize(LONG, target, "task", of(OWNER)))
    assert summary is not None
    assert summary.level == "key_points" and summary.tokens_after <= target
    assert len(model.calls) == 2  # condensed came back too long; key_points did not


def test_past_the_last_level_the_summary_is_cut() -> None:
    class Stubborn(FakeModel):
        async def __call__(
            self,
            provider: str,
            messages: list[dict[str, str]],
            max_tokens: int,
            headers: Mapping[str, str],
        ) -> str:
            self.calls.append((provider, max_tokens))
            return messages[1]["content"]

    model = Stubborn()
    summary = asyncio.run(summarizer(model).summarize(LONG, 500, "task", of(OWNER)))
    assert summary is not None and summary.truncated and summary.tokens_after <= 500
    assert "cut from the middle by brim" in summary.text
    with pytest.raises(ValueError):
        asyncio.run(
            summarizer(Stubborn(), truncate_fallback=False)._with(
                Job("cheap", "t", "headline", of(OWNER)), LONG, 4000, 500
            )
        )


def test_inputs_larger_than_the_summarizers_window_are_map_reduced() -> None:
    model = FakeModel()
    summary = asyncio.run(summarizer(model, window=1_000).summarize(LONG, 1_200, "task", of(OWNER)))
    assert summary is not None
    assert len(model.calls) >= 5  # several chunks, then the summary of their summaries
    assert summary.tokens_after <= 1_200


def test_a_failing_provider_is_retried_then_the_next_one_serves() -> None:
    model = FakeModel(failing=("primary",))
    summary = asyncio.run(
        summarizer(model, ("primary", "backup"), max_retries=2).summarize(
            LONG, 2_000, "task", of(OWNER)
        )
    )
    assert summary is not None and summary.provider == "backup"
    assert [p for p, _ in model.calls] == ["primary", "primary", "primary", "backup"]


def test_when_every_provider_fails_there_is_no_summary() -> None:
    model = FakeModel(failing=("a", "b"))
    assert (
        asyncio.run(
            summarizer(model, ("a", "b"), max_retries=1).summarize(LONG, 2_000, "task", of(OWNER))
        )
        is None
    )


def test_a_text_already_within_its_target_is_its_own_summary() -> None:
    model = FakeModel()
    short = "step 1: the build ran the suite"
    summary = asyncio.run(summarizer(model).summarize(short, 500, "task", of(OWNER)))
    assert summary is not None and summary.text == short and summary.level == "verbatim"
    assert model.calls == []  # nothing to summarize: no model call, and not a failure


def test_a_cached_summary_longer_than_the_target_is_made_again() -> None:
    class Wordy(FakeModel):  # as many words as tokens asked for: always a little too long
        async def __call__(
            self,
            provider: str,
            messages: list[dict[str, str]],
            max_tokens: int,
            headers: Mapping[str, str],
        ) -> str:
            self.calls.append((provider, max_tokens))
            return " ".join(messages[1]["content"].split()[:max_tokens])

    model, cache = Wordy(), MemoryCache(ttl_hours=1)
    first = asyncio.run(summarizer(model, cache=cache).summarize(LONG, 2_200, "task", of(OWNER)))
    assert first is not None and first.level == "headline" and first.tokens_after > 1_200
    calls = len(model.calls)
    # The same level is asked for (the key), with less room: the cached text no longer fits.
    again = asyncio.run(summarizer(model, cache=cache).summarize(LONG, 1_200, "task", of(OWNER)))
    assert again is not None and not again.cache_hit and again.tokens_after <= 1_200
    assert len(model.calls) > calls


def test_the_cache_serves_the_same_bytes_and_misses_on_any_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = FakeModel()
    cache = MemoryCache(ttl_hours=1)
    first = asyncio.run(summarizer(model, cache=cache).summarize(LONG, 2_000, "task", of(OWNER)))
    again = asyncio.run(summarizer(model, cache=cache).summarize(LONG, 2_000, "task", of(OWNER)))
    assert first is not None and again is not None
    assert again.cache_hit and again.text == first.text and len(model.calls) == 1
    asyncio.run(summarizer(model, cache=cache).summarize(LONG, 2_000, "another task", of(OWNER)))
    assert len(model.calls) == 2
    asyncio.run(
        summarizer(model, ("other",), cache=cache).summarize(LONG, 2_000, "task", of(OWNER))
    )
    assert len(model.calls) == 3
    monkeypatch.setitem(summarize_module.PROMPTS, "v2", summarize_module.PROMPT_V1 + " ")
    asyncio.run(
        summarizer(model, cache=cache, prompt_version="v2").summarize(
            LONG, 2_000, "task", of(OWNER)
        )
    )
    assert len(model.calls) == 4
    # Another client's request, the same text: a summary of its own, never this owner's.
    other = asyncio.run(summarizer(model, cache=cache).summarize(LONG, 2_000, "task", of(OTHER)))
    assert other is not None and not other.cache_hit and len(model.calls) == 5


def test_two_brim_instances_share_summaries_through_redis(redis_url: str) -> None:
    async def run() -> tuple[Any, Any, int]:
        model = FakeModel()
        first_link, second_link = RedisLink(redis_url), RedisLink(redis_url)
        first_cache, second_cache = RedisCache(first_link, 1), RedisCache(second_link, 1)
        first = await summarizer(model, cache=first_cache).summarize(LONG, 2_000, "task", of(OWNER))
        second = await summarizer(model, cache=second_cache).summarize(
            LONG, 2_000, "task", of(OWNER)
        )
        await first_link.aclose()
        await second_link.aclose()
        return first, second, len(model.calls)

    first, second, calls = asyncio.run(run())
    assert calls == 1 and second.cache_hit and second.text == first.text


def test_a_summary_in_redis_is_its_owners_and_a_malformed_one_is_never_used(
    redis_url: str,
) -> None:
    import redis.asyncio as redis

    rejected: list[str] = []

    async def run() -> tuple[Any, Any, int, list[bytes]]:
        model = FakeModel()
        first_link, second_link = RedisLink(redis_url), RedisLink(redis_url)
        first = RedisCache(first_link, 1)
        second = RedisCache(second_link, 1, on_rejected=rejected.append)
        await summarizer(model, cache=first).summarize(LONG, 2_000, "task", of(OWNER))
        await first_link.settle()  # written off the request path
        others = await summarizer(model, cache=second).summarize(LONG, 2_000, "task", of(OTHER))
        await second_link.settle()
        client: Any = redis.from_url(redis_url)
        names = sorted(await client.keys("brim:summary:*"))
        for name in names:
            await client.set(name, b"\xff\xfe not a summary")
        fresh = RedisCache(second_link, 1, on_rejected=rejected.append)  # nothing of its own
        again = await summarizer(model, cache=fresh).summarize(LONG, 2_000, "task", of(OWNER))
        await client.aclose()
        await first_link.aclose()
        await second_link.aclose()
        return others, again, len(model.calls), names

    others, again, calls, names = asyncio.run(run())
    assert not others.cache_hit  # another owner's request: a summary of its own
    assert [name.split(b"|")[0] for name in names] == [
        f"brim:summary:{OWNER}".encode(),
        f"brim:summary:{OTHER}".encode(),
    ]
    assert not again.cache_hit and calls == 3  # the malformed record was not used ...
    assert rejected == ["malformed"]  # ... and was counted


def test_a_fact_from_an_evicted_turn_survives_in_the_summary(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        models={"strict-8k": {"context_window": 8_192, "max_output": 1_024}},
        guard={"policies": ["evict", "truncate"]},  # evict straight away: this is about summaries
        summarize={
            "enabled": True,
            "provider": "summarizer-down",
            "providers": ["summarizer-good"],
            "max_retries": 0,
            "retry_delay_s": 0,
        },
    )
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Deploy the service."},
    ]
    messages += tool_turn(
        "c0",
        "FACT: the staging database password rotates every Tuesday at 06:00 UTC\n"
        + "config line\n" * 300,
    )
    actions: list[str] = []
    for turn in range(1, 9):
        messages += tool_turn(
            f"c{turn}", "\n".join(f"log {turn}.{i}: deploy step output text" for i in range(150))
        )
        messages.append({"role": "user", "content": f"continue ({turn})"})
        raw = sdk.chat.completions.with_raw_response.create(
            model="strict-8k", messages=messages, max_tokens=256
        )  # type: ignore[arg-type]
        actions.append(raw.headers["x-brim-actions"])
    assert provider.strict_rejections == []
    assert any("summarize" in a for a in actions), actions
    sent = orjson.loads(provider.requests[-1].body)["messages"]
    summaries = [  # each summary's own text (the last one ends with the notice's quoted lines)
        m["content"].partition("\n" + GISTS_HEADER)[0]
        for m in sent
        if m["role"] == "system" and m["content"].startswith("[brim: a summary")
    ]
    # One summary per evicted batch; the fact was in the first tool result, so in the first.
    fact = "password rotates every Tuesday"
    assert len(summaries) >= 2 and [fact in s for s in summaries] == [True] + [False] * (
        len(summaries) - 1
    )
    assert "summarizer-down" in provider.summarizer_calls  # the failing primary was tried first
    calls_before = len([c for c in provider.summarizer_calls if c == "summarizer-good"])
    httpx.post(  # the same client (its key: summaries are each client's own)
        f"{base}/v1/chat/completions",
        json={"model": "strict-8k", "messages": messages, "max_tokens": 256},
        headers={"Authorization": "Bearer k"},
    )
    assert orjson.loads(provider.requests[-1].body)["messages"] == sent  # same bytes again…
    assert (
        len([c for c in provider.summarizer_calls if c == "summarizer-good"]) == calls_before
    )  # …from the cache


def test_a_summarizer_failure_never_fails_the_request(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        models={"strict-8k": {"context_window": 8_192}},
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": "summarizer-down", "max_retries": 0},
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in range(12):
        messages += tool_turn(f"c{turn}", "output line\n" * 400)
    messages.append({"role": "user", "content": "so?"})
    reply = httpx.post(
        f"{base}/v1/chat/completions", json={"model": "strict-8k", "messages": messages}
    )
    assert reply.status_code == 200 and "evict" in reply.headers["x-brim-actions"]
    sent = orjson.loads(provider.requests[-1].body)["messages"]
    assert any(str(m.get("content", "")).startswith("[brim removed") for m in sent)


def test_a_tool_result_too_large_to_keep_is_summarized_instead_of_cut(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(
        models={"strict-8k": {"context_window": 8_192, "max_output": 1_024}},
        guard={"policies": ["truncate"]},
        summarize={"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    )
    log = "\n".join(f"worker {i}: processed batch without errors" for i in range(2_000))
    messages = [
        {"role": "user", "content": "Why did the job fail?"},
        *tool_turn("c0", log + "\nFACT: batch 1999 failed on a disk quota\n", name="bash"),
    ]
    reply = httpx.post(
        f"{base}/v1/chat/completions", json={"model": "strict-8k", "messages": messages}
    )
    assert reply.status_code == 200
    assert "summarize:1" in reply.headers["x-brim-actions"]
    sent = orjson.loads(provider.requests[-1].body)["messages"]
    result = sent[-1]["content"]
    assert result.startswith("[brim: a summary of this tool result") and "disk quota" in result
    assert provider.strict_rejections == []


def client(authorization: str) -> Caller:
    """A Chat Completions client of upstream "u" with its own key."""
    return Caller(api="openai.chat", upstream="u", headers={"Authorization": authorization})


class SlowCache(MemoryCache):
    """A cache that makes every look-up wait, as a network round trip to Redis does."""

    async def get(self, key: str) -> str | None:
        await asyncio.sleep(0.01)
        return await super().get(key)


def test_concurrent_summaries_each_carry_their_own_requests_key() -> None:
    """A shared summarizer, many requests at once, each with its own key: every call to the
    summary model carries the key of the request whose text it summarizes (never another's),
    through cache waits, retries and map-reduce chunks alike."""
    seen: list[tuple[str, str]] = []  # (owner named in the text, key the call carried)
    attempts: dict[str, int] = {}

    async def call(
        provider: str, messages: list[dict[str, str]], max_tokens: int, caller: Caller
    ) -> str:
        text = messages[1]["content"]
        owner = text.split(":", 1)[0].removeprefix("owner ")
        attempts[text] = attempts.get(text, 0) + 1
        await asyncio.sleep(0.005 * (hash(owner) % 5))
        seen.append((owner, caller.headers["Authorization"]))
        if attempts[text] == 1:
            raise RuntimeError("flaky summarizer: the retry must carry the same key")
        return f"owner {owner}: summary"

    registry = LimitsRegistry({"cheap": ModelFacts(context_window=2_000, max_output=500)})
    shared = Summarizer(
        call, ["cheap"], METER, registry, SlowCache(1), max_retries=1, retry_delay_s=0
    )
    texts = {
        f"r{n}": "\n".join(f"owner r{n}: log line {i} of the deploy" for i in range(300))
        for n in range(12)
    }  # ~3 000 tokens each: more than the summarizer's 2 000-token window, so chunked

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(
                shared.summarize(text, 200, "task", client(f"Bearer key-{owner}"))
                for owner, text in texts.items()
            )
        )

    summaries = asyncio.run(run())
    assert all(summary is not None for summary in summaries)
    assert len({owner for owner, _ in seen}) == len(texts)
    assert all(key == f"Bearer key-{owner}" for owner, key in seen), [
        (o, k) for o, k in seen if k != f"Bearer key-{o}"
    ][:5]


def test_a_growing_session_reuses_its_earlier_summaries_byte_for_byte(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    """Summaries are made per batch of evicted turns, sized by the batches alone and cached by
    content: on every turn that evicts nothing new, the summaries go out byte for byte as on
    the turn before (the provider's prompt cache holds), and no text is summarized twice at
    the same level."""
    base = brim(
        models={"strict-8k": {"context_window": 8_192, "max_output": 1_024}},
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the flaky test."},
    ]
    turns: list[tuple[str, list[str], int]] = []
    for turn in range(32):
        messages += tool_turn(
            f"c{turn}", "\n".join(f"run {turn}.{i}: test_{i} passed in 3 ms" for i in range(30))
        )
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "strict-8k", "messages": messages, "max_tokens": 256},
        )
        assert reply.status_code == 200, reply.text
        sent = orjson.loads(provider.requests[-1].body)["messages"]
        summaries = [
            m["content"] for m in sent if str(m.get("content", "")).startswith("[brim: a summary")
        ]
        calls = provider.summarizer_calls.count("summarizer-good")
        turns.append((reply.headers["x-brim-actions"], summaries, calls))
    summarized = [turn for turn in turns if turn[1]]
    pairs = list(itertools.pairwise(summarized))
    quiet = [(b, a) for b, a in pairs if a[0] == b[0]]  # no more evicted than the turn before
    assert len(summarized) >= 12 and len(quiet) >= 5, [t[0] for t in turns]
    assert all(after[1] == before[1] for before, after in quiet)  # the same bytes…
    assert all(after[2] == before[2] for before, after in quiet)  # …and no summarizer call
    # Every summarizer call is for a distinct (text, level): nothing made twice. A turn that
    # evicts more pays for its new batch, plus the older ones it steps down or merges.
    asked = provider.summarized  # (system prompt, text): the prompt names the level
    assert len(asked) == summarized[-1][2] >= 6
    assert len(set(asked)) == len(asked), [a for a, n in Counter(asked).items() if n > 1][:2]
    texts = [text for _, text in asked]
    assert max(Counter(texts).values()) <= 2  # a batch: its key points, then its headline
    grew = [(b, a) for b, a in pairs if a[0] != b[0]]
    assert len(grew) >= 3 and all(len(a[1]) > 1 for _, a in grew)


SUMMARY_PATHS = {
    "anthropic.messages": "/v1/messages",
    "openai.responses": "/v1/responses",
    "gemini.generate": "/v1beta/models/summarizer-good:generateContent",
}


def credentials(seen: Seen) -> dict[str, str]:
    return {k: v for k, v in seen.headers.items() if k in CREDENTIAL_HEADERS}


@pytest.mark.parametrize("api", sorted(SUMMARY_PATHS))
def test_the_summarizer_asks_on_the_clients_own_wire_api(
    brim: BrimFactory, provider: FakeProvider, api: str
) -> None:
    """A client with only its own key for one provider (Claude Code with an Anthropic key, say)
    summarizes with a model of that provider: the summary is asked in the client's wire API, of
    the upstream its request went to, with its own key; the fact survives in the summary."""
    client = CLIENTS[api]
    base = brim(
        **{
            **every_api(provider),
            "routes": {
                "summarizer-*": ["openai", "anthropic", "gemini"],
                "claude-*": "anthropic",
                "gem*": "gemini",
                "*": "openai",
            },
        },
        models={client.small: {"context_window": 6_000, "max_output": 1_000}},
        guard={"policies": ["evict", "truncate"], "prefer_fallback": False},
        summarize={"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    )
    headers = client.send(base, client.small, session(client.case, 10, fact=True))
    assert "summarize:" in headers["x-brim-actions"]
    *asked, forwarded = provider.requests
    assert asked and len(asked) == len(provider.summarizer_calls)
    assert all(seen.path == SUMMARY_PATHS[api] for seen in asked)
    assert credentials(forwarded)  # the client's own key…
    assert all(credentials(seen) == credentials(forwarded) for seen in asked)  # …on each call
    sent = client.case.wire.conversation(orjson.loads(provider.requests[-1].body))
    texts = [client.case.wire.dialect.text(item) for item in sent]
    assert any(text.startswith("[brim: a summary") and FACT in text for text in texts)


def test_the_summarizer_on_another_wire_api_uses_that_upstreams_own_key(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Chat Completions client; the summarizer is a model on an Anthropic upstream with a key
    of its own: the summary is asked on Messages, with that key, never the client's."""
    monkeypatch.setenv("SUMMARY_UPSTREAM_KEY", "sk-ant-summaries")
    client = CLIENTS["openai.chat"]
    base = brim(
        upstreams={
            "openai": {"api": "openai", "base_url": f"{provider.url}/v1"},
            "summaries": {
                "api": "anthropic",
                "base_url": provider.url,
                "api_key_env": "SUMMARY_UPSTREAM_KEY",
            },
        },
        routes={"summarizer-*": "summaries", "*": "openai"},
        models={client.small: {"context_window": 6_000, "max_output": 1_000}},
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    )
    headers = client.send(base, client.small, session(client.case, 10, fact=True))
    assert "summarize:" in headers["x-brim-actions"]
    asked = [seen for seen in provider.requests if seen.path == "/v1/messages"]
    assert asked and len(asked) == len(provider.summarizer_calls)
    for seen in asked:
        assert seen.headers["x-api-key"] == "sk-ant-summaries"
        assert "sk-client" not in " ".join(seen.headers.values())
    sent = orjson.loads(provider.requests[-1].body)["messages"]
    assert any(FACT in str(message["content"]) for message in sent)
