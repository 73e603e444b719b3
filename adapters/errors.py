"""Every failure brim answers with, as one exception tree. Every `BrimError` subclass in brim is
defined here.

    BrimError                      status, wire type and code, message: what the client is told
    ├── InvalidRequest             400: a body the client's API would refuse (the field named)
    ├── NothingLeftToSend          400: repair left no message (every one answered nothing)
    ├── ContextTooLarge            400 context_length_exceeded: brim could not make it fit; each
    │                              wire API words it its own way (`Refusal`)
    ├── Unauthorized               401: a brim or admin key is missing or wrong
    ├── AdminDisabled              403: /admin/* with no admin keys configured
    ├── ForeignOrigin              403: a web page of an origin not in `server.allowed_origins`
    ├── ForeignHost                403: a Host that is not brim's (DNS rebinding), while bound
    │                              to loopback or with `server.allowed_hosts` set
    ├── UnknownEndpoint            404: no such path (or the feature behind it is off)
    ├── NoRoute                    404 model_not_found: no `[routes]` entry serves the model
    ├── MethodNotAllowed           405
    ├── RequestTimeout             408: the body did not arrive within `server.body_timeout_s`
    │                              (the connection is closed after the answer)
    ├── PayloadTooLarge            413: the body is over `server.max_body_mb` (decoded, for a
    │                              compressed one) or decodes past `max_decompression_ratio`
    ├── UnsupportedMediaType       415: not a JSON body on a JSON route, or a Content-Encoding
    │                              brim does not decode
    ├── RepeatedFailure            429: the same request failed `loop_limit` times in a row
    ├── RateLimitExceeded          429: the client's key (or address) is past its
    │                              `requests_per_minute` or `tokens_per_minute`
    ├── HeadersTooLarge            431: a header line or the URL is over `server.max_header_kb`
    ├── InternalError              500: a bug in brim (logged with the request id)
    ├── Overloaded                 503: past `server.max_in_flight`, or too many large bodies
    │                              at once (`max_body_buffer_mb`); with `retry-after`
    └── UpstreamFailure            the provider could not give an answer; `upstream` names it
        ├── UpstreamUnreachable    502: connection refused, DNS or TLS failure, reset before
        │                          any answer
        ├── UpstreamTimeout        504: no answer (or no next chunk) within `timeout_s`, no
        │                          connection within `connect_timeout_s`, or the whole request
        │                          (stream included) longer than `max_duration_s`
        ├── UpstreamProtocolError  502: the provider's reply was cut off, an empty stream, or a
        │                          success whose body is not JSON (named by type and size,
        │                          never echoed)
        └── UpstreamError          the provider answered 4xx/5xx; `status`, `headers` and
            │                      `body` are its own and are relayed to the client unchanged
            ├── AuthFailed         401 / 403
            ├── RateLimited        429
            └── ContextOverflow    the request was too long for the model (any provider's
                                   wording, HTTP 413, or an error as the first event of a
                                   200 stream); `limit` / `requested` when the text states them

Adapters raise only the `UpstreamFailure` branch (and `InvalidRequest` for a model name a CLI
cannot be given); `UpstreamError.from_reply` is the single place
that turns a provider's error reply into its class (`adapters.overflow` recognises overflows).
brim's own words about an upstream name it by its name in the config, never by its address: an
`UpstreamFailure`'s message goes through `hide_addresses` (an internal host and port is nobody's
business but the operator's, who finds it in the log).
The HTTP layer renders brim's own errors in the client's wire format (`info()` gives the wire
object what it needs), adding any `brim_headers` (e.g. `x-brim-retries`, `retry-after`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from brim.adapters.overflow import Overflow, classify
from brim.policies.wires.base import ErrorInfo, Refusal


class BrimError(Exception):
    status: int = 500
    error_type: str = "server_error"
    code: str | None = None
    # brim's own refusal by policy, made before the provider was asked: the request did not
    # fail, so the loop guard does not count it as a failure.
    brims_own_refusal: bool = False

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.brim_headers: dict[str, str] = {}

    def info(self) -> ErrorInfo:
        return ErrorInfo(self.status, self.error_type, self.message, self.code, self.param)


class InvalidRequest(BrimError):
    status = 400
    error_type = "invalid_request_error"


class NothingLeftToSend(BrimError):
    status = 400
    error_type = "invalid_request_error"


class Unauthorized(BrimError):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class AdminDisabled(BrimError):
    status = 403
    error_type = "permission_error"
    code = "admin_disabled"


class ForeignOrigin(BrimError):
    status = 403
    error_type = "permission_error"
    code = "origin_not_allowed"


class ForeignHost(BrimError):
    status = 403
    error_type = "permission_error"
    code = "host_not_allowed"


class UnknownEndpoint(BrimError):
    status = 404
    error_type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(BrimError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(BrimError):
    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(BrimError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(BrimError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_media_type"


class RepeatedFailure(BrimError):
    status = 429
    error_type = "rate_limit_error"
    code = "brim_repeated_failure"


class RateLimitExceeded(BrimError):
    """OpenAI's shape: the type names the limit that tripped (`requests` or `tokens`)."""

    status = 429
    error_type = "requests"
    code = "rate_limit_exceeded"
    brims_own_refusal = True


class HeadersTooLarge(BrimError):
    status = 431
    error_type = "invalid_request_error"
    code = "request_header_too_large"


class InternalError(BrimError):
    status = 500
    error_type = "server_error"
    code = "internal_error"


class Overloaded(BrimError):
    status = 503
    error_type = "server_error"
    code = "overloaded"


class NoRoute(BrimError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ContextTooLarge(BrimError):
    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(self, refusal: Refusal, *, param: str | None = None) -> None:
        super().__init__(refusal.openai_message(), param=param)
        self.refusal = refusal

    def info(self) -> ErrorInfo:
        return ErrorInfo(
            self.status, self.error_type, self.message, self.code, self.param, self.refusal
        )


# Network addresses in text: URLs, Python's ('host', port), [IPv6]:port, IPv4[:port], host:port
# (a host with a letter in it: "12:30" is a time).
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{}]+"
    r"|\(\s*'[^']*'\s*,\s*\d+[^)]*\)"
    r"|\[[0-9a-f:.]+\](?::\d+)?"
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"
    r"|\b(?=[\w.-]*[a-z])[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?:\d{1,5}\b",
    re.I,
)
HIDDEN = "<address hidden>"


def hide_addresses(text: str) -> str:
    """`text` with every network address in it (URL, host and port, IP address) replaced by
    `HIDDEN`: for what brim tells a client about an upstream."""
    return _ADDRESS.sub(HIDDEN, text)


class UpstreamFailure(BrimError):
    error_type = "upstream_error"

    def __init__(self, message: str, *, upstream: str) -> None:
        super().__init__(hide_addresses(message))
        self.upstream = upstream


class UpstreamUnreachable(UpstreamFailure):
    status = 502
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamFailure):
    status = 504
    code = "upstream_timeout"


class UpstreamProtocolError(UpstreamFailure):
    status = 502
    code = "upstream_protocol_error"


class UpstreamError(UpstreamFailure):
    def __init__(
        self,
        *,
        upstream: str,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        message: str | None = None,
    ) -> None:
        super().__init__(
            message or f"upstream {upstream!r} answered HTTP {status}", upstream=upstream
        )
        self.status = status
        self.headers = headers
        self.body = body

    @classmethod
    def from_reply(
        cls, *, upstream: str, status: int, headers: Mapping[str, str], body: bytes
    ) -> UpstreamError:
        if status in (401, 403):
            return AuthFailed(upstream=upstream, status=status, headers=headers, body=body)
        if status == 429:
            return RateLimited(upstream=upstream, status=status, headers=headers, body=body)
        overflow = classify(status, body)
        if overflow is not None:
            return ContextOverflow(
                upstream=upstream, status=status, headers=headers, body=body, overflow=overflow
            )
        return cls(upstream=upstream, status=status, headers=headers, body=body)


class AuthFailed(UpstreamError):
    pass


class RateLimited(UpstreamError):
    pass


class ContextOverflow(UpstreamError):
    def __init__(
        self,
        *,
        upstream: str,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        overflow: Overflow,
    ) -> None:
        super().__init__(
            upstream=upstream,
            status=status,
            headers=headers,
            body=body,
            message=f"upstream {upstream!r}: context overflow: {overflow.message}",
        )
        self.overflow = overflow


def past_max_duration(upstream: str, max_duration_s: float) -> UpstreamTimeout:
    return UpstreamTimeout(
        f"upstream {upstream!r} was cut off: its reply took longer than max_duration_s "
        f"({max_duration_s:g} s)",
        upstream=upstream,
    )
