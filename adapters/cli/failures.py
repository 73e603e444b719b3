"""What a coding CLI's failure becomes: the documented error, in the Chat Completions error
shape — its own "prompt is too long" a `ContextOverflow` (so that learned limits and the retry
stage work as with any provider), not logged in 401, rate limited 429, else its status or 502.
The CLI's provider's addresses are hidden; its stderr stays in brim's log."""

from __future__ import annotations

import re

from multidict import CIMultiDict

from brim.adapters.cli.command_line import Cli
from brim.adapters.cli.readers import Failed
from brim.adapters.errors import (
    AuthFailed,
    ContextOverflow,
    RateLimited,
    UpstreamError,
    UpstreamFailure,
    hide_addresses,
)
from brim.adapters.overflow import Overflow, classify
from brim.policies.wires.base import ErrorInfo
from brim.policies.wires.chat import CHAT

JSON_HEADERS = CIMultiDict({"Content-Type": "application/json"})
AUTH_WORDING = re.compile(
    r"not logged in|please run /login|/login\b|invalid api key|invalid x-api-key|"
    r"authentication|unauthori[sz]ed|auth method|api key not valid|missing api key|"
    r"no api key|OPENAI_API_KEY|GEMINI_API_KEY|ANTHROPIC_API_KEY|\blogin\b",
    re.I,
)
RATE_WORDING = re.compile(r"rate limit|too many requests|quota|usage limit|\b429\b", re.I)


def reported_failure(upstream: str, cli: Cli, failed: Failed) -> UpstreamFailure:
    """A failure the CLI `cli` of the upstream named `upstream` reported, as the documented
    error (its body in the Chat Completions error shape, the CLI's message in it)."""
    said, status = failed.message.strip() or "no message", failed.status
    overflow = classify(400, said)
    message = hide_addresses(said)  # the CLI's provider's address is not the client's
    if overflow is None and failed.overflow:
        overflow = Overflow(message=message)
    if overflow is not None:
        body = CHAT.error_body(
            ErrorInfo(400, "invalid_request_error", message, "context_length_exceeded")
        )
        return ContextOverflow(
            upstream=upstream, status=400, headers=JSON_HEADERS, body=body, overflow=overflow
        )
    if status in (401, 403) or (status is None and AUTH_WORDING.search(message)):
        text = (
            f"upstream {upstream!r}: the {cli.name} CLI is not logged in or its credentials were "
            f"refused ({cli.login_hint}): {message}"
        )
        body = CHAT.error_body(ErrorInfo(401, "authentication_error", text, "cli_not_logged_in"))
        return AuthFailed(
            upstream=upstream, status=401, headers=JSON_HEADERS, body=body, message=text
        )
    if status == 429 or (status is None and RATE_WORDING.search(message)):
        text = f"upstream {upstream!r}: the {cli.name} CLI was rate limited: {message}"
        body = CHAT.error_body(ErrorInfo(429, "rate_limit_error", text, None))
        return RateLimited(upstream=upstream, status=429, headers=JSON_HEADERS, body=body)
    code = status if isinstance(status, int) and 400 <= status < 600 else 502
    text = f"upstream {upstream!r}: the {cli.name} CLI failed: {message}"
    return _cli_failed(upstream, code, text)


def exit_failure(
    upstream: str, cli: Cli, returncode: int, stderr: str, request_id: str
) -> UpstreamFailure:
    """The CLI ended without an answer or a failure of its own in its output: what its
    `stderr` says decides between "not logged in" and a plain failure (stderr itself stays in
    the log)."""
    if AUTH_WORDING.search(stderr):
        return reported_failure(upstream, cli, Failed(f"exit status {returncode}", 401))
    status = f"status {returncode}" if returncode >= 0 else f"signal {-returncode}"
    text = (
        f"upstream {upstream!r}: the {cli.name} CLI exited with {status} without an answer "
        f"(its stderr is in brim's log, request {request_id})"
    )
    return _cli_failed(upstream, 502, text)


def _cli_failed(upstream: str, code: int, text: str) -> UpstreamError:
    """A CLI failure answered with `code` (a 4xx: the request's fault; else the upstream's)."""
    error_type = "invalid_request_error" if code < 500 else "upstream_error"
    body = CHAT.error_body(ErrorInfo(code, error_type, text, "cli_failed"))
    return UpstreamError(
        upstream=upstream, status=code, headers=JSON_HEADERS, body=body, message=text
    )
