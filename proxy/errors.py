"""brim's own answers to bad requests, and rendering any error in the client's wire format."""

from __future__ import annotations

from typing import Literal

import orjson
from aiohttp import web

from adapters.errors import (
    BrimError,
    ContextOverflow,
    ContextTooLarge,
    UpstreamError,
    UpstreamProtocolError,
)
from adapters.headers import client_response_headers


class InvalidRequest(BrimError):
    status = 400
    error_type = "invalid_request_error"


class PayloadTooLarge(BrimError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class Unauthorized(BrimError):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class UnknownEndpoint(BrimError):
    status = 404
    error_type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(BrimError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class HeadersTooLarge(BrimError):
    status = 431
    error_type = "invalid_request_error"
    code = "request_header_too_large"


class InternalError(BrimError):
    status = 500
    error_type = "server_error"
    code = "internal_error"


def openai_error(exc: BrimError) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": exc.message,
                "type": exc.error_type,
                "param": exc.param,
                "code": exc.code,
            }
        }
    )


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "invalid_request_error",
    529: "overloaded_error",
}


def anthropic_error(exc: BrimError) -> bytes:
    message = exc.anthropic_message if isinstance(exc, ContextTooLarge) else exc.message
    kind = ANTHROPIC_TYPES.get(exc.status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


# Google's error statuses by HTTP status, for Gemini clients.
GEMINI_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def gemini_error(exc: BrimError) -> bytes:
    message = exc.gemini_message if isinstance(exc, ContextTooLarge) else exc.message
    status = GEMINI_STATUSES.get(exc.status, "INTERNAL")
    return orjson.dumps({"error": {"code": exc.status, "message": message, "status": status}})


Wire = Literal["openai", "anthropic", "gemini"]


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


def error_response(
    exc: BrimError, headers: dict[str, str] | None = None, wire: Wire = "openai"
) -> web.Response:
    """The client-facing reply for `exc`, in the client's wire format. A provider's own error
    reply is relayed unchanged."""
    extra = {**(headers or {}), **exc.brim_headers}
    if isinstance(exc, ContextOverflow) and exc.overflow.empty_stream:
        exc = _empty_stream(exc)
    if isinstance(exc, UpstreamError):
        relayed = client_response_headers(exc.headers)
        relayed.update(extra)
        return web.Response(status=exc.status, body=exc.body, headers=relayed)
    render = {"anthropic": anthropic_error, "gemini": gemini_error}.get(wire, openai_error)
    body = render(exc)
    return web.Response(
        status=exc.status, body=body, content_type="application/json", headers=extra
    )
