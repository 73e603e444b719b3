"""No task or connection leaks: after thousands of mixed requests (fine, streamed, refused,
failing upstream, bad input, disconnects mid-stream), brim holds no more tasks or descriptors than
its connection pool explains — and a second round adds nothing."""

from __future__ import annotations

import asyncio
import os

import httpx

from tests.conftest import BrimFactory
from tests.fakes import LoopThread

HELLO = [{"role": "user", "content": "ping"}]


async def mixed(base: str, requests: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=40)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def one(n: int) -> None:
            kind = n % 6
            if kind == 4:  # a client that leaves mid-stream
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={"model": "endless-stream", "messages": HELLO, "stream": True},
                ) as reply:
                    async for _ in reply.aiter_bytes():
                        break
                status = 200
            else:
                body = [
                    {"model": "fake-model", "messages": HELLO},
                    {"model": "fake-model", "messages": HELLO, "stream": True},
                    {"model": "error-429", "messages": HELLO},
                    {"model": "fake-model"},
                    None,
                    {
                        "model": "fake-model",
                        "messages": [{"role": "tool", "tool_call_id": "x", "content": "orphan"}],
                    },
                ][kind]
                reply = await client.post("/v1/chat/completions", json=body)
                status = reply.status_code
            statuses[status] = statuses.get(status, 0) + 1

        queue = iter(range(requests))

        async def worker() -> None:
            for n in queue:
                await one(n)

        await asyncio.gather(*(worker() for _ in range(40)))
    return statuses


def census(loop_thread: LoopThread) -> tuple[int, int]:
    async def tasks() -> int:
        await asyncio.sleep(0.5)  # let closing connections finish closing
        return len([t for t in asyncio.all_tasks() if not t.done()])

    return loop_thread.run(tasks()), len(os.listdir("/proc/self/fd"))


def test_thousands_of_mixed_requests_leak_nothing(
    brim: BrimFactory, loop_thread: LoopThread
) -> None:
    base = brim(guard={"loop_limit": 0})
    tasks_before, fds_before = census(loop_thread)
    first = asyncio.run(mixed(base, 3_000))
    tasks_after_first, fds_after_first = census(loop_thread)
    second = asyncio.run(mixed(base, 3_000))
    tasks_after_second, fds_after_second = census(loop_thread)
    assert set(first) == {200, 400, 429} and first == second
    # What remains is the keep-alive pool: one server task per pooled connection (the fake
    # provider's and brim's), two descriptors each (both ends live in this process), so at most
    # what 40 connections in flight explain — after 3 000 requests and after 6 000 alike. A leak of
    # even one task or descriptor per few hundred requests would break these bounds.
    for tasks, fds in (
        (tasks_after_first, fds_after_first),
        (tasks_after_second, fds_after_second),
    ):
        assert tasks <= tasks_before + 2 * 40, (tasks_before, tasks)
        assert fds <= fds_before + 4 * 40, (fds_before, fds)
