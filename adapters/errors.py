"""Every failure brim answers with, as one exception tree.

    BrimError                      status, wire type and code, message: what the client is told
    ├── NoRoute                    404 model_not_found: no `[routes]` entry serves the model
    ├── ContextTooLarge            400 context_length_exceeded: brim could not make it fit
    └── UpstreamFailure            the provider could not give an answer; `upstream` names it
        ├── UpstreamUnreachable    502: connection refused, DNS or TLS failure, reset before
        │                          any answer
        ├── UpstreamTimeout        504: no answer (or no next chunk) within `timeout_s`, no
        │                          connection within `connect_timeout_s`, or the whole request
        │                          (stream included) longer than `max_duration_s`
        ├── UpstreamProtocolError  502: the provider's reply was cut off, or a success whose
        │                          body is not JSON (named by type and size, never echoed)
        └── UpstreamError          the provider answered 4xx/5xx; `status`, `headers` and
            │                      `body` are its own and are relayed to the client unchanged
            ├── AuthFailed         401 / 403
            ├── RateLimited        429
            └── ContextOverflow    the request was too long for the model (any provider's
                                   wording, HTTP 413, or an error as the first event of a
                                   200 stream); `limit` / `requested` when the text states them

Adapters raise only these; `UpstreamError.from_reply` is the single place that turns a
provider's error reply into its class (`adapters.overflow` recognises overflows). The HTTP layer
renders each in the client's wire format, adding any `brim_headers` (e.g. `x-brim-retries`).
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.overflow import Overflow, classify


class BrimError(Exception):
    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.brim_headers: dict[str, str] = {}


class NoRoute(BrimError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ContextTooLarge(BrimError):
    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        anthropic_message: str,
        gemini_message: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.anthropic_message = anthropic_message
        self.gemini_message = gemini_message or message


class UpstreamFailure(BrimError):
    error_type = "upstream_error"

    def __init__(self, message: str, *, upstream: str) -> None:
        super().__init__(message)
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
