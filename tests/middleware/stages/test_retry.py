"""Retry on the provider's own overflow: the openai SDK through brim to providers whose real
window is smaller than brim's configured one."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.builders import tool_turn
from tests.conftest import BrimFactory, every_api
from tests.fake_anthropic import FakeAnthropic
from tests.fakes import FakeProvider, pairing_errors

# What brim is told the models have: at most 8 times their real window (tight-3000), as brim
# learns no window below an eighth of the one it knows.
BIG = 24_000


def conversation(turns: int, lines: int = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the failing test."},
    ]
    for n in range(turns):
        output = "\n".join(f"test_{n}_{i} PASSED in 0.{i}s" for i in range(lines))
        messages += tool_turn(f"c{n}", output, name="bash")
    messages.append({"role": "user", "content": "What failed?"})
    return messages


@pytest.fixture
def base(brim: BrimFactory) -> str:
    models = {
        f"{kind}-{window}": {"context_window": BIG, "max_output": 1_000}
        for kind in ("tight", "vague", "streamtight")
        for window in (3_000, 8_000, 20_000, 300)
    }
    models["tight-3000"] = {
        "context_window": BIG,
        "max_output": 1_000,
        "fallbacks": ["tight-20000"],
    }
    return brim(models=models, guard={"safety_margin": 0.0})


def post(base: str, model: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": model, "messages": messages, **extra},
        timeout=30,
    )


def test_a_stated_limit_is_used_directly_and_learned_for_the_next_request(
    base: str, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    messages = conversation(12)
    with caplog.at_level(logging.WARNING, logger="brim.retry"):
        raw = sdk.chat.completions.with_raw_response.create(model="tight-8000", messages=messages)  # type: ignore[arg-type]
    assert raw.parse().choices[0].message.content == "pong"
    assert raw.headers["x-brim-retries"] == "1"
    first, second = provider.tight_seen
    assert first[1] > 8_000 >= second[1]  # straight to the stated window: no 20 % steps
    assert second[1] >= 8_000 * 0.85  # …and not far below it
    assert int(raw.headers["x-brim-tokens-out"]) == second[1]
    assert sum("8000-token window" in r.getMessage() for r in caplog.records) == 1

    provider.tight_seen.clear()
    messages += [
        {"role": "assistant", "content": "test_3 failed"},
        {"role": "user", "content": "Why?"},
    ]
    raw = sdk.chat.completions.with_raw_response.create(model="tight-8000", messages=messages)  # type: ignore[arg-type]
    assert raw.headers["x-brim-retries"] == "0"  # compressed up front with the learned window
    assert len(provider.tight_seen) == 1 and provider.tight_seen[0][1] <= 8_000
    assert raw.headers["x-brim-actions"] != "none"
    assert int(raw.headers["x-brim-budget"]) <= 8_000


def test_without_a_stated_limit_the_cut_grows_20_30_40_percent(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    # Without brim_restore, whose tool (offered once the cut removed something) would count in
    # each cut and move where the cuts land: the steps alone.
    models = {"vague-3000": {"context_window": BIG, "max_output": 1_000}}
    base = brim(models=models, guard={"safety_margin": 0.0}, restore={"enabled": False})
    # ~4 900 tokens: only a 40 % cut gets under 3 000; small turns, so each cut can land near
    # its step (a cleared result saves ~210 tokens)
    messages = conversation(16, lines=20)
    reply = post(base, "vague-3000", messages)
    assert reply.status_code == 200
    assert reply.headers["x-brim-retries"] == "3"
    counts = [tokens for _, tokens in provider.tight_seen]
    assert len(counts) == 4
    first = counts[0]
    assert 3_000 / 0.7 < first < 3_000 / 0.6
    for attempt, step in enumerate((0.2, 0.3, 0.4), start=1):
        assert first * (1 - step) * 0.9 <= counts[attempt] <= first * (1 - step), (attempt, counts)
    for seen in provider.requests:  # every cut kept the pairing valid
        assert pairing_errors(orjson.loads(seen.body)["messages"]) == []


def test_brim_restore_is_offered_in_each_cut_and_counted_in_its_steps(
    base: str, provider: FakeProvider
) -> None:
    # Restore on (the default): the retry's cuts name keys, so the tool goes with them — once,
    # however often the request is cut — and each step counts it.
    reply = post(base, "vague-3000", conversation(8, lines=40))
    assert reply.status_code == 200, (provider.tight_seen, dict(reply.headers))
    counts = [tokens for _, tokens in provider.tight_seen]
    first, *retried = counts
    assert len(retried) == int(reply.headers["x-brim-retries"]) >= 2
    for attempt, (tokens, step) in enumerate(zip(retried, (0.2, 0.3, 0.4), strict=False)):
        assert tokens <= first * (1 - step), (attempt, counts)
    tools = [
        [tool["function"]["name"] for tool in orjson.loads(seen.body).get("tools", [])]
        for seen in provider.requests
    ]
    assert tools == [[]] + [["brim_restore"]] * len(retried)


def test_after_the_last_attempt_the_providers_error_comes_back_unchanged(
    base: str, provider: FakeProvider
) -> None:
    reply = post(base, "vague-300", conversation(12))
    assert reply.status_code == 400
    assert reply.json()["error"] == {
        "message": "Request too large for this model.",
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }
    assert reply.headers["x-brim-retries"] == "3"
    assert len(provider.tight_seen) == 4  # the first try and three retries


@pytest.mark.parametrize("status", [401, 429, 500])
def test_other_errors_are_passed_through_after_one_call(
    base: str, provider: FakeProvider, status: int
) -> None:
    reply = post(base, f"error-{status}", conversation(2))
    assert reply.status_code == status
    assert reply.json()["error"]["code"] == f"fake_{status}"
    assert reply.headers["x-brim-retries"] == "0"
    assert len(provider.requests) == 1


def test_a_string_too_long_is_relayed_after_one_call_never_cut_and_resent(
    base: str, provider: FakeProvider
) -> None:
    # OpenAI's limit on one field's length in characters: no cut of the conversation fixes it.
    error = {
        "error": {
            "message": "Invalid 'messages[0].content': string too long. Expected a string with maximum length 10485760, but got a string with length 12000000 instead.",
            "type": "invalid_request_error",
            "param": "messages[0].content",
            "code": "string_above_max_length",
        }
    }
    provider.error_bodies[400] = orjson.dumps(error)
    reply = post(base, "error-400", conversation(12))
    assert reply.status_code == 400
    assert reply.json() == error
    assert reply.headers["x-brim-retries"] == "0"
    assert len(provider.requests) == 1


def test_an_overflow_inside_a_200_stream_is_retried(base: str, provider: FakeProvider) -> None:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    stream = sdk.chat.completions.create(
        model="streamtight-8000", messages=conversation(12), stream=True
    )  # type: ignore[arg-type]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "Hello world"
    assert [tokens <= 8_000 for _, tokens in provider.tight_seen] == [False, True]


def test_a_fallback_model_is_tried_before_cutting(base: str, provider: FakeProvider) -> None:
    messages = conversation(12)
    reply = post(base, "tight-3000", messages)
    assert reply.status_code == 200
    assert reply.headers["x-brim-actions"] == "fallback:1"
    assert [model for model, _ in provider.tight_seen] == ["tight-3000", "tight-20000"]
    sent = orjson.loads(provider.requests[-1].body)
    assert sent["model"] == "tight-20000"
    assert sent["messages"] == messages  # nothing was cut


def test_a_gemini_requests_fallback_is_the_model_its_url_names(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    """Gemini names the model in the path, not the body: the fallback is asked for there (and
    the body goes on as the client sent it)."""
    models = {
        "gem-3000": {"context_window": BIG, "max_output": 1_000, "fallbacks": ["gem-20000"]},
        "gem-20000": {"context_window": BIG, "max_output": 1_000},
    }
    base = brim(**every_api(provider), models=models)
    contents = [{"role": "user", "parts": [{"text": "test log line passed " * 1_200}]}]
    reply = httpx.post(
        f"{base}/v1beta/models/gem-3000:generateContent",
        json={"contents": contents},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-brim-actions"] == "fallback:1"
    assert [model for model, _ in provider.tight_seen] == ["gem-3000", "gem-20000"]
    assert provider.requests[-1].path == "/v1beta/models/gem-20000:generateContent"
    assert orjson.loads(provider.requests[-1].body) == {"contents": contents}


def test_retry_can_be_switched_off(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim(models={"tight-3000": {"context_window": BIG}}, retry={"enabled": False})
    reply = post(base, "tight-3000", conversation(12))
    assert reply.status_code == 400
    assert len(provider.tight_seen) == 1


def anthropic_log_session(turns: int) -> list[dict[str, Any]]:
    """An Anthropic conversation of `turns` test-log turns, ~4 800 tokens each."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(turns):
        output = "\n".join(f"test_{n}_{i} PASSED in 0.{i}s" for i in range(300))
        messages += [
            {"role": "assistant", "content": f"Running batch {n}."},
            {"role": "user", "content": output},
        ]
    return [
        *messages,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "What failed?"},
    ]


def test_max_tokens_is_made_room_for_when_the_provider_says_it_shares_the_window(
    brim: BrimFactory, anthropic_fake: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    import anthropic

    model, window, max_tokens = "claude-shared-200000", 200_000, 20_000
    base = brim(
        upstreams={"claude": {"api": "anthropic", "base_url": anthropic_fake.url}},
        models={model: {"context_window": 1_000_000, "max_output": 64_000}},  # stale: too big
    )
    sdk = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    messages = anthropic_log_session(40)  # ~194 000 tokens: under the window, not with max_tokens
    with caplog.at_level(logging.WARNING, logger="brim.retry"):
        raw = sdk.messages.with_raw_response.create(
            model=model,
            max_tokens=max_tokens,
            messages=messages,  # type: ignore[arg-type]
        )
    assert raw.parse().content[0].text == "pong"  # type: ignore[union-attr]
    [refusal] = anthropic_fake.rejections
    assert refusal.startswith("input length and `max_tokens` exceed context limit: ")
    assert raw.headers["x-brim-retries"] == "1"
    [retried] = anthropic_fake.counts
    assert retried + max_tokens <= window  # the first retry made room for max_tokens
    assert retried >= (window - max_tokens) * 0.85  # …and cut no more than that asked for
    assert sum("counts max_tokens" in r.getMessage() for r in caplog.records) == 1

    # Learned for later requests: the next one is cut up front, max_tokens reserved.
    later: Any = [
        *messages,
        {"role": "assistant", "content": "test_3 failed"},
        {"role": "user", "content": "Why?"},
    ]
    raw = sdk.messages.with_raw_response.create(model=model, max_tokens=max_tokens, messages=later)
    assert raw.headers["x-brim-retries"] == "0"
    assert int(raw.headers["x-brim-budget"]) == window - max_tokens - window // 20
    assert len(anthropic_fake.rejections) == 1
    assert anthropic_fake.counts[-1] + max_tokens <= window


def test_the_cut_to_a_stated_limit_leaves_room_for_the_clients_cli_overhead(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    # A `[clients]` rule's overhead is spent by the provider inside the window it states: the
    # retry's cut leaves room for it, as the guard's budget does.
    models = {"tight-8000": {"context_window": BIG, "max_output": 1_000}}
    clients = {"agent": {"header": "x-client: agent*", "cli_overhead": 2_000}}
    base = brim(models=models, guard={"safety_margin": 0.0}, clients=clients)
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "tight-8000", "messages": conversation(12)},
        headers={"x-client": "agent-1"},
        timeout=30,
    )
    assert reply.status_code == 200
    assert reply.headers["x-brim-retries"] == "1"
    first, second = provider.tight_seen
    assert first[1] > 8_000
    assert 6_000 * 0.85 <= second[1] <= 8_000 - 2_000
