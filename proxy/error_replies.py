"""Rendering any error as the client's reply, in its own wire format (the errors themselves are
one tree, in `adapters.errors`)."""

from __future__ import annotations

from aiohttp import web

from brim.adapters.errors import BrimError, ContextOverflow, UpstreamError, UpstreamProtocolError
from brim.adapters.forwarded_headers import client_response_headers
from brim.policies.wires.base import Wire


def _empty_stream(exc: ContextOverflow) -> UpstreamProtocolError:
    """A 200 stream that ended before any event (llama.cpp's answer to an over-long prompt),
    still empty after any retries: relaying it would give the client a success with nothing in
    it, so it becomes a 502 that says what happened."""
    retries = int(exc.brim_headers.get("x-brim-retries", "0"))
    tried = (
        f"; it still did after brim cut the request and retried {retries} times" if retries else ""
    )
    error = UpstreamProtocolError(
        f"upstream {exc.upstream!r} answered with an empty stream, which is how llama.cpp's "
        f"server reports a prompt longer than its context{tried}.",
        upstream=exc.upstream,
    )
    error.brim_headers = exc.brim_headers
    return error


def error_response(exc: BrimError, headers: dict[str, str], wire: Wire) -> web.Response:
    """The client-facing reply for `exc`, in `wire`'s format. A provider's own error reply is
    relayed unchanged."""
    extra = {**headers, **exc.brim_headers}
    if isinstance(exc, ContextOverflow) and exc.overflow.empty_stream:
        exc = _empty_stream(exc)
    if isinstance(exc, UpstreamError):
        relayed = client_response_headers(exc.headers)
        relayed.update(extra)
        return web.Response(status=exc.status, body=exc.body, headers=relayed)
    return web.Response(
        status=exc.status,
        body=wire.error_body(exc.info()),
        content_type="application/json",
        headers=extra,
    )
