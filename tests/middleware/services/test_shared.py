"""The shared-state module: the local fallback (what a process does alone, or while Redis is
down), the link's outage policy, and learned limits, loop counts and status numbers shared by
two states on one real redis-server."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
import pytest

from brim.middleware.services.shared import (
    BLOCKED_KEY,
    LEARNED_KEY,
    RATIOS_KEY,
    LocalLoops,
    LocalState,
    RedisLink,
    RedisState,
    SharedStatus,
    Unavailable,
)
from brim.middleware.services.status_board import StatusBoard
from brim.policies.limits import Learned, LimitSource, LimitsRegistry
from brim.policies.ratios import MIN_REPLIES, TokenRatios
from tests.conftest import RedisServer
from tests.fakes import free_port

KEY = bytes(range(16))  # a request's hash, as LoopBreaker makes it


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def state(url: str, *, limit: int = 3, refresh_s: float = 60, **link: Any) -> RedisState:
    """A process's shared state on `url` (nothing runs in the background: tests call sync),
    learning token ratios for the upstreams "up" and "other"."""
    board = StatusBoard()
    return RedisState(
        RedisLink(url, **link),
        LocalState(board, loop_window_s=60),
        LimitsRegistry(),
        refresh_s=refresh_s,
        loop_limit=limit,
        ratios=TokenRatios(),
        upstreams=["up", "other"],
    )


def event(request_id: str, time: str) -> dict[str, Any]:
    return {"time": time, "request_id": request_id, "outcome": "compressed", "model": "m"}


# --- the local fallback ------------------------------------------------------------------------


async def test_local_counts_add_up_and_lift_a_window_after_the_last_failure() -> None:
    clock = Clock()
    loops = LocalLoops(60, timer=clock)
    assert (await loops.failures(KEY)).count == 0
    await loops.failed(KEY)
    clock.now += 50
    second = await loops.failed(KEY)  # the window runs from the last failure
    assert (second.count, second.lifts_in_s) == (2, 60)
    clock.now += 50
    held = await loops.failures(KEY)
    assert (held.count, held.lifts_in_s) == (2, 10)
    clock.now += 11
    assert (await loops.failures(KEY)).count == 0
    await loops.failed(KEY)
    loops.succeeded(KEY)  # one success clears it
    assert (await loops.failures(KEY)).count == 0


async def test_local_counts_say_whether_any_is_held() -> None:
    """What lets the loop breaker leave a request unhashed: no count held, none to look up."""
    clock = Clock()
    loops = LocalLoops(60, timer=clock)
    assert not loops.holding()
    await loops.failed(KEY)
    assert loops.holding()
    loops.succeeded(KEY)
    assert not loops.holding()
    await loops.failed(KEY)
    clock.now += 59
    assert loops.holding()
    clock.now += 2  # a window after the last failure: forgotten
    assert not loops.holding()


async def test_without_redis_the_status_is_the_boards_own_as_before() -> None:
    board = StatusBoard()
    board.record("gpt-4o", "ok", 10, 10)
    board.event(event("r1", "2025-01-01T00:00:00.000+00:00"))
    local = LocalState(board, loop_window_s=60)
    await local.start()
    status = await local.status()
    await local.aclose()
    assert set(status) == {
        "uptime_s",
        "totals",
        "models",
        "tokens_removed",
        "series",
        "recent_events",
    }
    assert status["totals"] == {"requests": 1, "ok": 1}
    assert [e["request_id"] for e in status["recent_events"]] == ["r1"]


async def test_while_redis_is_down_the_state_serves_locally_warns_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = state(f"redis://127.0.0.1:{free_port()}/0", limit=2, timeout_s=1, retry_s=0)
    shared.local.board.record("gpt-4o", "ok", 10, 10)
    with caplog.at_level(logging.INFO, logger="brim.shared"):
        for _ in range(3):
            await shared.sync()
        counted = [await shared.loops.failed(KEY) for _ in range(2)]
        held = await shared.loops.failures(KEY)
        shared.limits.registry.learn("gpt-4o", 50_000)
        await shared.link.settle()
        status = await shared.status()
        await shared.aclose()
    assert [c.count for c in counted] == [1, 2] and held.count == 2  # counted in process
    resolved = shared.limits.registry.resolve("gpt-4o")
    assert (resolved.limits.context_window, resolved.source) == (50_000, LimitSource.LEARNED)
    assert status["shared"] is False and status["totals"] == {"requests": 1, "ok": 1}
    assert [i["id"] for i in status["instances"]] == [shared.instance]
    assert shared.link.down
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "brim.shared"
    ]
    assert len(warnings) == 1 and "unreachable" in warnings[0], warnings


async def test_while_down_redis_is_tried_again_only_after_retry_s_one_call_at_a_time() -> None:
    clock = Clock()
    link = RedisLink(f"redis://127.0.0.1:{free_port()}/0", retry_s=30, timer=clock)
    calls = 0
    gate = asyncio.Event()

    async def failing(client: Any) -> None:
        nonlocal calls
        calls += 1
        await gate.wait()
        raise ConnectionError("refused")

    gate.set()
    with pytest.raises(Unavailable):
        await link.run(failing)
    with pytest.raises(Unavailable):
        await link.run(failing)  # within retry_s: not sent
    assert calls == 1 and link.down and not link.usable()
    link.spawn(failing)  # dropped: nothing is started while it is down
    assert calls == 1
    clock.now += 31
    gate.clear()
    probe = asyncio.ensure_future(link.run(failing))
    await asyncio.sleep(0)
    with pytest.raises(Unavailable):
        await link.run(failing)  # a retry is under way already
    gate.set()
    with pytest.raises(Unavailable):
        await probe
    assert calls == 2
    await link.aclose()


async def test_a_refused_command_is_logged_once_and_is_not_an_outage(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    link = RedisLink(redis_server.url)
    await link.run(lambda client: client.set("brim:test:text", "not a number"))
    with caplog.at_level(logging.WARNING, logger="brim.shared"):
        for _ in range(2):
            with pytest.raises(Unavailable):
                await link.run(lambda client: client.incr("brim:test:text"))
    assert not link.down
    assert await link.run(lambda client: client.get("brim:test:text")) == b"not a number"
    await link.aclose()
    assert len(caplog.records) == 1 and "failed" in caplog.records[0].getMessage()


# --- shared through Redis ------------------------------------------------------------------------


async def test_learned_limits_are_shared_the_newest_wins_and_a_restart_is_written_again(
    redis_server: RedisServer,
) -> None:
    first, second = state(redis_server.url, retry_s=0), state(redis_server.url, retry_s=0)
    first.limits.registry.learn("gpt-4o", 60_000)
    first.limits.registry.learn_output_counts("claude-x")
    await first.link.settle()  # written at once, off the request path
    await second.sync()
    resolved = second.limits.registry.resolve("gpt-4o")
    assert (resolved.limits.context_window, resolved.source) == (60_000, LimitSource.LEARNED)
    assert second.limits.registry.resolve("claude-x").limits.output_counts is True

    second.limits.registry.learn("gpt-4o", 50_000)  # learned later: it wins everywhere
    await second.link.settle()
    await first.sync()
    assert first.limits.registry.resolve("gpt-4o").limits.context_window == 50_000

    # A fact Redis holds that has expired is dropped, not adopted.
    await first.link.run(
        lambda client: client.hset(f"{LEARNED_KEY}window", "old-model", "9000 1.0")
    )
    await second.sync()
    assert "old-model" not in second.limits.registry.learned
    fields = await first.link.run(lambda client: client.hkeys(f"{LEARNED_KEY}window"))
    assert fields == [b"gpt-4o"]
    assert await first.link.run(lambda client: client.ttl(f"{LEARNED_KEY}window")) > 0

    redis_server.stop()
    redis_server.start()  # empty: what was learned is written again by the next sync
    await first.sync()
    third = state(redis_server.url)
    await third.sync()
    assert third.limits.registry.learned == {"gpt-4o": 50_000}
    for each in (first, second, third):
        await each.aclose()


def ratios_of(shared: RedisState) -> TokenRatios:
    assert shared.ratios is not None
    return shared.ratios.ratios


async def test_token_ratios_are_shared_and_the_later_learning_wins(
    redis_server: RedisServer,
) -> None:
    first, second = state(redis_server.url), state(redis_server.url)
    for _ in range(MIN_REPLIES):
        ratios_of(first).observe("cred-a", "up", "gemini-2.5-flash", 1.0, 5_000, 7_500)
    learned = ratios_of(first).get("cred-a", "up", "gemini-2.5-flash")
    assert learned is not None and learned.replies == MIN_REPLIES
    await first.sync()  # written
    await second.sync()  # adopted
    assert ratios_of(second).get("cred-a", "up", "gemini-2.5-flash") == learned
    # another client on the second instance is counted at the median of the one that settled
    assert ratios_of(second).ratio("cred-b", "up", "gemini-2.5-flash", 1.0) == round(
        learned.value, 2
    )
    ratios_of(second).observe("cred-a", "up", "gemini-2.5-flash", 1.0, 5_000, 7_500)  # later
    await second.sync()
    await first.sync()
    assert ratios_of(first).get("cred-a", "up", "gemini-2.5-flash") == ratios_of(second).get(
        "cred-a", "up", "gemini-2.5-flash"
    )
    assert await first.link.run(lambda client: client.ttl(RATIOS_KEY)) > 0
    for each in (first, second):
        await each.aclose()


async def test_each_instance_takes_the_median_of_the_clients_it_heard_of(
    redis_server: RedisServer,
) -> None:
    """Three clients taught the model on three instances, one of them hostile: on each, a
    client of its own that has not settled is counted at the honest two's ratio."""
    instances = [state(redis_server.url) for _ in range(3)]
    for shared, (owner, shown) in zip(
        instances, [("cred-a", 7_500), ("cred-b", 7_400), ("cred-hostile", 14_900)], strict=True
    ):
        for _ in range(3 * MIN_REPLIES):
            ratios_of(shared).observe(owner, "up", "m", 1.0, 5_000, shown)
        await shared.sync()
    for shared in instances:
        await shared.sync()
        ratios = ratios_of(shared)
        assert 1.45 <= ratios.ratio("cred-new", "up", "m", 1.0) <= 1.5
        assert ratios.ratio("cred-hostile", "up", "m", 1.0) > 2.9  # its own, for itself
        votes = ratios.shared("up", "m", 1.0)
        assert votes is not None and (votes.owners, votes.settled) == (3, 3)
    for each in instances:
        await each.aclose()


async def test_token_ratios_read_from_redis_are_checked_first(redis_server: RedisServer) -> None:
    """Redis is trusted no more than a reply: a ratio out of bounds, from the future, forgotten,
    malformed, of an owner brim would not name or in an earlier brim's form (no owner) is
    dropped, never adopted; one for an upstream this brim lacks (another configuration's) is
    left alone."""
    shared = state(redis_server.url)
    now = time.time()
    entries = {
        orjson.dumps(["cred-a", "up", "huge"]): f"50.0 3 {now!r}",
        orjson.dumps(["cred-a", "up", "tiny"]): f"0.01 3 {now!r}",
        orjson.dumps(["cred-a", "up", "nan"]): f"nan 3 {now!r}",
        orjson.dumps(["cred-a", "up", "future"]): f"1.4 3 {now + 86_400!r}",
        orjson.dumps(["cred-a", "up", "forgotten"]): f"1.4 3 {now - 30 * 86_400!r}",
        orjson.dumps(["cred-a", "up", "no-replies"]): f"1.4 0 {now!r}",
        orjson.dumps(["cred-a", "up", "x" * 300]): f"1.4 3 {now!r}",
        orjson.dumps(["Cred A!", "up", "owner"]): f"1.4 3 {now!r}",
        orjson.dumps(["", "up", "no-owner"]): f"1.4 3 {now!r}",
        orjson.dumps(["up", "unowned"]): f"1.4 3 {now!r}",
        b"not json": f"1.4 3 {now!r}",
        orjson.dumps(["cred-a", "up", "words"]): "one two three",
        orjson.dumps(["cred-a", "elsewhere", "claude-x"]): f"1.4 3 {now!r}",
        orjson.dumps(["cred-a", "up", "good"]): f"1.4 3 {now!r}",
    }
    await shared.link.run(lambda client: client.hset(RATIOS_KEY, mapping=entries))
    await shared.sync()
    assert {model for _, model in ratios_of(shared).models()} == {"good"}
    left = await shared.link.run(lambda client: client.hkeys(RATIOS_KEY))
    assert sorted(left) == sorted(
        [
            orjson.dumps(["cred-a", "elsewhere", "claude-x"]),
            orjson.dumps(["cred-a", "up", "good"]),
        ]
    )
    await shared.aclose()


async def test_loop_counts_add_up_over_instances(redis_server: RedisServer) -> None:
    a, b, c = (state(redis_server.url, limit=3) for _ in range(3))
    sent = 0

    def counting(shared: RedisState) -> None:
        run = shared.link.run

        async def counted(operation: Any) -> Any:
            nonlocal sent
            sent += 1
            return await run(operation)

        shared.link.run = counted  # type: ignore[method-assign]

    for each in (a, b, c):
        counting(each)
    assert [(await s.loops.failed(KEY)).count for s in (a, b, a)] == [1, 2, 3]
    assert (await b.loops.failures(KEY)).count == 3  # b knew of it: asked Redis
    before = sent
    assert (await c.loops.failures(KEY)).count == 0  # c never saw it fail: Redis not asked
    assert sent == before
    assert not c.loops.holding()  # so its loop breaker need not even hash a request
    await a.link.settle()  # the block, written off the request path
    await c.sync()
    assert c.loops.holding()  # it holds the block read from Redis
    blocked = await c.loops.failures(KEY)
    assert blocked.count == 3 and 0 < blocked.lifts_in_s <= 60
    a.loops.succeeded(KEY)  # a success clears it everywhere
    await a.link.settle()
    assert (await b.loops.failures(KEY)).count == 0
    assert (await c.loops.failures(KEY)).count == 0
    members = await a.link.run(lambda client: client.zrange(BLOCKED_KEY, 0, -1))
    assert members == []
    for each in (a, b, c):
        await each.aclose()


async def test_status_sums_the_live_instances_and_merges_their_events(
    redis_server: RedisServer,
) -> None:
    a, b = state(redis_server.url), state(redis_server.url)
    a.local.board.record("gpt-4o", "ok", 100, 100)
    a.local.board.event(event("a1", "2025-01-01T00:00:01.000+00:00"))
    b.local.board.record("gpt-4o", "compressed", 900, 400)
    b.local.board.record("claude-x", "ok", 10, 10)
    b.local.board.event(event("b1", "2025-01-01T00:00:00.000+00:00"))
    b.local.board.event(event("b2", "2025-01-01T00:00:02.000+00:00"))
    await b.sync()
    a.local.board.event(event("a2", "2025-01-01T00:00:03.000+00:00"))  # not pushed yet: live
    status = await a.status()
    assert status["shared"] is True and status["instance"] == a.instance
    assert {i["id"] for i in status["instances"]} == {a.instance, b.instance}
    assert status["totals"] == {"requests": 3, "ok": 2, "compressed": 1}
    assert status["models"]["gpt-4o"] == {
        "requests": 2,
        "ok": 1,
        "compressed": 1,
        "tokens_in": 1000,
        "tokens_out": 500,
    }
    assert [(e["request_id"], e["instance"]) for e in status["recent_events"]] == [
        ("b1", b.instance),
        ("a1", a.instance),
        ("b2", b.instance),
        ("a2", a.instance),
    ]
    await a.sync()  # pushed now: shown once, not twice
    assert [e["request_id"] for e in (await b.status())["recent_events"]] == [
        "b1",
        "a1",
        "b2",
        "a2",
    ]

    # An instance that stops writing is left out once its numbers expire.
    quiet = SharedStatus(b.link, StatusBoard(), "quiet", ttl_s=1)
    quiet.board.record("gpt-4o", "ok", 1, 1)
    await quiet.push()
    assert (await a.status())["totals"]["requests"] == 4
    await asyncio.sleep(1.1)
    assert (await a.status())["totals"]["requests"] == 3
    for each in (a, b):
        await each.aclose()


def test_the_registry_adopts_a_newer_fact_only_and_tells_no_listener() -> None:
    clock = Clock()
    registry = LimitsRegistry(timer=clock)
    heard: list[Learned] = []
    registry.listeners.append(heard.append)
    assert registry.learn("gpt-4o", 100_000) is True
    assert [(f.kind, f.model, f.value, f.until) for f in heard] == [
        ("window", "gpt-4o", 100_000, clock.now + 24 * 3600)
    ]
    older = Learned("window", "gpt-4o", 90_000, clock.now + 100)
    newer = Learned("window", "gpt-4o", 80_000, clock.now + 24 * 3600 + 5)
    expired = Learned("window", "gpt-5", 70_000, clock.now - 1)
    assert [registry.adopt(f) for f in (older, newer, expired)] == [False, True, False]
    assert registry.learned == {"gpt-4o": 80_000} and len(heard) == 1
    clock.now += 24 * 3600 + 6  # forgotten when the fact says, not a day after adopting it
    assert registry.learned == {}
    assert registry.resolve("gpt-4o").source is not LimitSource.LEARNED
