"""Many brims that act as one: two instances on loopback (in process, each with its own
services), sharing one real redis-server through `[cache] url`, in front of fake providers on
127.0.0.1; clients on the official SDKs where the API has one.

What one instance learned, counted, summarized and saw, the other uses and shows; with Redis
killed mid-run both go on serving alone (one warning each), and share again once it is back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.builders import tool_turn
from tests.conftest import BrimFactory, RedisServer, fake_upstream
from tests.fakes import FakeProvider, LoopThread, start_app, wait_for
from tests.restoring import WINDOW, Restoring, brim_config, logs
from tests.test_restore_e2e import APIS, Api

ADMIN = "shared-admin-key-0123456789"
ADMIN_ENV = "SHARED_E2E_ADMIN_KEYS"
FAST = {"refresh_s": 0.05, "retry_s": 0.2, "timeout_s": 1}  # sync often, retry soon


@pytest.fixture
def shared(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The sections that make brims share one Redis (and open their admin endpoints)."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    return {"cache": {"url": redis_server.url, **FAST}, "server": {"admin_keys_env": ADMIN_ENV}}


@pytest.fixture
def restoring(loop_thread: LoopThread) -> Iterator[Restoring]:
    """A provider on all four APIs whose models hold the window their name ends with."""
    fake = Restoring(reads=0)
    runner, url = loop_thread.run(start_app(fake.app()))
    fake.url = url
    yield fake
    loop_thread.run(runner.cleanup())


def status(base: str) -> dict[str, Any]:
    reply = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}, timeout=10)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def learned(base: str, model: str) -> Callable[[], bool]:
    return lambda: status(base)["learned_limits"].get(model) == WINDOW


# --- learned limits ------------------------------------------------------------------------------


CHAT = next(api for api in APIS if api.name == "chat")


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_an_overflow_learned_by_one_instance_makes_the_other_compress_up_front(
    api: Api, brim: BrimFactory, restoring: Restoring, shared: dict[str, Any]
) -> None:
    a = brim(brim_config(restoring.url, **shared))
    b = brim(brim_config(restoring.url, **shared))
    alone = brim(brim_config(restoring.url))  # no Redis: learns only what it is told itself
    model = api.retry_model  # brim is told 32 000 tokens; the provider holds WINDOW

    # A is refused, learns the window from the error, cuts and retries. (OpenAI's Responses
    # errors state no window: on that API A learns it from a Chat request to the same model.)
    learner = CHAT if api.name == "responses" else api
    reply = learner.send(a, logs("a"), model)
    assert restoring.calls[0].reply == "overflow"
    assert len(restoring.calls) == 2 and reply.headers["x-brim-retries"] == "1"
    assert wait_for(learned(b, model))

    sent = len(restoring.calls)
    reply = api.send(b, logs("b"), model)
    assert len(restoring.calls) == sent + 1  # exactly one upstream call: compressed up front
    assert restoring.calls[-1].reply != "overflow" and restoring.calls[-1].tokens <= WINDOW
    assert reply.headers["x-brim-retries"] == "0" and reply.headers["x-brim-actions"] != "none"

    sent = len(restoring.calls)
    api.send(alone, logs("c"), model)  # the same request to a brim that shares nothing
    assert restoring.calls[sent].reply == "overflow"


def test_requests_that_fit_make_no_redis_round_trip(
    brim: BrimFactory, provider: FakeProvider, redis_server: RedisServer
) -> None:
    import redis

    base = brim(cache={"url": redis_server.url, "refresh_s": 60})  # one sync, at start
    client = redis.Redis.from_url(redis_server.url)

    def commands() -> int:
        return int(client.info("stats")["total_commands_processed"])

    assert wait_for(lambda: client.exists("brim:status:instances") == 1)  # the start's sync
    before = commands()
    for n in range(20):
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {n}"}]}
        assert httpx.post(f"{base}/v1/chat/completions", json=body).status_code == 200
    assert commands() == before + 1  # the INFO itself, nothing else
    client.close()


# --- the loop guard ------------------------------------------------------------------------------


FAILING = "compact this conversation, again"


def _chat(base: str) -> int:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-loop", max_retries=0)
    try:
        sdk.chat.completions.create(
            model="error-400", messages=[{"role": "user", "content": FAILING}]
        )
    except openai.APIStatusError as error:
        return error.status_code
    return 200


def _messages(base: str) -> int:
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-ant-loop", max_retries=0)
    try:
        sdk.messages.create(
            model="error-400", max_tokens=16, messages=[{"role": "user", "content": FAILING}]
        )
    except anthropic.APIStatusError as error:
        return error.status_code
    return 200


def _responses(base: str) -> int:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-loop", max_retries=0)
    try:
        sdk.responses.create(model="gpt-4.1", input=FAILING)
    except openai.APIStatusError as error:
        return error.status_code
    return 200


def _gemini(base: str) -> int:
    return httpx.post(
        f"{base}/v1beta/models/gemini-2.5-flash:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": FAILING}]}]},
        headers={"x-goog-api-key": "AIza-loop"},
        timeout=10,
    ).status_code


# The API → how a client sends the failing request, and what it fails with: the fake provider's
# own 400 (it counts the calls it got), or, where it has no such model, an upstream that is not
# there (502).
LOOP_CASES: dict[str, tuple[Callable[[str], int], int]] = {
    "chat": (_chat, 400),
    "messages": (_messages, 400),
    "responses": (_responses, 502),
    "gemini": (_gemini, 502),
}


@pytest.mark.parametrize("api", list(LOOP_CASES))
def test_five_identical_failures_split_between_two_instances_trigger_the_429(
    api: str,
    brim: BrimFactory,
    provider: FakeProvider,
    closed_port: int,
    shared: dict[str, Any],
) -> None:
    send, failure = LOOP_CASES[api]
    there = {"base_url": provider.url}
    nowhere = {"base_url": f"http://127.0.0.1:{closed_port}"}
    upstreams = {
        "openai": fake_upstream(provider) if failure == 400 else {"api": "openai", **nowhere},
        "anthropic": {"api": "anthropic", **there},
        "gemini": {"api": "gemini", **nowhere},
    }
    sections = {
        "upstreams": upstreams,  # each API to the first upstream that speaks it
        "guard": {"loop_limit": 5, "loop_window_s": 60},
        **shared,
    }
    a, b = brim(**sections), brim(**sections)
    assert [send(base) for base in (a, b, a, b, a)] == [failure] * 5
    assert [send(base) for base in (b, a)] == [429, 429]  # the sixth, on either instance
    if failure == 400:
        assert len(provider.requests) == 5  # the provider saw five, not six or seven


# --- summaries ----------------------------------------------------------------------------------


def test_a_summary_made_by_one_instance_is_reused_by_the_other(
    brim: BrimFactory, provider: FakeProvider, shared: dict[str, Any]
) -> None:
    sections = {
        "models": {"strict-8k": {"context_window": 8_192, "max_output": 1_024}},
        "guard": {"policies": ["truncate"]},
        "summarize": {"enabled": True, "provider": "summarizer-good", "max_retries": 0},
    }
    a, b = brim(**sections, **shared), brim(**sections, **shared)
    alone = brim(**sections)
    log = "\n".join(f"worker {i}: processed batch without errors" for i in range(2_000))
    body = {
        "model": "strict-8k",
        "messages": [
            {"role": "user", "content": "Why did the job fail?"},
            *tool_turn("c0", log + "\nFACT: batch 1999 failed on a disk quota\n", name="bash"),
        ],
    }
    sent = []
    for base in (a, b):
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert reply.status_code == 200 and "summarize:1" in reply.headers["x-brim-actions"]
        sent.append(provider.requests[-1].body)
    assert provider.summarizer_calls == ["summarizer-good"]  # made by A, reused by B
    assert sent[0] == sent[1] and b"disk quota" in sent[1]
    httpx.post(f"{alone}/v1/chat/completions", json=body, timeout=30)
    assert provider.summarizer_calls == ["summarizer-good"] * 2  # one that shares nothing


# --- status -------------------------------------------------------------------------------------

BIG_RESULT = "\n".join(f"line {i}: the build step wrote its report" for i in range(3_000))
MODELS = {"strict-8k": {"context_window": 8_192, "max_output": 1_024}}


def ask(base: str, request_id: str, *, big: bool = False) -> httpx.Response:
    """A request that fits (fake-model), or (`big`) one the guard must cut (strict-8k)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarize the build."}]
    if big:
        messages += tool_turn("c0", BIG_RESULT, name="bash")
    body = {"model": "strict-8k" if big else "fake-model", "messages": messages}
    return httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={"x-request-id": request_id}, timeout=30
    )


def test_admin_status_on_either_instance_shows_both_instances_events_and_totals(
    brim: BrimFactory, provider: FakeProvider, shared: dict[str, Any]
) -> None:
    a, b = brim(models=MODELS, **shared), brim(models=MODELS, **shared)
    for base, request_id, big in [
        (a, "a-fits-1", False),
        (a, "a-fits-2", False),
        (a, "a-cut", True),
        (b, "b-fits", False),
        (b, "b-cut", True),
    ]:
        assert ask(base, request_id, big=big).status_code == 200

    def both(base: str) -> bool:
        seen = status(base)
        events = {e["request_id"] for e in seen["recent_events"]}
        return seen["totals"].get("requests") == 5 and {"a-cut", "b-cut"} <= events

    assert wait_for(lambda: both(a) and both(b))
    for base in (a, b):
        seen = status(base)
        assert seen["shared"] is True and len({i["id"] for i in seen["instances"]}) == 2
        assert seen["totals"] == {
            "requests": 5,
            "ok": 3,
            "compressed": 2,
            "prevented": 2,
            "restore_offered": 2,
        }
        assert seen["models"]["fake-model"]["requests"] == 3
        # the dashboard's figures are summed too: tokens removed, and the series point by point
        assert sum(seen["tokens_removed"].values()) > 0
        fields = seen["series"]["fields"]
        (cut,) = [s["points"] for s in seen["series"]["series"] if s["model"] == "strict-8k"]
        for name, count in (("requests", 2), ("prevented", 2)):
            assert sum(point[fields.index(name)] for point in cut) == count
        assert seen["models"]["strict-8k"]["compressed"] == 2
        by_id = {e["request_id"]: e["instance"] for e in seen["recent_events"]}
        assert set(by_id) == {"a-cut", "b-cut"} and by_id["a-cut"] != by_id["b-cut"]
        assert seen["instance"] in by_id.values()


# --- Redis going away mid-run --------------------------------------------------------------------


TIGHT = {"tight-8000": {"context_window": 64_000, "max_output": 1_000}}  # really 8 000: 1/8


def tight_conversation(tag: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(12):
        output = "\n".join(f"{tag} test_{n}_{i} PASSED in 0.{i}s" for i in range(60))
        messages += tool_turn(f"c{n}", output, name="bash")
    return [*messages, {"role": "user", "content": "What failed?"}]


def tight(base: str, tag: str) -> httpx.Response:
    body = {"model": "tight-8000", "messages": tight_conversation(tag)}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)


def test_redis_killed_mid_run_then_back_no_request_fails_and_sharing_resumes(
    brim: BrimFactory,
    provider: FakeProvider,
    redis_server: RedisServer,
    shared: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sections = {"models": {**MODELS, **TIGHT}, "guard": {"loop_limit": 2}, **shared}
    a, b = brim(**sections), brim(**sections)
    assert ask(a, "before-a").status_code == ask(b, "before-b").status_code == 200
    assert wait_for(lambda: len(status(a)["instances"]) == 2)

    with caplog.at_level(logging.INFO, logger="brim.shared"):
        redis_server.stop()
        statuses = [
            ask(a, "down-a-fits").status_code,
            ask(b, "down-b-fits").status_code,
            ask(a, "down-a-cut", big=True).status_code,
            ask(b, "down-b-cut", big=True).status_code,
            tight(a, "down").status_code,  # A learns the real window, alone for now
        ]
        failing = {"model": "error-400", "messages": [{"role": "user", "content": "again"}]}
        loop = [
            httpx.post(f"{base}/v1/chat/completions", json=failing, timeout=10).status_code
            for base in (a, a, a, b)
        ]
        down = [status(a), status(b)]
        assert statuses == [200] * 5
        assert loop == [400, 400, 429, 400]  # each instance counts alone meanwhile
        assert all(s["shared"] is False for s in down)
        assert status(a)["totals"]["requests"] == 1 + 3 + 3  # its own numbers, live

        redis_server.start()
        assert wait_for(lambda: all(len(status(x)["instances"]) == 2 for x in (a, b)))
        # What A learned while Redis was down reaches B once it is back.
        assert wait_for(learned_tight(b))
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "brim.shared"]
    warnings = [message for level, message in said if level >= logging.WARNING]
    assert len(warnings) == 2 and all("unreachable" in w for w in warnings), said  # one each
    assert sum("reachable again" in message for _, message in said) == 2

    sent = len(provider.requests)
    reply = tight(b, "after")
    assert reply.status_code == 200 and reply.headers["x-brim-retries"] == "0"
    assert len(provider.requests) == sent + 1  # compressed up front with A's window
    assert orjson.loads(provider.requests[-1].body)["model"] == "tight-8000"
    # Both instances' numbers, on either: A's 7 requests, B's 5.
    assert wait_for(lambda: [status(x)["totals"]["requests"] for x in (a, b)] == [12, 12])


def learned_tight(base: str) -> Callable[[], bool]:
    return lambda: status(base)["learned_limits"].get("tight-8000") == 8_000
