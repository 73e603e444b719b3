"""brim's own answers to bad requests, and rendering any error in the client's wire format."""

from __future__ import annotations

import orjson
from aiohttp import web

from adapters.errors import BrimError, UpstreamError
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


def error_response(exc: BrimError, headers: dict[str, str] | None = None) -> web.Response:
    """The client-facing reply for `exc`. A provider's own error reply is relayed unchanged."""
    extra = {**(headers or {}), **exc.brim_headers}
    if isinstance(exc, UpstreamError):
        relayed = client_response_headers(exc.headers)
        relayed.update(extra)
        return web.Response(status=exc.status, body=exc.body, headers=relayed)
    return web.Response(
        status=exc.status,
        body=openai_error(exc),
        content_type="application/json",
        headers=extra,
    )
