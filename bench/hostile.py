"""`python -m bench.hostile`: brim against hostile and heavy clients. Each scenario runs against a
`brim serve` process of its own in front of the fake provider (`bench.fake`); the load comes from
other processes: this one, and for the slow-loris connections a child process of their own.

    python -m bench.hostile            # full sizes (about a minute)
    python -m bench.hostile --quick    # tiny sizes (a smoke run)

- saturation: `max_in_flight = 4`, filled by 4 streams the fake provider holds open, then bursts
  of 100 and of 500 requests spread over the four wire APIs, each request sent at once on a
  connection of its own opened beforehand (the figure is brim's answer, not TCP connects), by a
  plain selector loop (so the client's own time hardly counts). Reports the 503s' latency
  (target p99 < 50 ms) beside the same burst's at the fake provider (an aiohttp server that
  answers at once: the floor), that each has `retry-after` and its API's error shape, that the
  held streams complete, and brim's descriptor count before, during and after.
- slow loris: 3 000 connections (from a child process) each send half a request and then
  nothing, against `header_timeout_s = 1`. Reports, per connection, the time from its connect to
  brim closing it (target: all within header_timeout_s + 1 s), how many got a 408, and the
  latency of normal requests (each on a new connection) made meanwhile from this process.
- large bodies: 8 bodies of 30 MB at once against `max_body_buffer_mb = 31`: brim's peak RSS
  (VmHWM) against the bound the README states, idle + 14 × max_body_buffer_mb, and that every
  request is answered: 200, or a 503 with `retry-after` for a body that found no room in time.

Figures go to stdout and to `--out` (JSON); `python -m bench` runs this too. Exits 1 when a
behaviour is wrong (a request unanswered or answered wrongly, descriptors not back, a loris
connection never closed), not when a timing target is missed: those are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import selectors
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import procs
from bench.load import percentile

HELLO = [{"role": "user", "content": "ping"}]
JSON = {"Content-Type": "application/json"}
EXTRA = (
    '[models."held"]\ncontext_window = 128000\nmax_output = 4096\n'
    '[models."big"]\ncontext_window = 100_000_000\nmax_output = 1_000\n'
)
SHED_P99_MS = 50.0  # the 503s past max_in_flight
LORIS_SLACK_S = 1.0  # every half-open connection closed within header_timeout_s + this
PROBE_MAX_MS = 500.0  # a normal request while the loris connections are held
BODY_FACTOR = 14  # peak RSS under idle + this × max_body_buffer_mb (the README's bound)
CONNECT_BATCH = 32  # the slow-loris client's connects between looks at its events
PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
# A small request of each wire API (a path and its body).
WIRE: dict[str, tuple[str, bytes]] = {
    "chat": (
        "/v1/chat/completions",
        orjson.dumps({"model": "fake-model", "messages": HELLO}),
    ),
    "responses": ("/v1/responses", orjson.dumps({"model": "fake-model", "input": "ping"})),
    "messages": (
        "/v1/messages",
        orjson.dumps({"model": "fake-model", "max_tokens": 10, "messages": HELLO}),
    ),
    "gemini": (
        "/v1beta/models/fake-model:generateContent",
        orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "ping"}]}]}),
    ),
}


def overloaded_shape(api: str, body: bytes) -> bool:
    """Whether `body` is a 503 "overloaded" error in `api`'s own shape."""
    try:
        error = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(error, dict) or not isinstance(error.get("error"), dict):
        return False
    inner = error["error"]
    if api == "messages":
        return bool(error.get("type") == "error" and inner.get("type") == "overloaded_error")
    if api == "gemini":
        return bool(inner.get("code") == 503 and inner.get("status") == "UNAVAILABLE")
    return bool(inner.get("type") == "server_error" and inner.get("code") == "overloaded")


def ms(values: list[float]) -> dict[str, Any]:
    """n, p50, p99 and max of `values` (seconds), in milliseconds."""
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.50) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def request_bytes(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


class Answer:
    """One HTTP/1.1 reply read off a raw socket, complete once its Content-Length is in."""

    def __init__(self) -> None:
        self.data = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self._length: int | None = None
        self._head = 0

    def feed(self, chunk: bytes) -> bool:
        """Add `chunk`; whether the reply is complete."""
        self.data += chunk
        if self._length is None:
            end = self.data.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = self.data[:end].decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            for line in lines[1:]:
                name, _, value = line.partition(":")
                self.headers[name.strip().lower()] = value.strip()
            self._head = end + 4
            self._length = int(self.headers.get("content-length", "0"))
        if len(self.data) - self._head < self._length:
            return False
        self.body = self.data[self._head : self._head + self._length]
        return True


def raw_burst(socks: list[socket.socket], requests: list[bytes]) -> list[tuple[float, Answer]]:
    """Send `requests[i]` on `socks[i]` (connected, kept alive), all at once, and read each
    reply: its time from its own send to its last byte, and the reply. A plain selector loop,
    so that the client's own cost per request (tens of microseconds) hardly counts."""
    selector = selectors.DefaultSelector()
    answers = [Answer() for _ in socks]
    started = [0.0] * len(socks)
    took = [0.0] * len(socks)
    for index, sock in enumerate(socks):
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)
    for index, sock in enumerate(socks):
        started[index] = time.perf_counter()
        sock.sendall(requests[index])  # small: fits the socket buffer at once
    pending = len(socks)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for key, _ in selector.select(1.0):
            index = key.data
            chunk = socks[index].recv(65536)
            if answers[index].feed(chunk) or not chunk:
                took[index] = time.perf_counter() - started[index]
                selector.unregister(socks[index])
                pending -= 1
    selector.close()
    for sock in socks:
        sock.setblocking(True)
    return list(zip(took, answers, strict=True))


async def settled_fds(process: procs.Process, at_most: int | None, timeout_s: float) -> int:
    """The process's descriptor count once it is at most `at_most` (None: once it has stopped
    changing for half a second), or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last, steady = process.fds(), 0
    while time.monotonic() < deadline:
        if at_most is not None and last <= at_most:
            return last
        await asyncio.sleep(0.1)
        now = process.fds()
        steady = steady + 1 if now == last else 0
        last = now
        if at_most is None and steady >= 5:
            return last
    return last


async def _fake_holds(fake_root: str, session: aiohttp.ClientSession, count: int) -> None:
    for _ in range(500):
        async with session.get(f"{fake_root}/fake/held") as reply:
            if (await reply.json())["held"] >= count:
                return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"the fake provider is not holding {count} requests")


async def _held_streams(
    root: str, fake_root: str, session: aiohttp.ClientSession, count: int
) -> list[asyncio.Task[tuple[int, bytes]]]:
    """`count` streams that the fake provider holds open until released."""

    async def stream() -> tuple[int, bytes]:
        body = orjson.dumps({"model": "held", "stream": True, "messages": HELLO})
        async with session.post(f"{root}/v1/chat/completions", data=body, headers=JSON) as reply:
            return reply.status, await reply.read()

    held = [asyncio.create_task(stream()) for _ in range(count)]
    await _fake_holds(fake_root, session, count)
    return held


async def _release(fake_root: str, session: aiohttp.ClientSession) -> None:
    async with session.post(f"{fake_root}/fake/release") as reply:
        await reply.read()


def timed_burst(
    port: int, requests: list[bytes], brim: procs.Process | None = None
) -> tuple[list[tuple[float, Answer]], float, int]:
    """`requests` at once at `port`, each on a connection of its own opened beforehand, after
    one untimed round on the same connections (the figure is the server's answer, not TCP
    connects or first-use paths): each reply and its time, the CPU milliseconds `brim` used in
    the timed round, and its descriptor count then."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in requests]
    try:
        raw_burst(socks, requests)
        fds = brim.fds() if brim else 0
        cpu_before = brim.cpu_s() if brim else 0.0
        answers = raw_burst(socks, requests)
        cpu_ms = ((brim.cpu_s() - cpu_before) if brim else 0.0) * 1000
    finally:
        for sock in socks:
            sock.close()
    return answers, cpu_ms, fds


async def saturation(
    brim: procs.Process, fake: procs.Process, held: int, bursts: tuple[int, ...]
) -> dict[str, Any]:
    root, fake_root = brim.url.removesuffix("/v1"), fake.url.removesuffix("/v1")
    port, fake_port = int(root.rsplit(":", 1)[1]), int(fake_root.rsplit(":", 1)[1])
    # Warm up (brim's pooled upstream connections for `held` streams), then the baseline.
    async with aiohttp.ClientSession() as session:
        warm = await _held_streams(root, fake_root, session, held)
        await _release(fake_root, session)
        await asyncio.gather(*warm)
    baseline = await settled_fds(brim, None, 10)

    apis = list(WIRE)
    figures: dict[str, Any] = {}
    peak = 0
    async with aiohttp.ClientSession() as session:
        streams = await _held_streams(root, fake_root, session, held)
        for burst in bursts:
            # The same burst at the fake provider, which answers each at once: the floor of
            # this client, the loopback and an aiohttp server, with none of brim's work.
            floor, _, _ = timed_burst(fake_port, [request_bytes(*WIRE["chat"])] * burst)
            await asyncio.sleep(0.5)  # the fake provider's closing connections out of the way
            requests = [request_bytes(*WIRE[apis[i % len(apis)]]) for i in range(burst)]
            answers, cpu_ms, fds = timed_burst(port, requests, brim)
            peak = max(peak, fds)
            await asyncio.sleep(0.5)
            statuses: dict[str, int] = {}
            for _, answer in answers:
                statuses[str(answer.status)] = statuses.get(str(answer.status), 0) + 1
            shed = ms([took for took, _ in answers])
            figures[str(burst)] = {
                "statuses": statuses,
                "shed": shed,
                "floor_at_fake_provider": ms([took for took, _ in floor]),
                "all_retry_after": all(a.headers.get("retry-after") == "1" for _, a in answers),
                "all_in_wire_format": all(
                    a.status == 503 and overloaded_shape(apis[i % len(apis)], a.body)
                    for i, (_, a) in enumerate(answers)
                ),
                "brim_cpu_ms": round(cpu_ms),  # in clock ticks: 10 ms steps
                "met": shed["p99_ms"] is not None and shed["p99_ms"] < SHED_P99_MS,
            }
        await _release(fake_root, session)
        done = await asyncio.gather(*streams)
    returned_s = time.monotonic()
    after = await settled_fds(brim, baseline, 10)
    returned_s = time.monotonic() - returned_s
    return {
        "max_in_flight": held,
        "held_streams": held,
        "bursts": figures,
        "held_completed": sum(status == 200 and b"[DONE]" in body for status, body in done),
        "fds": {"baseline": baseline, "peak": peak, "after": after},
        "fds_returned_s": round(returned_s, 2),
        "target_p99_ms": SHED_P99_MS,
        "met": all(burst["met"] for burst in figures.values()),
    }


# --- slow loris -----------------------------------------------------------------------------


def raise_nofile(want: int) -> int:
    """Raise this process's soft limit on open files toward `want`, as far as the hard limit
    allows; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def loris(port: int, connections: int, limit_s: float) -> dict[str, Any]:
    """Open `connections` that each send half a request and then nothing: for each, the time
    from its connect completing to brim closing it, and whether brim said 408. A plain selector
    loop over non-blocking sockets, so that each time is taken within moments of the event."""
    selector = selectors.DefaultSelector()
    began: dict[int, float] = {}
    connected: dict[int, float] = {}
    said: dict[int, bytes] = {}
    connect_s: list[float] = []
    closed_s: list[float] = []
    errors: dict[str, int] = {}
    said_408 = 0
    socks: list[socket.socket] = []
    pending = connections
    deadline = time.monotonic() + limit_s + 30
    while pending and time.monotonic() < deadline:
        # A few more connects at a time between looking at events, so that no event waits
        # long for this loop to get to it.
        for index in range(len(socks), min(connections, len(socks) + CONNECT_BATCH)):
            sock = socket.socket()
            sock.setblocking(False)
            began[index] = time.monotonic()
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
            selector.register(sock, selectors.EVENT_WRITE, index)
        for key, _ in selector.select(0 if len(socks) < connections else 0.5):
            index, sock = key.data, socks[key.data]
            now = time.monotonic()
            if index not in connected:  # writable: the connect is done, or failed
                failure = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if failure:
                    name = os.strerror(failure)
                    errors[name] = errors.get(name, 0) + 1
                    selector.unregister(sock)
                    pending -= 1
                    continue
                connected[index] = now
                connect_s.append(now - began[index])
                sock.send(PARTIAL)
                said[index] = b""
                selector.modify(sock, selectors.EVENT_READ, index)
                continue
            try:
                chunk = sock.recv(4096)
            except OSError:  # a reset: closed too
                chunk = b""
            if chunk:
                said[index] += chunk
                if now - connected[index] < limit_s:
                    continue
            else:
                closed_s.append(now - connected[index])
                said_408 += said[index].startswith(b"HTTP/1.1 408 ")
            selector.unregister(sock)
            pending -= 1
    selector.close()
    for sock in socks:
        sock.close()
    return {
        "closed_s": closed_s,
        "connect_s": connect_s,
        "said_408": said_408,
        "never_closed": len(connected) - len(closed_s),
        "connect_errors": errors,
    }


def loris_client(port: int, connections: int, limit_s: float) -> None:
    """The child process's side: says "ready" on stdout, opens the connections, then prints
    what it saw as JSON."""
    soft = raise_nofile(connections + 256)
    print("ready", soft, flush=True)
    result = loris(port, connections, limit_s)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


def _metric(text: str, name: str, label: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and label in line
    )


async def slow_loris(brim: procs.Process, connections: int, timeout_s: float) -> dict[str, Any]:
    root = brim.url.removesuffix("/v1")
    port = int(root.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as session:  # brim's pooled upstream connection
        path, body = WIRE["chat"]
        async with session.post(root + path, data=body, headers=JSON) as reply:
            await reply.read()
    baseline = await settled_fds(brim, None, 10)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.hostile",
        "--loris-client",
        str(port),
        str(connections),
        str(timeout_s + 5),
        stdout=asyncio.subprocess.PIPE,
        cwd=procs.ROOT,
        env={**os.environ, "PYTHONPATH": procs.import_path(procs.ROOT)},
    )
    assert child.stdout is not None
    ready = (await child.stdout.readline()).split()
    if not ready or ready[0] != b"ready":
        raise RuntimeError(f"the loris client did not start: {ready!r}")
    result_text = asyncio.ensure_future(child.stdout.read())  # to its end
    probes: list[float] = []
    probe_errors = 0
    peak = 0
    # Normal requests meanwhile, each on a new connection, until the loris client is done.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        while not result_text.done():
            peak = max(peak, brim.fds())
            started = time.perf_counter()
            try:
                path, body = WIRE["chat"]
                async with session.post(root + path, data=body, headers=JSON) as reply:
                    await reply.read()
                    ok = reply.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                probes.append(time.perf_counter() - started)
            else:
                probe_errors += 1
            await asyncio.sleep(0.02)
        async with session.get(f"{root}/metrics") as reply:
            metrics = await reply.text()
    seen = orjson.loads(await result_text)
    await child.wait()
    after = await settled_fds(brim, baseline, 10)
    closed = seen["closed_s"]
    bound = timeout_s + LORIS_SLACK_S
    return {
        "connections": connections,
        "client_nofile": int(ready[1]),
        "header_timeout_s": timeout_s,
        "connected": len(seen["connect_s"]),
        "connect_errors": seen["connect_errors"],
        "connect_s": {
            "p50": round(percentile(seen["connect_s"], 0.5), 3) if seen["connect_s"] else None,
            "max": round(max(seen["connect_s"]), 3) if seen["connect_s"] else None,
        },
        "closed_s": {
            "n": len(closed),
            "min": round(min(closed), 3) if closed else None,
            "p50": round(percentile(closed, 0.5), 3) if closed else None,
            "p99": round(percentile(closed, 0.99), 3) if closed else None,
            "max": round(max(closed), 3) if closed else None,
        },
        "got_408": seen["said_408"],
        "never_closed": seen["never_closed"],
        "counted_header_timeouts": int(
            _metric(metrics, "brim_connections_closed_total", 'reason="header_timeout"')
        ),
        "probes": {**ms(probes), "errors": probe_errors},
        "fds": {"baseline": baseline, "peak": peak, "after": after},
        "target_s": bound,
        "met": bool(closed)
        and max(closed) <= bound
        and len(closed) == connections
        and bool(probes)
        and max(probes) * 1000 < PROBE_MAX_MS,
    }


# --- large bodies ---------------------------------------------------------------------------


async def large_bodies(
    brim: procs.Process, count: int, body_mb: int, buffer_mb: int
) -> dict[str, Any]:
    root = brim.url.removesuffix("/v1")
    async with aiohttp.ClientSession() as session:
        path, body = WIRE["chat"]
        async with session.post(root + path, data=body, headers=JSON) as reply:
            await reply.read()
    idle = brim.rss_peak_mb()
    text = "word " * (body_mb * 1024 * 1024 // 5)
    payload = orjson.dumps({"model": "big", "messages": [{"role": "user", "content": text}]})
    del text
    timeout = aiohttp.ClientTimeout(total=600)
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> tuple[int, str | None, bytes]:
            async with session.post(root + path, data=payload, headers=JSON) as reply:
                return reply.status, reply.headers.get("retry-after"), await reply.read()

        answers = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    wall = time.monotonic() - started
    peak = brim.rss_peak_mb()
    served = sum(1 for a in answers if isinstance(a, tuple) and a[0] == 200)
    shed = sum(
        1
        for a in answers
        if isinstance(a, tuple) and a[0] == 503 and a[1] and b"max_body_buffer_mb" in a[2]
    )
    bound = idle + BODY_FACTOR * buffer_mb
    return {
        "bodies": count,
        "body_mb": body_mb,
        "max_body_buffer_mb": buffer_mb,
        "served_200": served,
        "shed_503": shed,  # no room within the 5 s a body may wait: 503 with retry-after
        "other": [
            a[0] if isinstance(a, tuple) else type(a).__name__
            for a in answers
            if not (isinstance(a, tuple) and a[0] in (200, 503))
        ],
        "seconds": round(wall, 1),
        "rss_mb": {"idle_peak": round(idle, 1), "peak": round(peak, 1), "bound": round(bound)},
        "peak_over_idle_mb": round(peak - idle, 1),
        "met": peak < bound,
    }


# --- running them ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    bursts: tuple[int, ...]  # requests in each saturating burst
    loris: int  # half-open connections
    bodies: int  # large bodies at once
    body_mb: int  # the size of each
    buffer_mb: int  # max_body_buffer_mb


SIZES = {
    False: Size(bursts=(100, 500), loris=3_000, bodies=8, body_mb=30, buffer_mb=31),
    True: Size(bursts=(50,), loris=300, bodies=2, body_mb=4, buffer_mb=5),
}


def run(quick: bool) -> dict[str, Any]:
    """Every scenario, each against a brim of its own; the figures."""
    size = SIZES[quick]
    raise_nofile(4 * max(size.bursts) + 256)  # both ends of each burst connection
    folder = Path(tempfile.mkdtemp(prefix="brim-hostile-"))
    configs: dict[str, dict[str, float]] = {
        "saturation": {"max_in_flight": 4},
        "slow_loris": {"header_timeout_s": 1, "max_connections": size.loris + 500},
        "large_bodies": {"max_body_buffer_mb": size.buffer_mb, "max_body_mb": size.body_mb + 10},
    }
    report: dict[str, Any] = {"quick": quick}
    fake = procs.start_fake()
    brims: list[procs.Process] = []
    try:
        # Started together (each idles until its turn): seconds saved.
        with ThreadPoolExecutor(len(configs)) as pool:
            starting = [
                pool.submit(procs.start_brim, fake.url, folder, server=server, extra=EXTRA)
                for server in configs.values()
            ]
            brims = [future.result() for future in starting if future.exception() is None]
            for future in starting:
                future.result()  # raises the first start-up failure
        saturated, lorised, bodied = brims
        report["saturation"] = asyncio.run(saturation(saturated, fake, 4, size.bursts))
        report["slow_loris"] = asyncio.run(slow_loris(lorised, size.loris, 1.0))
        report["large_bodies"] = asyncio.run(
            large_bodies(bodied, size.bodies, size.body_mb, size.buffer_mb)
        )
    finally:
        for brim in brims:  # measured already: no need to wait for a graceful stop
            brim.popen.kill()
            brim.popen.wait()
        fake.stop()
    report["problems"] = problems(report)
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What went wrong in behaviour (not timing)."""
    found = []
    shed = report["saturation"]
    for burst, figures in shed["bursts"].items():
        if figures["statuses"] != {"503": int(burst)}:
            found.append(f"saturation: a burst of {burst} got {figures['statuses']}, not 503s")
        if not figures["all_retry_after"] or not figures["all_in_wire_format"]:
            found.append("saturation: a 503 without retry-after or not in its API's shape")
    if shed["held_completed"] != shed["held_streams"]:
        found.append("saturation: a held stream did not complete")
    if shed["fds"]["after"] > shed["fds"]["baseline"]:
        found.append(f"saturation: brim's descriptors did not come back: {shed['fds']}")
    loris = report["slow_loris"]
    if loris["never_closed"] or loris["connected"] != loris["connections"]:
        found.append(
            f"slow loris: {loris['never_closed']} never closed, "
            f"{loris['connected']} of {loris['connections']} connected"
        )
    if loris["got_408"] != loris["connected"] or loris["probes"]["errors"]:
        found.append(
            f"slow loris: {loris['got_408']} 408s, {loris['probes']['errors']} failed probes"
        )
    if loris["fds"]["after"] > loris["fds"]["baseline"]:
        found.append(f"slow loris: brim's descriptors did not come back: {loris['fds']}")
    bodies = report["large_bodies"]
    if bodies["served_200"] + bodies["shed_503"] != bodies["bodies"] or not bodies["served_200"]:
        found.append(f"large bodies: {bodies['served_200']} × 200, {bodies['shed_503']} × 503")
    return found


def render(report: dict[str, Any]) -> list[str]:
    shed, loris, bodies = report["saturation"], report["slow_loris"], report["large_bodies"]
    closed, fds = loris["closed_s"], shed["fds"]
    return [
        "hostile clients (each against a brim process of its own; the load from other processes):",
        f"  saturation: max_in_flight {shed['max_in_flight']}, held by as many streams; "
        f"held streams completed {shed['held_completed']}/{shed['held_streams']}; brim's "
        f"descriptors {fds['baseline']} → {fds['peak']} → {fds['after']}",
        *(
            f"    a burst of {burst}: {f['statuses']}, 503s p50 / p99 / max {f['shed']['p50_ms']}"
            f" / {f['shed']['p99_ms']} / {f['shed']['max_ms']} ms (target p99 < "
            f"{shed['target_p99_ms']:g} ms; the same burst at the fake provider: "
            f"{f['floor_at_fake_provider']['p50_ms']} / {f['floor_at_fake_provider']['p99_ms']}"
            f" ms), retry-after on all: {_yes(f['all_retry_after'])}, in each API's shape: "
            f"{_yes(f['all_in_wire_format'])}, brim CPU {f['brim_cpu_ms']} ms"
            for burst, f in shed["bursts"].items()
        ),
        f"  slow loris: {loris['connections']} half-open connections, header_timeout_s "
        f"{loris['header_timeout_s']:g}: connect → close p50 / p99 / max {closed['p50']} / "
        f"{closed['p99']} / {closed['max']} s (target ≤ {loris['target_s']:g} s), 408s "
        f"{loris['got_408']}, never closed {loris['never_closed']}; normal requests meanwhile "
        f"p50 / max {loris['probes']['p50_ms']} / {loris['probes']['max_ms']} ms "
        f"({loris['probes']['n']}, {loris['probes']['errors']} failed)",
        f"  large bodies: {bodies['bodies']} × {bodies['body_mb']} MB at once, max_body_buffer_mb "
        f"{bodies['max_body_buffer_mb']}: {bodies['served_200']} × 200, {bodies['shed_503']} × "
        f"503 in {bodies['seconds']} s; brim's peak RSS {bodies['rss_mb']['peak']} MB (idle "
        f"{bodies['rss_mb']['idle_peak']}, bound {bodies['rss_mb']['bound']})",
        *(f"  PROBLEM: {problem}" for problem in report["problems"]),
    ]


def _yes(value: bool) -> str:
    return "yes" if value else "NO"


def _uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hostile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--out", default="bench/results/hostile.json", help="where the JSON goes")
    parser.add_argument("--loris-client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loris_client:
        port, connections, limit_s = args.loris_client
        loris_client(int(port), int(connections), float(limit_s))
        return 0
    _uvloop()
    report = run(args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print("\n".join(render(report)))
    print(f"\nfull results: {out}")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
