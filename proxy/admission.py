"""What brim lets in, against hostile and heavy clients (`[server]`):

- read timeouts. `header_timeout_s` bounds the request line and headers: from the connection's
  first moment for its first request, from the first byte of each next one on a kept-alive
  connection (an idle kept-alive connection is closed by aiohttp's keep-alive timeout, as
  before). A connection that misses it gets a bare `408` and is closed. `body_timeout_s` bounds
  reading the body (`read_body`): a 408 in the client's wire format, then the connection closes.
- `max_connections`: open client connections; one more is answered a bare `503` and closed at
  once, before anything is read from it.
- `max_in_flight`: requests being handled (streams until they end); one more is answered 503 in
  the client's wire format with `retry-after`, at once (`admit`).
- `max_body_buffer_mb`: request bodies held in memory at once, across all requests, from when a
  body is read until its request is done. A body that does not fit waits up to
  `BODY_QUEUE_S` for room (meanwhile it stays in the kernel's socket buffer), then gets a 503.
  A compressed body holds room for what was sent and then for each piece it decodes to.
- `quota_for`: whom a request counts against for `requests_per_minute` / `tokens_per_minute`
  (`middleware.stages.ratelimit` counts).

The connection-level parts live in `GuardedHandler`, a subclass of aiohttp's `RequestHandler`
that `BrimRunner` makes the protocol of every connection (aiohttp itself has no header or body
read timeout); every refusal is counted in the `brim_connections_closed` and
`brim_requests_shed` metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import resource
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from brim.adapters.errors import Overloaded, PayloadTooLarge, RequestTimeout
from brim.adapters.exchange import Quota
from brim.middleware.services.instruments import Telemetry
from brim.proxy.config import KeyLimits, ServerConfig
from brim.proxy.decoding import Inflater, content_coding

log = logging.getLogger("brim.admission")

BODY_QUEUE_S = 5.0  # the longest a body waits for room under max_body_buffer_mb
READ_CHUNK = 256 * 1024
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)
UNGUARDED = frozenset({"/", "/healthz", "/readyz", "/metrics"})  # answered even when saturated


class BytesGate:
    """A counting semaphore over bytes, first come first served."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int, timeout_s: float) -> int:
        """Take `size` bytes (at most the whole capacity), waiting up to `timeout_s`; the
        amount taken, to give back with `release`. `TimeoutError` if there was no room."""
        size = min(size, self.capacity)
        if not self._waiters and self.used + size <= self.capacity:
            self.used += size
            return size
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted as the wait ran out: give it back
            else:
                # Not there when `_wake` came to it after it was cancelled, and passed it by.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._wake()
            raise
        return size

    def release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            size, waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += size
                waiter.set_result(None)


class Admission:
    """One app's counts of what it lets in, and its limits (module doc)."""

    def __init__(self, server: ServerConfig, telemetry: Telemetry) -> None:
        self.header_timeout_s = server.header_timeout_s
        self.body_timeout_s = server.body_timeout_s
        self.max_connections = server.max_connections
        self.max_in_flight = server.max_in_flight
        self.bodies = BytesGate(server.max_body_buffer_bytes)
        self.max_decompression_ratio = server.max_decompression_ratio
        self.telemetry = telemetry
        self.overrides = key_overrides(server)  # [server.key_limits] by holder
        self.rate_limited = server.rate_limited  # read by every request (`quota_for`)
        self.connections = 0
        self.in_flight = 0
        telemetry.watch_load(lambda: self.connections, lambda: self.in_flight)

    def closed(self, reason: str) -> None:
        self.telemetry.connections_closed.add(1, {"reason": reason})

    def shed(self, reason: str) -> None:
        self.telemetry.shed.add(1, {"reason": reason})


ADMISSION = web.AppKey("admission", Admission)
BODY_BYTES = web.RequestKey("body_bytes", int)  # held in `Admission.bodies` for this request


class GuardedHandler(RequestHandler):
    """aiohttp's connection protocol with `max_connections` and the header timeout."""

    def __init__(self, manager: Server, *, admission: Admission, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._admission = admission
        self._counted = False
        self._busy = False  # a request's headers are in; it is being read or answered
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        admission = self._admission
        if admission.connections >= admission.max_connections:
            admission.closed("max_connections")
            self._manager = None  # never registered: aiohttp has nothing to undo
            assert isinstance(transport, asyncio.Transport)
            transport.write(TOO_MANY)
            transport.close()
            return
        admission.connections += 1
        self._counted = True
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._admission.connections -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a request's headers are complete
            self._busy = True
            self._disarm()
        elif data and not self._busy and self._header_deadline is None:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._handle_request(*args, **kwargs)
        finally:
            self._busy = bool(self._messages)  # more pipelined requests are in already

    def _arm(self) -> None:
        self._header_deadline = self._loop.call_later(
            self._admission.header_timeout_s, self._headers_late
        )

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self._busy or self.transport is None or self._force_close:
            return
        self._admission.closed("header_timeout")
        self.transport.write(TIMED_OUT)
        self.force_close()


class GuardedServer(Server):
    """aiohttp's `Server`, making `GuardedHandler`s."""

    def __init__(self, plain: Server, admission: Admission) -> None:
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        self.admission = admission

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, admission=self.admission, loop=self._loop, **self._kwargs)


class BrimRunner(web.AppRunner):
    """An `AppRunner` whose connections are `GuardedHandler`s."""

    async def _make_server(self) -> Server:
        plain = await super()._make_server()
        return GuardedServer(plain, self.app[ADMISSION])


def admit(request: web.Request, gate: Admission) -> None:
    """Count one more request being handled, or refuse it past `max_in_flight` (503, in the
    client's wire format, by the caller: `proxy.app`'s `front_door`); `release` when done."""
    if gate.in_flight >= gate.max_in_flight:
        gate.shed("max_in_flight")
        busy = Overloaded(
            f"brim is handling {gate.in_flight} requests, its limit (server.max_in_flight); "
            "retry shortly."
        )
        busy.brim_headers["retry-after"] = "1"
        raise busy
    gate.in_flight += 1
    request[BODY_BYTES] = 0  # none held yet (`read_body`); set here, read without a default


def release(request: web.Request, gate: Admission) -> None:
    """A request admitted by `admit` is done: give back its place and the body bytes it held
    (`read_body`)."""
    gate.in_flight -= 1
    if held := request[BODY_BYTES]:
        gate.bodies.release(held)


async def _hold(request: web.Request, gate: Admission, size: int) -> None:
    """Room for `size` more bytes of this request's body; a body larger than the whole buffer
    takes all of it (then it is the only one held), never more."""
    size = min(size, gate.bodies.capacity - request[BODY_BYTES])
    if size <= 0:
        return
    try:
        taken = await gate.bodies.acquire(size, min(BODY_QUEUE_S, gate.body_timeout_s))
    except TimeoutError:
        gate.shed("max_body_buffer_mb")
        busy = Overloaded(
            "brim is holding as many request bodies in memory as it may "
            "(server.max_body_buffer_mb); retry shortly."
        )
        busy.brim_headers["retry-after"] = "1"
        raise busy from None
    request[BODY_BYTES] += taken  # set by `admit`


async def read_body(request: web.Request, limit: int, gate: Admission) -> bytes:
    """The whole body, within `body_timeout_s` and room under `max_body_buffer_mb` (the caller
    has refused a declared length over `limit`; aiohttp enforces it on the rest), decoded when
    it was sent compressed (`proxy.decoding`): each decoded piece takes its room too, and the
    decoded body is held to `limit`."""
    coding = content_coding(request)  # before a byte is read: a coding brim does not take
    raw = await _read_raw(request, limit, gate)
    if coding is None:
        return raw
    parts: list[bytes] = []
    for piece in Inflater(coding, limit, gate.max_decompression_ratio).pieces(raw):
        await _hold(request, gate, len(piece))
        parts.append(piece)
    return b"".join(parts)


async def _read_raw(request: web.Request, limit: int, gate: Admission) -> bytes:
    """The body as it was sent (`read_body`)."""
    declared = request.content_length
    if declared is not None:
        await _hold(request, gate, declared)
        if request.content.is_eof():  # all of it is in already: nothing to time
            return await request.read()
    try:
        async with asyncio.timeout(gate.body_timeout_s):
            if declared is not None:
                return await request.read()
            parts: list[bytes] = []  # chunked: hold room as it arrives
            size = 0
            while chunk := await request.content.read(READ_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"The request body exceeds this brim's limit of {limit} bytes "
                        "(server.max_body_mb)."
                    )
                await _hold(request, gate, len(chunk))
                parts.append(chunk)
            return b"".join(parts)
    except TimeoutError:
        gate.closed("body_timeout")
        raise RequestTimeout(
            f"The request body did not arrive within {gate.body_timeout_s:g} s "
            "(server.body_timeout_s); brim closes the connection."
        ) from None


def holder(kind: str, value: str) -> str:
    """The rate limiter's name for a client: a hash, so neither keys nor addresses are kept."""
    return hashlib.blake2b(f"{kind}:{value}".encode(), digest_size=16).hexdigest()


QUOTA_HOLDER = web.RequestKey("quota_holder", str)  # set where the brim key was checked


def quota_for(request: web.Request, server: ServerConfig, gate: Admission) -> Quota | None:
    """Whom this request counts against, and their limits; None without rate limits."""
    if not gate.rate_limited:
        return None
    who = request.get(QUOTA_HOLDER) or holder("address", request.remote or "")
    override = gate.overrides.get(who)
    if override is None:
        return Quota(who, server.requests_per_minute, server.tokens_per_minute)
    return Quota(
        who,
        override.requests_per_minute or server.requests_per_minute,
        override.tokens_per_minute or server.tokens_per_minute,
    )


def key_overrides(server: ServerConfig) -> dict[str, KeyLimits]:
    """`[server.key_limits]` by holder."""
    return {
        holder("key", limits.key.get_secret_value()): limits
        for limits in server.key_limits.values()
        if limits.key is not None
    }


def raise_descriptor_limit(max_connections: int) -> None:
    """Raise the soft limit on open files toward what `max_connections` needs (each client
    connection may also hold one upstream connection), as far as the hard limit allows."""
    want = 2 * max_connections + 256
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            target = want if hard == resource.RLIM_INFINITY else min(want, hard)
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except (OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "server.max_connections = %d needs about %d file descriptors; this process may "
            "open %d (ulimit -n): lower max_connections or raise the limit",
            max_connections,
            want,
            soft,
        )
