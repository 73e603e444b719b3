"""Turning an `UpstreamResponse` into the client's reply, streaming as the bytes arrive (whole
events: an event split across reads is passed on once its end is in)."""

from __future__ import annotations

import logging

from aiohttp import web

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import UpstreamFailure
from brim.adapters.forwarded_headers import client_response_headers
from brim.policies.wires.base import Wire

log = logging.getLogger("brim.relay")

# Where a server-sent event ends: a line ending followed by an empty line (LF, CRLF or CR).
EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r\n")
MAX_HELD = 1024 * 1024


class EventCut:
    """Holds back the unfinished tail of a stream until its event is complete, so that an error
    event is never glued onto half an event (a client cannot read half an event anyway)."""

    def __init__(self) -> None:
        self.held = b""
        self.last = b""  # the last complete events passed on
        self.clean = True  # everything passed on ended at an event boundary

    def complete(self, chunk: bytes) -> bytes:
        """What of the stream so far can go to the client now."""
        data = self.held + chunk if self.held else chunk
        boundary = True
        if data.endswith(EVENT_ENDS):
            end = len(data)
        else:
            end, start = 0, max(0, len(self.held) - 3)
            for sep in EVENT_ENDS:
                at = data.rfind(sep, start)
                if at >= 0:
                    end = max(end, at + len(sep))
            if len(data) - end > MAX_HELD:  # not event-shaped after all: pass it on as it is
                end, boundary = len(data), False
        ready, self.held = data[:end], data[end:]
        if ready:
            self.last, self.clean = ready, boundary
        return ready

    def error(self, exc: UpstreamFailure, wire: Wire) -> bytes:
        """The error event, in place of whatever unfinished event was held back, in the shape
        `wire`'s SDKs read as an error."""
        self.held = b""
        prefix = b"" if self.clean else b"\n\n"
        return prefix + wire.stream_error(exc.info(), self.last)


async def relay(
    request: web.Request,
    reply: UpstreamResponse,
    extra_headers: dict[str, str],
    *,
    wire: Wire,
) -> web.StreamResponse:
    """Relay `reply` to the client that spoke `wire`'s API; a stream that breaks off ends with an
    error event in that API's shape."""
    headers = client_response_headers(reply.headers)
    headers.update(extra_headers)
    if reply.chunks is None:
        return web.Response(status=reply.status, body=reply.body, headers=headers)

    response = web.StreamResponse(status=reply.status, headers=headers)
    cut = EventCut()
    try:
        await response.prepare(request)
        try:
            async for chunk in reply.chunks:
                ready = cut.complete(chunk)
                if ready:
                    await response.write(ready)
            if cut.held:  # the provider ended inside an event: relay what it sent
                await response.write(cut.held)
        except UpstreamFailure as exc:
            # Headers are gone already: tell the client in-stream, the way providers do.
            log.warning("stream from %s broke off: %s", exc.upstream, exc.message)
            await response.write(cut.error(exc, wire))
        await response.write_eof()
    except ConnectionResetError:
        log.info("client went away mid-stream; closing the upstream request")
    finally:
        # Runs on normal end, on client disconnect and on handler cancellation alike.
        await reply.aclose()
    return response
