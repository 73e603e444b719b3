"""No task or connection leaks: after thousands of mixed requests (fine, streamed, refused,
failing upstream, bad input, disconnects mid-stream), brim holds no more tasks or descriptors than
its connection pool explains — and a second round adds nothing."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

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


@pytest.mark.timeout(300)  # 5 000 requests: ~25 s here, more on a slow CI machine
def test_thousands_of_mixed_requests_leak_nothing(
    brim: BrimFactory, loop_thread: LoopThread
) -> None:
    base = brim(guard={"loop_limit": 0})
    tasks_before, fds_before = census(loop_thread)
    first = asyncio.run(mixed(base, 2_500))
    tasks_after_first, fds_after_first = census(loop_thread)
    second = asyncio.run(mixed(base, 2_500))
    tasks_after_second, fds_after_second = census(loop_thread)
    assert set(first) == {200, 400, 429} and first == second
    # What remains is the keep-alive pool: one server task per pooled connection (the fake
    # provider's and brim's), two descriptors each (both ends live in this process), so at most
    # what 40 connections in flight explain — after 2 500 requests and after 5 000 alike. A leak of
    # one task or descriptor per 60 requests would break these bounds.
    for tasks, fds in (
        (tasks_after_first, fds_after_first),
        (tasks_after_second, fds_after_second),
    ):
        assert tasks <= tasks_before + 2 * 40, (tasks_before, tasks)
        assert fds <= fds_before + 4 * 40, (fds_before, fds)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_a_slow_reader_holds_brims_memory_flat(brim: BrimFactory) -> None:
    """The provider could send 200 MB at once; the client reads 64 KB every 20 ms. brim relays
    with backpressure, so what it holds is socket buffers, not the provider's speed."""
    base = brim()
    httpx.post(f"{base}/v1/chat/completions", json={"model": "fake-model", "messages": HELLO})
    time.sleep(1.0)  # the tokenizer loads beside start-up (~40 MB): measure from after it
    before = rss_mb()
    read = 0
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "firehose", "messages": HELLO, "stream": True},
        timeout=30,
    ) as reply:
        for chunk in reply.iter_bytes(65_536):
            read += len(chunk)
            time.sleep(0.02)
            if read > 6_000_000:
                break
        grown = rss_mb() - before
    assert read > 6_000_000
    assert grown < 30, f"brim's process grew {grown:.0f} MB while the reader took 6 MB of 200"
