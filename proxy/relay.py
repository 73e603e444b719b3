"""Turning an `UpstreamResponse` into the client's reply, streaming chunk by chunk."""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from adapters.base import UpstreamResponse
from adapters.errors import UpstreamFailure
from adapters.headers import client_response_headers

log = logging.getLogger("brim.relay")


def _sse_error(exc: UpstreamFailure) -> bytes:
    error = {"message": exc.message, "type": exc.error_type, "param": None, "code": exc.code}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


async def relay(
    request: web.Request, reply: UpstreamResponse, extra_headers: dict[str, str]
) -> web.StreamResponse:
    headers = client_response_headers(reply.headers)
    headers.update(extra_headers)
    if reply.chunks is None:
        return web.Response(status=reply.status, body=reply.body, headers=headers)

    response = web.StreamResponse(status=reply.status, headers=headers)
    try:
        await response.prepare(request)
        try:
            async for chunk in reply.chunks:
                await response.write(chunk)
        except UpstreamFailure as exc:
            # Headers are gone already: tell the client in-stream, the way providers do.
            log.warning("stream from %s broke off: %s", exc.upstream, exc.message)
            await response.write(_sse_error(exc))
        await response.write_eof()
    except ConnectionResetError:
        log.info("client went away mid-stream; closing the upstream request")
    finally:
        # Runs on normal end, on client disconnect and on handler cancellation alike.
        await reply.aclose()
    return response
