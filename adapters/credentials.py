"""A client's credential goes only to the upstream it addressed.

A request carries its client's own key (`Authorization`, `x-api-key`, `x-goog-api-key`, Gemini's
`?key=`) for the upstream it was routed to (`Exchange.addressed`). Where brim itself calls another
upstream for the request — a summarizer, a fallback model, a token counter — that upstream must
bring a key of its own (`api_key_env`, or a CLI's own login); if it has none the step is not
taken for this request (`withhold`: a warning, and a `Withheld` on the request's report, which
its trace span shows). The adapters enforce the same rule on every request they send: to an
upstream the request did not address, no client credential goes, whatever a stage did.

Per-request credentials travel as arguments (`Caller`), never on the long-lived objects (the
summarizer, the adapters, the caches) that every client shares.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote_plus

from brim.adapters.exchange import ANONYMOUS, Exchange, RequestReport, Withheld
from brim.adapters.forwarded_headers import CREDENTIAL_HEADERS
from brim.adapters.upstream_config import UpstreamConfig

log = logging.getLogger("brim.credentials")

KEY_PARAMETER = "key"  # Gemini's API key in the query string


def _is_key(parameter: str) -> bool:
    return unquote_plus(parameter.partition("=")[0]) == KEY_PARAMETER


def _parameters(query: str, *, keys: bool) -> str:
    """The `key=` parameters of `query` (`keys`), or every other one, as they came. A name may
    come percent-encoded (`%6Bey=`): only a query with neither `key` nor `%` in it is passed
    over unread."""
    if KEY_PARAMETER not in query and "%" not in query:
        return "" if keys else query
    return "&".join(part for part in query.split("&") if part and _is_key(part) == keys)


def without_key(query: str) -> str:
    """A query string without its `key=` parameters; every other one as it came."""
    return _parameters(query, keys=False)


def key_parameters(query: str) -> str:
    """Only the `key=` parameters of a query string (empty if it has none)."""
    return _parameters(query, keys=True)


def brings_own_key(config: UpstreamConfig) -> bool:
    """Whether an upstream needs no client's credential: it has its own (`api_key_env`), or it
    runs a CLI on that CLI's own login."""
    return config.api_key is not None or config.api == "cli"


def may_call(name: str, config: UpstreamConfig, addressed: str | None) -> bool:
    """Whether brim may call upstream `name` for a request that addressed `addressed`: with the
    upstream's own key, or with the client's where it is the upstream the client addressed."""
    return brings_own_key(config) or name == addressed


@dataclass(frozen=True, slots=True)
class Caller:
    """On whose behalf brim calls a model itself (a summary): the client's wire API, the
    upstream its request addressed, its request id, its own credentials — its credential
    headers and `key=` query parameters — which may go to that upstream and no other, and its
    request's report (where a step not taken is recorded)."""

    api: str
    upstream: str | None = None
    request_id: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    query: str = ""
    report: RequestReport | None = field(default=None, compare=False)
    owner: str = ANONYMOUS


def caller_of(exchange: Exchange) -> Caller:
    """The client of `exchange`, as a `Caller`."""
    return Caller(
        api=exchange.api,
        upstream=exchange.addressed,
        request_id=exchange.request_id,
        headers={k: v for k, v in exchange.headers.items() if k.lower() in CREDENTIAL_HEADERS},
        query=key_parameters(exchange.query),
        report=exchange.report,
        owner=exchange.owner,
    )


class CredentialWithheld(Exception):
    """brim would call `upstream` for a client whose credential may not go there, and the
    upstream has no key of its own: the call is not made."""

    def __init__(self, upstream: str, addressed: str | None) -> None:
        super().__init__(
            f"upstream {upstream!r} has no api_key_env of its own, and the client's credential "
            f"goes only to the upstream its request addressed ({addressed!r})"
        )
        self.upstream = upstream
        self.addressed = addressed


def withhold(caller: Caller, step: str, model: str, upstream: str) -> None:
    """Record on the caller's request report (its trace span shows it) and log that `step` with
    `model` on `upstream` was skipped for this request, because that upstream has no key of
    its own and the client's may not go there; once per request, step, model and upstream."""
    entry = Withheld(step, model, upstream)
    report = caller.report
    if report is not None:
        if entry in report.withheld:
            return
        report.withheld += (entry,)
    log.warning(
        "request %s: %s with model %r skipped: upstream %r has no api_key_env of its own, and "
        "the client's credential goes only to the upstream its request addressed (%r); set "
        "api_key_env on [upstreams.%s] to allow it",
        caller.request_id,
        step,
        model,
        upstream,
        caller.upstream,
        upstream,
    )
