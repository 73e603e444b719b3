"""Latency and throughput over HTTP, from this process to the processes under test."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import aiohttp
import orjson

from bench.fake import ANSWERED, RECEIVED, now_ms

BODY = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "ping"}]})
STREAM_BODY = orjson.dumps(
    {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "ping"}]}
)
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def summary(milliseconds: list[float]) -> dict[str, float]:
    return {
        "n": len(milliseconds),
        "p50_ms": round(percentile(milliseconds, 0.50), 3),
        "p99_ms": round(percentile(milliseconds, 0.99), 3),
        "mean_ms": round(statistics.fmean(milliseconds), 3),
    }


async def one(
    session: aiohttp.ClientSession,
    url: str,
    stream: bool,
    legs: list[tuple[float, float]] | None = None,
) -> float:
    """One request's latency in ms (a stream's: to the first byte of its body). With `legs`, a
    plain reply's way in (sent → the provider has it) and way back (the provider answered → the
    reply is read) are appended, in ms, where the fake provider's stamps came back with it."""
    started = now_ms()
    async with session.post(
        f"{url}/chat/completions", data=STREAM_BODY if stream else BODY, headers=HEADERS
    ) as reply:
        if reply.status != 200:
            raise RuntimeError(f"{url}: HTTP {reply.status}: {(await reply.read())[:200]!r}")
        if stream:
            await reply.content.readany()  # time to first byte of the body
            elapsed = now_ms() - started
            await reply.read()
            return elapsed
        await reply.read()
    ended = now_ms()
    received, answered = reply.headers.get(RECEIVED), reply.headers.get(ANSWERED)
    if legs is not None and received and answered:
        legs.append((float(received) - started, ended - float(answered)))
    return ended - started


def _session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False)
    )


async def sequential(
    targets: Mapping[str, str],
    requests: int,
    stream: bool,
    legs: dict[str, list[tuple[float, float]]] | None = None,
) -> dict[str, list[float]]:
    """One request at a time, the targets interleaved so drift hits all of them alike; each
    plain request's way in and way back into `legs`, by target, where given (`one`)."""
    results: dict[str, list[float]] = {name: [] for name in targets}
    if legs is not None:
        legs.update({name: [] for name in targets})
    sessions = {name: _session(1) for name in targets}
    try:
        for name, url in targets.items():  # warm up connections and caches
            for _ in range(min(100, requests)):
                await one(sessions[name], url, stream)
        names = list(targets)
        for index in range(requests):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                into = None if legs is None else legs[name]
                results[name].append(await one(sessions[name], targets[name], stream, into))
    finally:
        for session in sessions.values():
            await session.close()
    return results


async def concurrent(
    targets: Mapping[str, str], requests: int, concurrency: int, stream: bool
) -> dict[str, list[float]]:
    """`concurrency` requests in flight; targets take turns in rounds."""
    results: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(3):
        for name, url in targets.items():
            async with _session(concurrency) as session:
                queue = iter(range(requests // 3))
                workers = (
                    _drain(queue, session, url, stream, results[name]) for _ in range(concurrency)
                )
                await asyncio.gather(*workers)
    return results


async def _drain(
    queue: Iterator[int], session: aiohttp.ClientSession, url: str, stream: bool, into: list[float]
) -> None:
    for _ in queue:
        into.append(await one(session, url, stream))


async def long_streams(url: str, streams: int, events: int) -> None:
    """`streams` streams one after another, each of `events` content events (`bench.fake`)."""
    body = orjson.dumps(
        {
            "model": "fake-model",
            "stream": True,
            "fake_events": events,
            "messages": [{"role": "user", "content": "ping"}],
        }
    )
    async with _session(1) as session:
        for _ in range(streams):
            async with session.post(f"{url}/chat/completions", data=body, headers=HEADERS) as reply:
                relayed = await reply.read()
                if reply.status != 200 or relayed.count(b"data: ") != events + 1:
                    raise RuntimeError(f"{url}: HTTP {reply.status}, {len(relayed)} bytes")


async def throughput(url: str, requests: int, concurrency: int) -> tuple[float, float]:
    """Requests per second at `concurrency`, and the wall time taken."""
    async with _session(concurrency) as session:
        queue = iter(range(requests))
        sink: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(
            *(_drain(queue, session, url, False, sink) for _ in range(concurrency))
        )
        wall = time.perf_counter() - started
    return requests / wall, wall


async def streams(
    url: str,
    clients: int,
    seconds: float,
    rss: Callable[[], float] | None = None,
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """`clients` clients each streaming one request after another for `seconds`: requests,
    errors, time to first byte (p50, p99) and, with `rss`, its figure sampled every second.
    Requests started in the first `warmup_s` (the burst of new connections) are not timed."""
    latencies: list[float] = []
    errors: list[str] = []
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + seconds
    started = time.monotonic()

    timed_from = started + warmup_s

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            timed = time.monotonic() >= timed_from
            try:
                latency = await one(session, url, True)
            except Exception as exc:
                errors.append(type(exc).__name__)
                continue
            if timed:
                latencies.append(latency)

    async def sampler(rss: Callable[[], float]) -> None:
        while time.monotonic() < deadline:
            samples.append((round(time.monotonic() - started, 1), rss()))
            await asyncio.sleep(1)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        jobs = [worker(session) for _ in range(clients)]
        await asyncio.gather(*jobs, *([sampler(rss)] if rss else []))
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        **summary(latencies or [0.0]),
        "rss_mb": samples,
    }
