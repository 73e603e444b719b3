"""Ask the provider when brim is unsure: where brim can only estimate (Claude, Gemini) and its
estimate lies within its error band around the budget, the upstream's own counter decides
whether the request fits — once per body, within a short deadline, the estimate standing on any
failure. Outside the band, and for OpenAI's APIs, nothing is asked."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import httpx
import orjson
import pytest

from brim.adapters.exchange import RequestTokens
from brim.adapters.registry import Upstreams
from brim.adapters.upstream_config import UpstreamConfig
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.policies.budget import ESTIMATE_BANDS, estimate_band, undecided
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import TokenCounter
from tests import builders
from tests.conftest import BrimFactory, fake_upstream
from tests.fake_anthropic import SLOW_COUNT_S, FakeAnthropic, provider_count, token_count
from tests.fakes import FakeProvider, counted, wait_for

# Budget of a 6000-token window with the default 5 % margin (Claude's output has its own room).
WINDOW = 6_000
BUDGET = WINDOW - 300
CLIENT = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}


def messages_body(model: str, words: int) -> dict[str, Any]:
    text = "lorem ipsum " * words
    return {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": text}]}


def sized(model: str, estimate: int) -> dict[str, Any]:
    """A Messages body whose brim estimate is about `estimate` (within a few tokens)."""
    words = estimate * 10 // 23
    while token_count(messages_body(model, words)) < estimate:
        words += 1
    return messages_body(model, words)


def claude_brim(brim: BrimFactory, fake: FakeAnthropic, model: str, **upstream: Any) -> str:
    return brim(
        upstreams={"claude": {"api": "anthropic", "base_url": fake.url, **upstream}},
        models={model: {"context_window": WINDOW, "max_output": 1_000}},
    )


def post(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/v1/messages", json=body, headers=CLIENT, timeout=30)


def count_requests(fake: FakeAnthropic) -> list[dict[str, Any]]:
    return [orjson.loads(s.body) for s in fake.requests if s.path.endswith("/count_tokens")]


# --- the band: a pure function ---------------------------------------------------------------


def test_only_estimates_have_a_band() -> None:
    assert estimate_band("claude", "anthropic") == ESTIMATE_BANDS["claude"] == 0.15
    assert estimate_band("claude", "litellm") == 0.15  # Claude on Bedrock: still an estimate
    assert estimate_band("o200k_base", "gemini") == ESTIMATE_BANDS["gemini"] == 0.15
    assert estimate_band("o200k_base", "openai") is None  # exact: OpenAI's own tokenizer
    assert estimate_band("cl100k_base", "anthropic") is None


def test_undecided_means_within_the_band_around_the_budget() -> None:
    assert undecided(1_000, 1_000, 0.15)
    assert undecided(850, 1_000, 0.15) and undecided(1_150, 1_000, 0.15)
    assert not undecided(849, 1_000, 0.15) and not undecided(1_151, 1_000, 0.15)
    assert not undecided(1_000, 1_000, None)
    assert not undecided(0, 0, 0.15)


def test_the_provider_ratio_is_the_provider_count_over_the_estimate() -> None:
    assert RequestTokens(upper_bound=9_000, exact=5_500).provider_ratio is None
    tokens = RequestTokens(upper_bound=9_000, exact=6_050, estimate=5_500)
    assert tokens.provider_ratio == pytest.approx(1.1)


def test_native_count_is_on_by_default_only_where_there_is_a_counter() -> None:
    assert UpstreamConfig(api="anthropic", base_url="http://a").counts_natively
    assert UpstreamConfig(api="gemini", base_url="http://g").counts_natively
    assert not UpstreamConfig(api="openai", base_url="http://o").counts_natively
    assert not UpstreamConfig(api="litellm").counts_natively
    assert not UpstreamConfig(
        api="anthropic", base_url="http://a", native_count=False
    ).counts_natively
    assert UpstreamConfig(api="gemini", base_url="http://g", native_count="true").counts_natively
    for api in ("openai", "litellm"):
        with pytest.raises(ValueError, match="native_count = true needs an upstream"):
            UpstreamConfig(api=api, base_url="http://o", native_count=True)
    with pytest.raises(ValueError, match="native_count"):
        UpstreamConfig(api="anthropic", base_url="http://a", native_count="sometimes")
    with pytest.raises(ValueError, match="native_count_timeout_s"):
        UpstreamConfig(api="anthropic", base_url="http://a", native_count_timeout_s=0)


# --- Anthropic Messages, end to end ----------------------------------------------------------


def test_a_request_just_over_the_estimate_that_the_provider_says_fits_goes_unchanged(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    model = "claude-scaled90-6000"  # the fake counts 90 % of brim's estimate
    base = claude_brim(brim, anthropic_fake, model)
    body = sized(model, BUDGET + 400)  # over the budget by brim's estimate, inside its band
    estimate, real = token_count(body), provider_count(body)
    assert BUDGET < estimate <= BUDGET * 1.15 and real <= BUDGET

    reply = post(base, body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] == "none"
    assert reply.headers["x-brim-tokens-in"] == str(real)  # the provider's figure decided
    assert anthropic_fake.count_calls == 1
    assert orjson.loads(anthropic_fake.last.body) == body  # forwarded as the client sent it
    (asked,) = count_requests(anthropic_fake)
    assert asked == {"model": model, "messages": body["messages"]}  # no max_tokens, no stream
    count_call = next(s for s in anthropic_fake.requests if s.path.endswith("/count_tokens"))
    assert count_call.path == "/v1/messages/count_tokens"
    assert count_call.headers["x-api-key"] == "sk-ant-client"  # the client's own credentials
    assert count_call.headers["anthropic-version"] == "2023-06-01"

    again = post(base, body)  # the same body: counted once, from the cache now
    assert again.status_code == 200 and again.headers["x-brim-actions"] == "none"
    assert anthropic_fake.count_calls == 1


def test_requests_clearly_over_or_under_the_budget_ask_nothing(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    model = "claude-scaled90-6000"
    base = claude_brim(brim, anthropic_fake, model)
    small = post(base, sized(model, 1_000))
    assert small.status_code == 200 and small.headers["x-brim-actions"] == "none"
    over = sized(model, int(BUDGET * 1.3))
    large = post(base, over)
    assert large.headers["x-brim-actions"] != "none"  # the estimate alone decided: cut
    assert anthropic_fake.count_calls == 0 and count_requests(anthropic_fake) == []


def test_a_missing_count_endpoint_leaves_the_estimate_standing_and_is_logged_once(
    brim: BrimFactory, anthropic_fake: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    model = "claude-nocount-6000"  # answers 404 on count_tokens
    base = claude_brim(brim, anthropic_fake, model)
    with caplog.at_level(logging.WARNING, logger="brim.limits"):
        first = post(base, sized(model, BUDGET + 400))
        second = post(base, sized(model, BUDGET + 500))
    for reply in (first, second):  # brim's estimate says over the budget: the guard cut
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-brim-actions"] != "none"
    assert len(count_requests(anthropic_fake)) == 1  # a missing endpoint is not asked again
    warnings = [r.getMessage() for r in caplog.records if "token counter" in r.getMessage()]
    assert len(warnings) == 1 and "HTTP 404" in warnings[0] and "'claude'" in warnings[0]
    assert "lorem" not in warnings[0]


def test_a_hanging_count_endpoint_gives_way_to_the_estimate_within_the_deadline(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    model = "claude-slowcount-6000"  # answers count_tokens after SLOW_COUNT_S
    base = claude_brim(brim, anthropic_fake, model, native_count_timeout_s=0.3)
    started = time.monotonic()
    reply = post(base, sized(model, BUDGET + 400))
    assert time.monotonic() - started < SLOW_COUNT_S - 1
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] != "none"  # the estimate decided
    assert len(count_requests(anthropic_fake)) == 1


def test_native_count_false_never_asks(brim: BrimFactory, anthropic_fake: FakeAnthropic) -> None:
    model = "claude-scaled90-6000"
    base = claude_brim(brim, anthropic_fake, model, native_count=False)
    reply = post(base, sized(model, BUDGET + 400))
    assert reply.status_code == 200
    assert reply.headers["x-brim-actions"] != "none"  # brim's estimate decided, and cut
    assert count_requests(anthropic_fake) == []


async def test_the_provider_can_also_say_a_request_does_not_fit(
    anthropic_fake: FakeAnthropic,
) -> None:
    """Just under the budget by the estimate, over it by the provider's count (110 %): the
    request does not fit, and the guard has both figures (and their ratio) to go by."""
    model = "claude-scaled110-6000"
    upstreams = Upstreams(
        {"claude": UpstreamConfig(api="anthropic", base_url=anthropic_fake.url)}, {}
    )
    registry = LimitsRegistry({model: ModelFacts(context_window=WINDOW, max_output=1_000)})
    stage = ResolveLimits(
        registry, TokenCounter(), safety_margin=0.05, clients={}, upstreams=upstreams
    )
    body = sized(model, BUDGET - 200)
    exchange = builders.exchange(
        "anthropic.messages",
        model,
        body,
        headers=CLIENT,
        endpoint="/v1/messages",
        query="beta=true",
        upstream="claude",
    )
    try:
        context = await stage.context_for(exchange)
    finally:
        await upstreams.aclose()
    assert context.tokens.estimate == token_count(body) < BUDGET
    assert context.tokens.exact == provider_count(body) > BUDGET
    assert not context.fits
    assert context.tokens.provider_ratio == pytest.approx(1.1, abs=0.01)
    assert anthropic_fake.requests[-1].query == "beta=true"
    assert stage.native is not None and stage.native.calls == 1


async def test_a_counter_on_an_upstream_the_client_did_not_address_is_not_asked(
    anthropic_fake: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    """A request on its way to another upstream than the one its client addressed (a
    fallback's), which has no key of its own: its counter is not asked — the client's key may
    not go there — and brim's estimate stands; logged, and recorded for the request's span."""
    model = "claude-scaled110-6000"
    upstreams = Upstreams(
        {
            "home": UpstreamConfig(api="anthropic", base_url=anthropic_fake.url),
            "other": UpstreamConfig(api="anthropic", base_url=anthropic_fake.url),
        },
        {},
    )
    registry = LimitsRegistry({model: ModelFacts(context_window=WINDOW, max_output=1_000)})
    stage = ResolveLimits(
        registry, TokenCounter(), safety_margin=0.05, clients={}, upstreams=upstreams
    )
    body = sized(model, BUDGET - 200)  # undecided: the counter would be asked
    exchange = builders.exchange(
        "anthropic.messages", model, body, headers=CLIENT, endpoint="/v1/messages", upstream="home"
    )
    elsewhere = dataclasses.replace(exchange, upstream="other")  # addressed stays "home"
    try:
        with caplog.at_level(logging.WARNING, logger="brim.credentials"):
            context = await stage.context_for(elsewhere)
    finally:
        await upstreams.aclose()
    assert count_requests(anthropic_fake) == []
    assert context.tokens.exact == token_count(body) and context.tokens.estimate is None
    assert [(w.step, w.upstream) for w in elsewhere.report.withheld] == [("native_count", "other")]
    assert any("native_count" in r.getMessage() for r in caplog.records)


# --- Gemini generateContent, end to end ------------------------------------------------------

GEM_WINDOW = 5_000
GEM_BUDGET = GEM_WINDOW - 250


def gemini_body(words: int) -> dict[str, Any]:
    return {
        "contents": [{"role": "user", "parts": [{"text": "lorem ipsum " * words}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 256},
    }


def gemini_sized(estimate: int) -> dict[str, Any]:
    words = estimate // 2
    while counted("gemini.generate", gemini_body(words)) < estimate:
        words += 1
    return gemini_body(words)


def gemini_brim(brim: BrimFactory, provider: FakeProvider, model: str, **upstream: Any) -> str:
    return brim(
        upstreams={"gemini": {"api": "gemini", "base_url": provider.url, **upstream}},
        models={model: {"context_window": GEM_WINDOW}},
    )


def generate(base: str, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base}/v1beta/models/{model}:generateContent?key=AIza-client", json=body, timeout=30
    )


def gemini_counts(provider: FakeProvider) -> list[Any]:
    return provider.count_requests


def test_gemini_asks_count_tokens_when_unsure_and_caches_the_answer(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    model = "gemscaled90-5000"  # the fake counts 90 % of brim's o200k count
    base = gemini_brim(brim, provider, model)
    body = gemini_sized(GEM_BUDGET + 250)
    reply = generate(base, model, body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] == "none"
    (asked,) = gemini_counts(provider)
    assert asked.path == f"/v1beta/models/{model}:countTokens"
    assert asked.query == "key=AIza-client"  # the client's key, as forwarded
    request = orjson.loads(asked.body)["generateContentRequest"]
    assert request == {
        "model": f"models/{model}",
        "contents": body["contents"],
        "systemInstruction": body["systemInstruction"],
    }
    assert int(reply.headers["x-brim-tokens-in"]) <= GEM_BUDGET  # the provider's figure
    assert orjson.loads(provider.last.body) == body  # forwarded as the client sent it

    assert generate(base, model, body).headers["x-brim-actions"] == "none"
    assert len(gemini_counts(provider)) == 1  # cached

    assert generate(base, model, gemini_sized(1_000)).status_code == 200
    over = generate(base, model, gemini_sized(int(GEM_BUDGET * 1.3)))
    assert over.status_code == 200 and over.headers["x-brim-actions"] != "none"  # cut, by brim
    assert len(gemini_counts(provider)) == 1  # clearly under, clearly over: not asked


@pytest.mark.parametrize("model", ["gemnocount-5000", "gemslowcount-5000"])
def test_a_failing_gemini_counter_leaves_the_estimate_standing(
    brim: BrimFactory, provider: FakeProvider, model: str
) -> None:
    base = gemini_brim(brim, provider, model, native_count_timeout_s=0.3)
    started = time.monotonic()
    reply = generate(base, model, gemini_sized(GEM_BUDGET + 250))
    assert time.monotonic() - started < 2
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] != "none"  # the estimate said: over, cut
    assert len(gemini_counts(provider)) == 1
    assert wait_for(lambda: provider.in_flight == 0)  # the slow counter's answer, given up on


def test_gemini_native_count_false_never_asks(brim: BrimFactory, provider: FakeProvider) -> None:
    base = gemini_brim(brim, provider, "gemscaled90-5000", native_count=False)
    reply = generate(base, "gemscaled90-5000", gemini_sized(GEM_BUDGET + 250))
    assert reply.headers["x-brim-actions"] != "none"
    assert gemini_counts(provider) == []


@pytest.mark.parametrize(
    ("path", "conversation"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "lorem ipsum " * 850}]}),
        ("/v1/responses", {"input": "lorem ipsum " * 850}),
    ],
    ids=["chat", "responses"],
)
def test_openai_apis_are_never_counted_upstream(
    brim: BrimFactory, provider: FakeProvider, path: str, conversation: dict[str, Any]
) -> None:
    """OpenAI's counts are brim's own: a request near the budget costs one upstream call."""
    base = brim(
        upstreams={"fake": fake_upstream(provider)},
        models={"fake-model": {"context_window": 2_000, "max_output": 100}},
    )
    # About 1 700 tokens against a 1 900-token budget: inside any band.
    reply = httpx.post(f"{base}{path}", json={"model": "fake-model", **conversation}, timeout=30)
    assert reply.status_code == 200
    assert undecided(int(reply.headers["x-brim-tokens-in"]), 1_900, 0.15)
    assert [s.path for s in provider.requests] == [path]


def test_when_the_provider_counts_more_than_brim_the_guard_cuts_to_its_count(
    brim: BrimFactory, anthropic_fake: FakeAnthropic
) -> None:
    """brim's estimate says it fits, the provider's count says it does not: the guard cuts,
    measuring with brim's counter against the budget scaled by the provider's ratio, so what
    goes out fits by the provider's own count — and no overflow round trip is needed."""
    model = "claude-scaled110-6000"  # the fake counts 110 % of brim's estimate
    base = claude_brim(brim, anthropic_fake, model)
    turns: list[dict[str, Any]] = []
    for n in range(12):
        turns += [
            {"role": "user", "content": f"step {n}: " + "lorem ipsum " * 90},
            {"role": "assistant", "content": f"done with step {n}: " + "dolor sit " * 90},
        ]
    turns.append({"role": "user", "content": "and now the last step"})
    body = {"model": model, "max_tokens": 256, "messages": turns}
    while token_count(body) > BUDGET - 200:  # under the budget by brim's own estimate…
        body["messages"] = body["messages"][2:]
    assert provider_count(body) > BUDGET  # …over it by the provider's

    reply = post(base, body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-retries"] == "0" and "evict" in reply.headers["x-brim-actions"]
    sent = orjson.loads(anthropic_fake.requests[-1].body)
    assert provider_count(sent) <= BUDGET


def gemini_provider_count(model: str, body: dict[str, Any]) -> int:
    """What the fake Gemini counts for `body` sent to a "gemscaledPP-N" model: PP % of brim's."""
    tokens = counted("gemini.generate", body)
    return tokens * int(model.split("-")[0].removeprefix("gemscaled")) // 100


def test_when_gemini_counts_more_than_brim_the_guard_cuts_to_its_count(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    """The same on Gemini: under the budget by brim's estimate, over it by countTokens; the guard
    cuts to the provider's ratio, so what goes out fits by Gemini's count, with no retry."""
    model = "gemscaled110-5000"  # the fake counts 110 % of brim's o200k count
    base = gemini_brim(brim, provider, model)
    contents: list[dict[str, Any]] = []
    for n in range(12):
        contents += [
            {"role": "user", "parts": [{"text": f"step {n}: " + "lorem ipsum " * 90}]},
            {"role": "model", "parts": [{"text": f"done with step {n}: " + "dolor sit " * 90}]},
        ]
    last = {"text": "and now the last step"}
    contents.append({"role": "user", "parts": [last]})
    body = {**gemini_body(0), "contents": contents}

    def estimate() -> int:
        return counted("gemini.generate", body)

    target = GEM_BUDGET - 150
    while estimate() > target:
        body["contents"] = body["contents"][2:]
    while estimate() < target:  # the turns are coarse: the last message makes up the rest
        last["text"] += " lorem"
    assert estimate() < GEM_BUDGET  # under the budget by brim's own estimate…
    assert gemini_provider_count(model, body) > GEM_BUDGET  # …over it by Gemini's

    reply = generate(base, model, body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-retries"] == "0" and "evict" in reply.headers["x-brim-actions"]
    # Gemini was asked once, about the body as the client sent it; the cut goes out unasked.
    (asked,) = gemini_counts(provider)
    assert orjson.loads(asked.body)["generateContentRequest"]["contents"] == body["contents"]
    (sent,) = [orjson.loads(s.body) for s in provider.requests]  # one generateContent call
    assert gemini_provider_count(model, sent) <= GEM_BUDGET
